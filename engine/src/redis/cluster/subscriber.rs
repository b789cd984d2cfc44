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

use std::time::Duration;

use redis::{
    PushInfo, PushKind, RedisError, Value, cluster::ClusterClient, cluster_async::ClusterConnection,
};
use tokio::time::Instant;

use crate::{
    BoxFuture,
    redis::wakeup::{
        HubState, Pushes, Sink, Subscriber,
        task::{Link, Step, subscriber},
        timeout,
    },
};

/// The subscriber of a hub on a cluster, whose connections `make` makes.
pub(super) fn new(
    make: impl Fn(Pushes) -> redis::RedisResult<ClusterClient> + Send + Sync + 'static,
) -> Subscriber {
    subscriber(move |push, _limit| {
        let client = make(push);
        Box::pin(async move {
            let conn = client?.get_async_connection().await?;
            Ok(Sharded {
                conn,
                ended: Vec::new(),
            })
        })
    })
}

/// A cluster subscriber connection, and the channels whose subscriptions the server ended
/// (see [`on_push`]), to be resubscribed on their slots' new primaries.
struct Sharded {
    conn: ClusterConnection,
    ended: Vec<String>,
}

/// A node connection that drops is reconnected by redis-rs itself: its subscriptions are
/// forgotten and resubscribed here, channel by channel, on the same cluster connection.
impl Link for Sharded {
    fn on_push(&mut self, shared: &HubState, push: &PushInfo) -> Step {
        let wake = on_push(shared, push, &mut self.ended);
        Step::Reconcile { wake }
    }

    fn prepare(&mut self, limit: Duration) -> BoxFuture<'_, Result<(), RedisError>> {
        Box::pin(async move {
            let followed = follow_slots(&mut self.conn, &mut self.ended, limit).await;
            if let Err(error) = &followed {
                tracing::debug!(%error, "lock wake-up subscriber could not locate a slot");
            }
            followed
        })
    }
}

/// Handle one push. Returns whether subscriptions were lost (they are then resubscribed,
/// and their waiters retry).
fn on_push(shared: &HubState, push: &PushInfo, ended: &mut Vec<String>) -> bool {
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
    conn: &mut ClusterConnection,
    ended: &mut Vec<String>,
    limit: Duration,
) -> Result<(), RedisError> {
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
                return Err(RedisError::from(std::io::Error::new(
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
impl Sink for Sharded {
    fn subscribe<'a>(
        &'a mut self,
        channels: &'a [String],
        limit: Duration,
    ) -> BoxFuture<'a, Result<(), RedisError>> {
        Box::pin(async move {
            for channel in channels {
                timeout(limit, self.conn.ssubscribe(channel)).await?;
            }
            Ok(())
        })
    }

    fn unsubscribe<'a>(
        &'a mut self,
        channels: &'a [String],
        limit: Duration,
    ) -> BoxFuture<'a, Result<(), RedisError>> {
        Box::pin(async move {
            for channel in channels {
                timeout(limit, self.conn.sunsubscribe(channel)).await?;
            }
            Ok(())
        })
    }
}
