//! The listener: one `LISTEN` connection per backend, on the engine's runtime, handing each
//! grant a release notified to the local waiter whose ticket it names.
//!
//! A release that hands a key over sends `NOTIFY` with `"<ticket id> <fence> <claim ms>
//! <nonce>"` (see `schema/locks.rs`). Every node listening on the channel hears it; only the
//! node where that ticket's waiter lives finds it in its table, so one release wakes one
//! waiter (no herd). The waiter takes it only if it names the nonce of its latest
//! registration ([`Waiting::register`]): a grant of an earlier one, delivered late, may
//! have lapsed and gone to another holder since, and no clock can tell (the waiter's next
//! attempt finds a grant it refused that still stands: a re-entry).
//! A waiter is entered before its first attempt goes out, so a grant is never heard before
//! its waiter can take it. While the connection is down (a restart, a network cut)
//! notifications are lost: the listener reconnects every [`FALLBACK_CAP`] and the waiters'
//! fallback timer finds their grants meanwhile.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use sqlx::{
    Executor,
    postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions},
};
use tokio::sync::oneshot;

use super::FALLBACK_CAP;
use crate::{BackendError, BackendErrorKind, LockKey, Resets, Token, runtime};

/// A hand-off as its notification tells it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Handed {
    pub(super) fence: u64,
    /// The lease's expiry the release set, from then: the waiter's claim period, or its TTL
    /// when shorter.
    pub(super) claim: Duration,
}

/// Where the listener connects: its own direct connection, or one of the application's pool.
#[derive(Clone, Debug)]
pub(super) enum ListenTarget {
    /// Boxed: ten times the size of a pool handle.
    Direct(Box<PgConnectOptions>),
    Pool(PgPool),
}

/// The backend's listener: the waiters' table and the task that fills it. Dropping it ends
/// the task and closes its connection.
pub(super) struct Listener {
    waiters: Arc<Waiters>,
    task: tokio::task::AbortHandle,
}

/// Each local waiter's ticket id: the nonce of its latest registration, and where its
/// grant goes.
type Waiters = Mutex<HashMap<String, (String, oneshot::Sender<Handed>)>>;

/// A local waiter's entry: the grant of its ticket, when a release notifies one. Leaves the
/// table when dropped.
pub(super) struct Waiting {
    id: String,
    waiters: Arc<Waiters>,
    grant: Option<oneshot::Receiver<Handed>>,
}

impl Waiting {
    /// The waiter's next attempt registers (or refreshes) its ticket with `nonce`: from now
    /// on only a grant naming it is taken.
    pub(super) fn register(&self, nonce: &str) {
        if let Some((current, _)) = self
            .waiters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get_mut(&self.id)
        {
            nonce.clone_into(current);
        }
    }

