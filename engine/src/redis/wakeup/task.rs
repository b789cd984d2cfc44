//! The subscriber task: the one reconnect loop of every hub, on one server or on a Redis
//! Cluster. Connect, reconcile, then reconcile again at every event; when the connection
//! is lost or a subscription fails, forget every subscription and reconnect, with a
//! backoff that grows while connects fail or the server refuses the subscriptions. What
//! differs between one server and a cluster (how to connect, what a push means, what to
//! do before reconciling) is the connection's [`Link`].

use std::{
    sync::{Arc, Weak},
    time::Duration,
};

use redis::{PushInfo, RedisError};

use super::{Event, HubState, Pushes, Sink, Subscriber, next_event, pushes, reconcile};
use crate::BoxFuture;

/// The pause after a failure that may well not happen again (a timeout, a slot without a
/// primary in a failover): the subscriptions follow the server as soon as it serves.
const SHORTEST: Duration = Duration::from_millis(50);
/// The longest pause between attempts.
const LONGEST: Duration = Duration::from_secs(1);

/// A subscriber connection as the reconnect loop sees it: where subscriptions go
/// ([`Sink`]), what a push other than a message means, and what must happen before each
/// reconciliation.
pub(crate) trait Link: Sink + Sized + 'static {
    /// What `push` (a push other than a published message: those are dispatched where
    /// the connection reads them, by [`Pushes`]) means for this connection.
    fn on_push(&mut self, shared: &HubState, push: &PushInfo) -> Step;

    /// Run before every reconciliation, each command within `limit`; a failure ends the
    /// connection, as a failed subscription does.
    fn prepare(&mut self, _limit: Duration) -> BoxFuture<'_, Result<(), RedisError>> {
        Box::pin(std::future::ready(Ok(())))
    }
}

/// What a push means for the connection it came on (see [`Link::on_push`]).
pub(crate) enum Step {
    /// Nothing to do (a subscription confirmation).
    Ignore,
    /// Reconcile; with `wake`, subscriptions were lost (and forgotten), so the waiters of
    /// the channels resubscribed retry once (grants published meanwhile were lost).
    /// Only a cluster's connection outlives the loss of some of its subscriptions.
    #[cfg_attr(not(feature = "redis-cluster"), allow(dead_code))]
    Reconcile { wake: bool },
    /// The connection is gone: reconnect.
    Lost,
}

/// Makes a hub's subscriber connection, sending its pushes to the given sender, within the
/// given connect timeout.
type Connect<L> =
    dyn Fn(Pushes, Duration) -> BoxFuture<'static, Result<L, RedisError>> + Send + Sync;

/// The subscriber of a hub whose connections `connect` makes.
pub(crate) fn subscriber<L: Link>(
    connect: impl Fn(Pushes, Duration) -> BoxFuture<'static, Result<L, RedisError>>
    + Send
    + Sync
    + 'static,
) -> Subscriber {
    let connect: Arc<Connect<L>> = Arc::new(connect);
    Box::new(move |hub| Box::pin(run(hub, connect.clone())))
}

/// The subscriber task: connect, reconcile; reconnect with backoff on failure. The
/// connection speaks RESP3, so messages arrive as pushes (see [`Pushes`]).
async fn run<L: Link>(weak: Weak<HubState>, connect: Arc<Connect<L>>) {
    let mut backoff = SHORTEST;
    let mut reconnecting = false;
    loop {
        let Some(shared) = weak.upgrade() else { return };
        let (push, mut rx) = pushes(&weak);
        let Some(mut link) = connected(&shared, connect(push, shared.connect_timeout)).await else {
            drop(shared);
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(LONGEST);
            reconnecting = true;
            continue;
        };
        // The backoff is reset only once a subscription went through (in `session`): a
        // server that accepts connections but refuses the subscriptions (an ACL without
        // channel rights) must not be reconnected to in a loop.
        if reconnecting {
            tracing::info!("lock wake-up subscriber reconnected");
        }
        let failed = session(&shared, &mut link, &mut rx, reconnecting, &mut backoff).await;
        shared.forget_subscriptions(None);
        tracing::warn!("lock wake-up subscriber connection lost; reconnecting");
        // The command connections are left alone: they have their own failures to retire
        // them (and a subscriber refused its channels says nothing about them).
        reconnecting = true;
        drop(shared);
        // A failure of ours (a refused or timed-out subscription): the server may well
        // accept the next connection and fail the same way, so the pause is taken before
        // it, not only after a failed connect. A connection that dropped after working is
        // replaced at once.
        if failed {
            tokio::time::sleep(backoff).await;
        }
    }
}

/// One connection's life: reconcile at once (waking every waiter after a reconnect), then
/// at every event, until the connection is lost (`false`) or a failure of ours ends it
/// (`true`).
async fn session<L: Link>(
    shared: &HubState,
    link: &mut L,
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<PushInfo>,
    mut wake: bool,
    backoff: &mut Duration,
) -> bool {
    let mut first = true;
    loop {
        if !first {
            match next_event(shared, rx).await {
                Event::Reconcile => {}
                Event::Push(push) => match link.on_push(shared, &push) {
                    Step::Ignore => continue,
                    Step::Reconcile { wake: lost } => wake |= lost,
                    Step::Lost => return false,
                },
                // The connection's push sender is gone: so is the connection.
                Event::Closed => return false,
            }
        }
        first = false;
        if link.prepare(shared.connect_timeout).await.is_err() {
            return true;
        }
        if let Err(error) = reconcile(shared, link, wake).await {
            if !refused(&error, backoff) {
                tracing::debug!(%error, "lock wake-up subscriber failed");
            }
            return true;
        }
        // A subscription went through: the next failure starts backing off afresh.
        *backoff = SHORTEST;
        wake = false;
    }
}

/// Whether a subscription failed because the server refused it (`NOPERM`: an ACL user
/// without rights on the engine's channels). It will refuse the next attempt too, so the
/// pause before it grows (logged at `warn`); any other failure (a timeout, a slot without
/// a primary in a failover) is retried after the shortest pause, which `backoff` is reset
/// to.
fn refused(error: &RedisError, backoff: &mut Duration) -> bool {
    let refused = error.code() == Some("NOPERM");
    if refused {
        tracing::warn!(%error, "lock wake-up subscription refused; retrying with a backoff");
        *backoff = (*backoff * 2).min(LONGEST);
    } else {
        *backoff = SHORTEST;
    }
    refused
}

/// The subscriber connection `connect` makes, within the connect timeout; `None` (logged)
/// when it fails, and the caller backs off.
async fn connected<T>(
    shared: &HubState,
    connect: impl Future<Output = Result<T, RedisError>>,
) -> Option<T> {
    match tokio::time::timeout(shared.connect_timeout, connect).await {
        Ok(Ok(conn)) => Some(conn),
        Ok(Err(error)) => {
            tracing::debug!(%error, "lock wake-up subscriber could not connect");
            None
        }
        Err(_) => {
            tracing::debug!("lock wake-up subscriber connect timed out");
            None
        }
    }
}
