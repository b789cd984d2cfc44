//! The subscriber task on a Redis Cluster: sharded pub/sub over a RESP3 cluster
//! connection, resubscribed channel by channel.
//!
//! redis-rs tracks a cluster connection's subscriptions and, after a reconnect, sends a
//! node all of its sharded channels in one `SSUBSCRIBE a b …`, which the server refuses
//! with CROSSSLOT unless they share a slot (ours almost never do: one hash tag per lock).
//! Nothing reports that refusal, so every wake-up would be silently lost after a failover.
//! This task therefore does not rely on it: when a node connection drops (a
//! `Disconnection` push) it forgets every subscription and resubscribes each wanted
//! channel with its own `SSUBSCRIBE`; when a node stops serving a slot (a failover or a
//! slot move), the server itself ends the subscriptions of that slot with an
//! `sunsubscribe` push, and those channels are resubscribed the same way, on the slot's
//! new owner, once the connection's slot map names it (see [`follow_slots`]). Either way
//! the channels' waiters retry once, as after any reconnect.

use std::{
    sync::{Arc, Weak},
    time::Duration,
};

use redis::{PushInfo, PushKind, Value, cluster::ClusterClient, cluster_async::ClusterConnection};
use tokio::time::Instant;

use crate::{
    BoxFuture,
    redis::wakeup::{
        Event, HubState, Pushes, Sink, Subscriber, next_event, pushes, reconcile,
        task::{connected, refused},
        timeout,
    },
};

/// Makes a RESP3 cluster client that sends its pushes to the given sender.
type MakeClient = dyn Fn(Pushes) -> redis::RedisResult<ClusterClient> + Send + Sync;

/// The subscriber of a hub on a cluster, whose connections `make` makes.
pub(super) fn new(
    make: impl Fn(Pushes) -> redis::RedisResult<ClusterClient> + Send + Sync + 'static,
) -> Subscriber {
    let make: Arc<MakeClient> = Arc::new(make);
    Box::new(move |hub| Box::pin(run(hub, make.clone())))
}

async fn run(weak: Weak<HubState>, make: Arc<MakeClient>) {
    let mut backoff = Duration::from_millis(50);
    let mut reconnecting = false;
    loop {
        let Some(shared) = weak.upgrade() else { return };
        let (push, mut rx) = pushes(&weak);
        let connect = async {
            let client = make(push)?;
            client.get_async_connection().await
        };
        let Some(mut conn) = connected(&shared, connect).await else {
            drop(shared);
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
            reconnecting = true;
            continue;
        };
        // The backoff is reset only once a subscription went through (below): a server
        // that accepts connections but refuses the subscriptions (an ACL without channel
        // rights) must not be reconnected to in a loop.
        if reconnecting {
            tracing::info!("lock wake-up subscriber reconnected");
        }
        let mut wake = reconnecting;
        let mut first = true;
        // Channels whose subscriptions the server ended (see `on_push`).
        let mut ended = Vec::new();
        loop {
            if !first {
                match next_event(&shared, &mut rx).await {
                    Event::Push(push) => wake |= on_push(&shared, &push, &mut ended),
                    // The connection is gone for good.
                    Event::Closed => break,
                    Event::Reconcile => {}
                }
            }
            first = false;
            if let Err(error) = follow_slots(&mut conn, &mut ended, shared.connect_timeout).await {
                tracing::debug!(%error, "lock wake-up subscriber could not locate a slot");
                break;
            }
            if let Err(error) = reconcile(&shared, &mut conn, wake).await {
                // Resubscribing failed: start over on a fresh connection after a pause.
                // A refusal (an ACL without channel rights) makes the pause grow; a slot
                // without a primary mid-failover or a timeout does not, so the
                // subscriptions follow the new primary as soon as it serves.
                if !refused(&error, &mut backoff) {
                    tracing::debug!(%error, "lock wake-up subscriber failed");
                }
                break;
            }
            backoff = Duration::from_millis(50);
            wake = false;
        }
        shared.forget_subscriptions(None);
        tracing::warn!("lock wake-up subscriber connection lost; reconnecting");
        reconnecting = true;
        drop(shared);
        tokio::time::sleep(backoff).await;
    }
}

