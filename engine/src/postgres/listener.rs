//! The listener: one connection per backend, on the engine's runtime, that `LISTEN`s on this
//! node's own channel while one of its waiters queues, and hands each grant a release
//! notified to the local waiter whose ticket it names.
//!
//! # Only the node waiting is told
//!
//! A node's ticket ids are `<node>:<random>` (`node`: 8 hex digits, random per backend), and
//! a release that hands a key over notifies the channel `<base>_<node>` (see
//! `schema/locks.rs`) with `"<ticket id> <fence> <claim ms> <nonce>"`: the notification goes
//! to the node of the ticket granted and to no other. A node `LISTEN`s on its channel only
//! while one of its waiters has queued (and [`LINGER`] after the last left, so a node under
//! steady contention does not `LISTEN` and `UNLISTEN` every cycle); a node without waiters
//! listens on nothing, and Postgres then leaves its connection out of every `NOTIFY`: up to
//! Postgres 18 a `NOTIFY` wakes every backend that listens on any channel of the database
//! (each wake-up is a transaction that reads the queue), from 19 on only those listening on
//! its channel. So a hand-off costs the server one wake-up per node that has a waiter
//! queued or holds a lease (any key: Postgres 15 to 18; that key's node alone: 19+), never
//! one per node of the fleet.
//!
//! A node also listens while it holds a lease (and [`LINGER`] after), on its channel and
//! the base channel, where an admin's force release notifies `"revoke\n<token>\n<key>"`
//! (see `admin`): the holder reads its lease lost and gives the key back before the admin
//! releases it. That is the price of telling the holder first: a node that holds leases
//! all the time is woken by every `NOTIFY` of the database up to Postgres 18.
//!
//! # No grant missed
//!
//! A waiter is entered in the table before its first attempt goes out, so a grant is never
//! heard before its waiter can take it. A waiter whose attempt went out before the
//! `LISTEN` was confirmed ([`Waiting::heard`]) tries again as soon as it is: a grant
//! notified before is then found by that attempt (a re-entry). The waiter takes a grant
//! only if it names the nonce of its latest registration ([`Waiting::register`]): a grant of
//! an earlier one, delivered late, may have lapsed and gone to another holder since, and no
//! clock can tell (the waiter's next attempt finds a grant it refused that still stands: a
//! re-entry). While the connection is down (a restart, a network cut) notifications are
//! lost: the listener reconnects every [`FALLBACK_CAP`] (and `LISTEN`s again if a waiter
//! queues) and the waiters' fallback timer finds their grants meanwhile.

use std::{sync::Arc, time::Duration};

use sqlx::{
    Executor,
    postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions},
};
use tokio::{sync::watch, time::Instant};

mod waiting;
mod want;

use waiting::Waiters;
pub(super) use waiting::{Handed, Waiting};
use want::Want;
pub(super) use want::lease_hash;

use super::{FALLBACK_CAP, restarts::Restarts};
use crate::{BackendError, BackendErrorKind, LockKey, Resets, Token, runtime};

/// How long a node keeps listening after its last queued waiter left: under steady
/// contention its next waiter queues within a cycle, and a `LISTEN` and an `UNLISTEN` per
/// cycle would cost two transactions each time.
pub(super) const LINGER: Duration = Duration::from_secs(2);

/// Where the listener connects: its own direct connection, or one of the application's pool.
#[derive(Clone, Debug)]
pub(super) enum ListenTarget {
    /// Boxed: ten times the size of a pool handle.
    Direct(Box<PgConnectOptions>),
    Pool(PgPool),
}

