//! The subscriber task on one server: connect (through the command pool's connector, so a
//! Sentinel failover is followed), reconcile, and reconnect with a backoff on failure; and
//! what the cluster's task shares with it.

use std::{
    sync::{Arc, Weak},
    time::Duration,
};

use redis::aio::MultiplexedConnection;

use super::{Event, HubState, Pushes, Sink, Subscriber, next_event, pushes, reconcile, timeout};
use crate::{BoxFuture, redis::connector::Connector};

/// The subscriber of a hub on one server: a RESP3 connection (`SUBSCRIBE`, messages as
/// pushes), made through the command pool's `connector` (for Sentinel: to the primary it
/// names now).
pub(crate) fn single(connector: Arc<Connector>) -> Subscriber {
    Box::new(move |hub| Box::pin(run(hub, connector.clone())))
}

/// Whether a subscription failed because the server refused it (`NOPERM`: an ACL user
/// without rights on the engine's channels). It will refuse the next attempt too, so the
/// pause before it grows (logged at `warn`); any other failure (a timeout, a slot without
/// a primary in a failover) is retried after the shortest pause, which `backoff` is reset
/// to.
pub(crate) fn refused(error: &redis::RedisError, backoff: &mut Duration) -> bool {
    let refused = error.code() == Some("NOPERM");
    if refused {
        tracing::warn!(%error, "lock wake-up subscription refused; retrying with a backoff");
        *backoff = (*backoff * 2).min(Duration::from_secs(1));
    } else {
        *backoff = Duration::from_millis(50);
    }
    refused
}

/// The subscriber task on one server: connect, reconcile; reconnect with backoff on
/// failure. The connection speaks RESP3, so messages arrive as pushes (see [`Pushes`]).
async fn run(weak: Weak<HubState>, connector: Arc<Connector>) {
    let mut backoff = Duration::from_millis(50);
    let mut reconnecting = false;
    loop {
        let Some(shared) = weak.upgrade() else { return };
        let (push, mut rx) = pushes(&weak);
        let connect = connect_single(&connector, push, shared.connect_timeout);
        let Some(mut conn) = connected(&shared, connect).await else {
            drop(shared);
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
            reconnecting = true;
            continue;
        };
        if reconnecting {
            tracing::info!("lock wake-up subscriber reconnected");
        }
        // Whether the session ended in an error of ours (a refused or timed-out
        // subscription) rather than a connection that dropped after working.
        let mut failed = false;
        let mut first = true;
        loop {
            if !first {
                match next_event(&shared, &mut rx).await {
                    Event::Reconcile => {}
                    // The connection dropped (the only push that comes here but
                    // subscription confirmations, which need nothing).
                    Event::Push(push) if push.kind == redis::PushKind::Disconnection => break,
                    Event::Push(_) => continue,
                    Event::Closed => break,
                }
            }
            let resubscribed = first && reconnecting;
            first = false;
            if let Err(error) = reconcile(&shared, &mut conn, resubscribed).await {
                // A `NOPERM` (an ACL user without channel rights), a timeout: the server
                // may well accept the next connection and refuse again, so the pause
                // below is taken before it (not only after a failed connect); it grows
                // after a refusal.
                if !refused(&error, &mut backoff) {
                    tracing::debug!(%error, "lock wake-up subscriber failed");
                }
                failed = true;
                break;
            }
            // A subscription went through: the next failure starts backing off afresh.
            backoff = Duration::from_millis(50);
        }
        shared.forget_subscriptions(None);
        tracing::warn!("lock wake-up subscriber connection lost; reconnecting");
        // The command connections are left alone: they have their own failures to retire
        // them (and a subscriber refused its channels says nothing about them).
        reconnecting = true;
        drop(shared);
        if failed {
            tokio::time::sleep(backoff).await;
        }
    }
}

/// The subscriber connection `connect` makes, within the connect timeout; `None` (logged)
/// when it fails, and the caller backs off.
pub(crate) async fn connected<T>(
    shared: &HubState,
    connect: impl Future<Output = Result<T, redis::RedisError>>,
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

/// A RESP3 connection to the server the connector names now (for Sentinel: the current
/// primary), sending its pushes to `push`.
async fn connect_single(
    connector: &Connector,
    push: Pushes,
    timeout: Duration,
) -> Result<redis::aio::MultiplexedConnection, redis::RedisError> {
    let client = connector.client().await?;
    let info = client.get_connection_info().clone();
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(redis::ProtocolVersion::RESP3);
    let client = redis::Client::open(info.set_redis_settings(settings))?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
        .set_push_sender(push);
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

impl Sink for MultiplexedConnection {
    fn subscribe<'a>(
        &'a mut self,
        channels: &'a [String],
        limit: Duration,
    ) -> BoxFuture<'a, Result<(), redis::RedisError>> {
        Box::pin(timeout(limit, Self::subscribe(self, channels)))
    }

    fn unsubscribe<'a>(
        &'a mut self,
        channels: &'a [String],
        limit: Duration,
    ) -> BoxFuture<'a, Result<(), redis::RedisError>> {
        Box::pin(timeout(limit, Self::unsubscribe(self, channels)))
    }
}