    /// The grant of this waiter's ticket; pending for ever once the listener has gone (the
    /// fallback timer then decides).
    pub(super) async fn granted(&mut self) -> Handed {
        if let Some(grant) = self.grant.as_mut()
            && let Ok(handed) = grant.await
        {
            return handed;
        }
        self.grant = None;
        std::future::pending().await
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.waiters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&self.id);
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Listener {
    /// Connect and `LISTEN` on `channel` (once that is confirmed, a notification is heard),
    /// then keep listening on the engine's runtime.
    pub(super) async fn start(
        target: ListenTarget,
        channel: String,
        timeout: Duration,
        resets: Resets,
    ) -> Result<Self, BackendError> {
        let first = tokio::time::timeout(timeout, connect(&target, &channel, timeout))
            .await
            .map_err(|_| {
                BackendError::new(
                    BackendErrorKind::Timeout,
                    format!("postgres LISTEN did not answer within {timeout:?}"),
                )
            })?
            .map_err(|e| {
                BackendError::new(BackendErrorKind::Unavailable, "postgres LISTEN failed")
                    .with_source(e)
            })?;
        let waiters: Arc<Waiters> = Arc::default();
        let task = runtime::handle()
            .spawn(listen(
                first,
                target,
                channel,
                timeout,
                waiters.clone(),
                resets,
            ))
            .abort_handle();
        Ok(Self { waiters, task })
    }

    /// Enter the waiter of ticket `id`.
    pub(super) fn wait_for(&self, id: &str) -> Waiting {
        let (tx, rx) = oneshot::channel();
        self.waiters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(id.to_owned(), (String::new(), tx));
        Waiting {
            id: id.to_owned(),
            waiters: self.waiters.clone(),
            grant: Some(rx),
        }
    }
}

/// Turns `idle_session_timeout` off for the session, where the server has it (14+).
const NO_IDLE_TIMEOUT: &str = "SELECT set_config('idle_session_timeout', '0', false) \
     WHERE current_setting('server_version_num')::int >= 140000";

async fn connect(
    target: &ListenTarget,
    channel: &str,
    timeout: Duration,
) -> Result<PgListener, sqlx::Error> {
    let mut listener = match target {
        ListenTarget::Direct(options) => {
            // A pool of one, only for the listener's reconnects.
            let pool = PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(timeout)
                .connect_lazy_with((**options).clone());
            PgListener::connect_with(&pool).await?
        }
        ListenTarget::Pool(pool) => PgListener::connect_with(pool).await?,
    };
    // A `LISTEN` session is idle between notifications: a database or role
    // `idle_session_timeout` (Postgres 14+) would end it every few seconds, and each
    // reconnect loses what was notified meanwhile. Off for this session only.
    listener.execute(sqlx::raw_sql(NO_IDLE_TIMEOUT)).await?;
    listener.listen(channel).await?;
    Ok(listener)
}

/// The listening task: hand each grant to its waiter; after a failure, a fresh connection
/// every [`FALLBACK_CAP`] until one listens again.
async fn listen(
    first: PgListener,
    target: ListenTarget,
    channel: String,
    timeout: Duration,
    waiters: Arc<Waiters>,
    resets: Resets,
) {
    let mut listener = Some(first);
    loop {
        let Some(current) = listener.as_mut() else {
            tokio::time::sleep(FALLBACK_CAP).await;
            match tokio::time::timeout(timeout, connect(&target, &channel, timeout)).await {
                Ok(Ok(fresh)) => {
                    tracing::debug!(%channel, "postgres listener connected again");
                    listener = Some(fresh);
                }
                Ok(Err(error)) => tracing::debug!(%channel, %error, "postgres listener down"),
                Err(_) => tracing::debug!(%channel, "postgres listener connect timed out"),
            }
            continue;
        };
        match current.try_recv().await {
            Ok(Some(notification)) => match notification.payload().strip_prefix("revoke\n") {
                Some(revoked) => revoke(&resets, revoked),
                None => deliver(&waiters, notification.payload()),
            },
            // The connection was lost: anything notified meanwhile is lost too.
            Ok(None) | Err(_) => {
                tracing::debug!(%channel, "postgres listener lost its connection");
                listener = None;
            }
        }
    }
}

/// An admin's force release, `"revoke\n<token>\n<key>"` (see `admin`): the lease, if this
/// engine holds it, reads lost at once and is given back.
fn revoke(resets: &Resets, revoked: &str) {
    if let Some((token, key)) = revoked.split_once('\n')
        && let (Ok(token), Ok(key)) = (Token::new(token), LockKey::new(key))
    {
        resets.revoke(&key, &token);
    }
}

/// Hand `"<ticket id> <fence> <claim ms> <nonce>"` to its waiter, if it is here and the
/// nonce is its latest registration's.
fn deliver(waiters: &Waiters, payload: &str) {
    let mut parts = payload.split(' ');
    let (Some(id), Some(fence), Some(claim)) = (parts.next(), parts.next(), parts.next()) else {
        tracing::debug!(payload, "malformed postgres hand-off notification");
        return;
    };
    let nonce = parts.next().unwrap_or_default();
    let (Ok(fence), Ok(claim)) = (fence.parse::<u64>(), claim.parse::<u64>()) else {
        tracing::debug!(payload, "malformed postgres hand-off notification");
        return;
    };
    let mut waiters = waiters
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match waiters.get(id) {
        Some((current, _)) if current == nonce => {}
        Some(_) => {
            tracing::debug!(payload, "a grant of an earlier registration; refused");
            return;
        }
        None => return,
    }
    if let Some((_, waiter)) = waiters.remove(id) {
        let _ = waiter.send(Handed {
            fence,
            claim: Duration::from_millis(claim),
        });
    }
}