/// The backend's listener: the waiters' table, whether the channel is listened on, and the
/// task that does it. Dropping it ends the task and closes its connection.
pub(super) struct Listener {
    node: String,
    channel: String,
    waiters: Arc<Waiters>,
    want: Arc<Want>,
    /// `0`: not listening; else the count of `LISTEN`s confirmed so far, the current one
    /// included.
    listening: watch::Receiver<u64>,
    task: tokio::task::AbortHandle,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Listener {
    /// Connect (once that is confirmed, the node can listen), then serve on the engine's
    /// runtime: `LISTEN` on `<base>_<node>` while a waiter queues. Each connect, and each
    /// end of the connection, is told to `restarts` (a restart is a reset).
    ///
    /// The first connection may take `setup` (a session's start on a loaded server can
    /// outlast a call's `timeout`); reconnects later take `timeout`.
    pub(super) async fn start(
        target: ListenTarget,
        base: &str,
        timeout: Duration,
        setup: Duration,
        restarts: Arc<Restarts>,
    ) -> Result<Self, BackendError> {
        let first = tokio::time::timeout(setup, connect(&target, setup, &restarts))
            .await
            .map_err(|_| {
                BackendError::new(
                    BackendErrorKind::Timeout,
                    format!("postgres listener connection did not answer within {setup:?}"),
                )
            })?
            .map_err(|e| {
                BackendError::new(
                    BackendErrorKind::Unavailable,
                    "postgres listener connection failed",
                )
                .with_source(e)
            })?;
        let node = String::from_utf8_lossy(&crate::key::random_hex()[..8]).into_owned();
        let channel = format!("{base}_{node}");
        let waiters: Arc<Waiters> = Arc::default();
        let want: Arc<Want> = Arc::default();
        let (listening_tx, listening) = watch::channel(0);
        let task = runtime::handle()
            .spawn(serve(
                Task {
                    target,
                    channel: channel.clone(),
                    base: base.to_owned(),
                    timeout,
                    waiters: waiters.clone(),
                    want: want.clone(),
                    listening: listening_tx,
                    listens: 0,
                    resets: restarts.resets(),
                    restarts,
                },
                first,
            ))
            .abort_handle();
        Ok(Self {
            node,
            channel,
            waiters,
            want,
            listening,
            task,
        })
    }

    /// This node holds a lease (granted, or granted again; `lease` is [`lease_hash`]'s):
    /// it listens while it holds one, so that an admin's revocation reaches it (see
    /// `admin`).
    ///
    /// Returns once the node listens (at most [`FALLBACK_CAP`] later): a revocation sent
    /// the moment the lease is granted is heard, not missed while the `LISTEN` is on its
    /// way. A node already listening returns at once.
    pub(super) async fn hold(&self, lease: u64) {
        self.want.hold(lease);
        let _ = tokio::time::timeout(FALLBACK_CAP, until_heard(self.listening.clone())).await;
    }

    /// The lease [`hold`](Self::hold) was given was released (or its release attempted).
    pub(super) fn let_go(&self, lease: u64) {
        self.want.let_go(lease);
    }

    /// The channel this node's grants are notified on.
    pub(super) fn channel(&self) -> &str {
        &self.channel
    }

    /// Enter a new waiter (its ticket id made here, `<node>:<random>`).
    pub(super) fn wait(&self) -> Waiting {
        let id = format!(
            "{}:{}",
            self.node,
            String::from_utf8_lossy(&crate::key::random_hex())
        );
        Waiting::enter(id, &self.waiters, &self.want, &self.listening)
    }
}

/// Once the node listens (`listening` from [`Waiting::until_heard_handle`]); pending for ever
/// once the listener has gone.
pub(super) async fn until_heard(mut listening: watch::Receiver<u64>) {
    if listening.wait_for(|g| *g != 0).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Turns `idle_session_timeout` off for the session, where the server has it (14+).
const NO_IDLE_TIMEOUT: &str = "SELECT set_config('idle_session_timeout', '0', false) \
     WHERE current_setting('server_version_num')::int >= 140000";

async fn connect(
    target: &ListenTarget,
    timeout: Duration,
    restarts: &Restarts,
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
    // The end of the connection is reported at once (a restart is a reset, `restarts`):
    // sqlx would otherwise first try to connect again inside `try_recv`, for up to the
    // pool's acquire timeout, while a restarted server may already grant others. The loop
    // in `serve` reconnects.
    listener.eager_reconnect(false);
    restarts.connected(&mut listener).await?;
    Ok(listener)
}

/// The listening task's state.
struct Task {
    target: ListenTarget,
    channel: String,
    /// The base channel, where an admin's revocations are notified (see `admin`).
    base: String,
    timeout: Duration,
    waiters: Arc<Waiters>,
    want: Arc<Want>,
    listening: watch::Sender<u64>,
    /// `LISTEN`s confirmed so far.
    listens: u64,
    restarts: Arc<Restarts>,
    /// Where an admin's revocations go (the restarts' resets).
    resets: Resets,
}

impl Task {
    /// `LISTEN` (`on`) or `UNLISTEN` within the call timeout; `false` when the connection
    /// failed.
    async fn switch(&mut self, listener: &mut PgListener, on: bool) -> bool {
        let done = if on {
            let channels = [self.channel.as_str(), self.base.as_str()];
            tokio::time::timeout(self.timeout, listener.listen_all(channels)).await
        } else {
            tokio::time::timeout(self.timeout, listener.unlisten_all()).await
        };
        if matches!(done, Ok(Ok(()))) {
            self.listens += u64::from(on);
            self.listening
                .send_replace(if on { self.listens } else { 0 });
            true
        } else {
            tracing::debug!(channel = %self.channel, on, "postgres (UN)LISTEN failed");
            self.listening.send_replace(0);
            // The connection is dropped and made again: its end is a reset, as any other.
            self.restarts.lost();
            false
        }
    }
}

/// The listening task: `LISTEN` while a waiter queues, `UNLISTEN` [`LINGER`] after the last
/// left, hand each grant to its waiter; after a failure, a fresh connection every
/// [`FALLBACK_CAP`] until one answers again.
async fn serve(mut task: Task, first: PgListener) {
    let mut listener = Some(first);
    let mut on = false;
    // Since when nobody queues while the node listens.
    let mut idle_since: Option<Instant> = None;
    loop {
        let Some(current) = listener.as_mut() else {
            tokio::time::sleep(FALLBACK_CAP).await;
            match tokio::time::timeout(
                task.timeout,
                connect(&task.target, task.timeout, &task.restarts),
            )
            .await
            {
                Ok(Ok(fresh)) => {
                    tracing::debug!(channel = %task.channel, "postgres listener connected again");
                    listener = Some(fresh);
                }
                Ok(Err(error)) => {
                    tracing::debug!(channel = %task.channel, %error, "postgres listener down");
                }
                Err(_) => {
                    tracing::debug!(channel = %task.channel, "postgres listener connect timed out");
                }
            }
            continue;
        };
        let queued = task.want.listen();
        if queued {
            idle_since = None;
        } else if on {
            let since = *idle_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= LINGER {
                idle_since = None;
                on = false;
                if !task.switch(current, false).await {
                    listener = None;
                }
                continue;
            }
        }
        if queued && !on {
            on = task.switch(current, true).await;
            if !on {
                listener = None;
            }
            continue;
        }
        let linger_ends = idle_since.map(|since| since + LINGER);
        tokio::select! {
            received = current.try_recv() => match received {
                Ok(Some(notification)) => match notification.payload().strip_prefix("revoke\n") {
                    Some(revoked) => revoke(&task.resets, revoked),
                    None => deliver(&task.waiters, notification.payload()),
                },
                // The connection was lost: anything notified meanwhile is lost too.
                Ok(None) | Err(_) => {
                    tracing::debug!(channel = %task.channel, "postgres listener lost its connection");
                    task.restarts.lost();
                    task.listening.send_replace(0);
                    on = false;
                    listener = None;
                }
            },
            () = task.want.wake.notified() => {}
            () = async {
                match linger_ends {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => {}
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