/// Handle one push. Returns whether subscriptions were lost (they are then resubscribed,
/// and their waiters retry).
fn on_push(shared: &Arc<HubState>, push: &PushInfo, ended: &mut Vec<String>) -> bool {
    match push.kind {
        // A node connection dropped: which of our channels it carried is unknown here, so
        // all of them are resubscribed.
        PushKind::Disconnection => {
            shared.forget_subscriptions(None);
            true
        }
        // The server ended a subscription: the node no longer serves the channel's slot.
        PushKind::SUnsubscribe => {
            let Some(Value::BulkString(channel)) = push.data.first() else {
                return false;
            };
            let Ok(channel) = std::str::from_utf8(channel) else {
                return false;
            };
            let lost = shared.forget_subscriptions(Some(channel));
            if lost && !ended.iter().any(|c| c == channel) {
                ended.push(channel.to_owned());
            }
            lost
        }
        _ => false,
    }
}

/// Bring the connection's view of the slots of the `ended` channels up to date before they
/// are resubscribed: their `SSUBSCRIBE`s must reach the slots' primaries.
///
/// The server ends a node's sharded subscriptions when the node stops serving their slot
/// as primary: after a failover, the demoted primary ends them as it becomes a replica.
/// The subscriber connection has sent that node nothing but `SSUBSCRIBE`s, which a replica
/// of the slot accepts without a redirect, so its slot map still names the demoted node,
/// and a channel resubscribed by that map lands on the replica. The new primary forwards
/// its shard's messages to a replica only once it has learnt of it (by gossip, up to half
/// a cluster node timeout later): the grants published meanwhile were lost, and their
/// waiters served by the fallback timer.
///
/// So: a keyed read in the channel's slot (`EXISTS` on its name), which a replica refuses
/// with a MOVED, has redis-rs refresh its slot map before it answers; then `ROLE` on the
/// node the map names confirms it is a primary. The refresh asks some node for the slots,
/// and that node may not have heard of the failover yet either: then the map still names
/// the replica, and both are tried again (no event tells a client that the nodes' views
/// have converged), until `limit`.
async fn follow_slots(
    conn: &mut redis::cluster_async::ClusterConnection,
    ended: &mut Vec<String>,
    limit: Duration,
) -> Result<(), redis::RedisError> {
    use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};

    let give_up = Instant::now() + limit;
    for channel in std::mem::take(ended) {
        loop {
            let mut probe = redis::cmd("EXISTS");
            probe.arg(&channel);
            timeout(limit, probe.query_async::<i64>(conn)).await?;
            let primary = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                Route::with_key(&channel, SlotAddr::Master),
            ));
            let role = timeout(limit, conn.route_command(redis::cmd("ROLE"), primary));
            let role = role.await?;
            if is_primary(&role) {
                break;
            }
            if Instant::now() >= give_up {
                return Err(redis::RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the slot map still names a replica as the slot's primary",
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(())
}

/// Whether a `ROLE` reply is a primary's.
fn is_primary(role: &Value) -> bool {
    match role {
        Value::Array(fields) => match fields.first() {
            Some(Value::BulkString(role)) => role == b"master",
            Some(Value::SimpleString(role)) => role == "master",
            _ => false,
        },
        _ => false,
    }
}

/// Sharded subscriptions, one channel per command: each is routed to its own slot's node,
/// and a multi-slot `SSUBSCRIBE` is refused (`CROSSSLOT`).
impl Sink for ClusterConnection {
    fn subscribe<'a>(
        &'a mut self,
        channels: &'a [String],
        limit: Duration,
    ) -> BoxFuture<'a, Result<(), redis::RedisError>> {
        Box::pin(async move {
            for channel in channels {
                timeout(limit, self.ssubscribe(channel)).await?;
            }
            Ok(())
        })
    }

    fn unsubscribe<'a>(
        &'a mut self,
        channels: &'a [String],
        limit: Duration,
    ) -> BoxFuture<'a, Result<(), redis::RedisError>> {
        Box::pin(async move {
            for channel in channels {
                timeout(limit, self.sunsubscribe(channel)).await?;
            }
            Ok(())
        })
    }
}
