//! The node watches of one Cluster watch, as each other's witnesses: when a replica's
//! connection drops, its watch asks the other nodes whether it is a replica still.
//!
//! A replica grants nothing, so its crash or restart is no reset; but the role the watch
//! knows is the latest poll's (up to a second old), and a replica promoted since then
//! holds the grants of its slots. So a drop is taken for a replica's only when some other
//! node's `CLUSTER SLOTS`, asked right after the drop, names it a replica and none names
//! it a primary; with no such answer (no other node reachable, or none naming it) it is a
//! reset, as any drop of a node whose role is unknown.

use std::{
    sync::{Arc, Mutex, Weak},
    time::Duration,
};

use futures_util::{StreamExt, stream::FuturesUnordered};
use redis::{Value, aio::MultiplexedConnection};

use super::topology::{Addr, Role, parse};

/// A node watch's connection while it is up.
pub(super) type Slot = Arc<SlotInner>;

type SlotInner = Mutex<Option<MultiplexedConnection>>;

/// Every node watch's connection, by node (weakly: a watch that ends leaves no connection
/// open here).
#[derive(Clone, Default)]
pub(super) struct Peers(Arc<Mutex<Vec<Peer>>>);

/// A node, and its watch's connection slot.
type Peer = (Addr, Weak<SlotInner>);

impl Peers {
    /// Make `conn`, `addr`'s, one the others may ask.
    pub(super) fn join(&self, addr: Addr, conn: &Slot) {
        let mut peers = self.0.lock().unwrap();
        peers.retain(|(_, c)| c.strong_count() > 0);
        peers.push((addr, Arc::downgrade(conn)));
    }

    /// Whether, right now, another node's topology names `addr` a replica and none names
    /// it a primary. Each node is asked at most `timeout`.
    pub(super) async fn still_replica(&self, addr: &Addr, timeout: Duration) -> bool {
        let others: Vec<(Addr, MultiplexedConnection)> = self
            .0
            .lock()
            .unwrap()
            .iter()
            .filter(|(a, _)| a != addr)
            .filter_map(|(a, c)| Some((a.clone(), c.upgrade()?.lock().unwrap().clone()?)))
            .collect();
        let mut asked: FuturesUnordered<_> = others
            .into_iter()
            .map(|(by, mut conn)| async move {
                let mut slots = redis::cmd("CLUSTER");
                slots.arg("SLOTS");
                match tokio::time::timeout(timeout, slots.query_async::<Value>(&mut conn)).await {
                    Ok(Ok(slots)) => parse(&slots, &by.0)
                        .0
                        .into_iter()
                        .find_map(|(named, role)| (named == *addr).then_some(role)),
                    _ => None,
                }
            })
            .collect();
        let mut replica = false;
        while let Some(role) = asked.next().await {
            match role {
                // Promoted: its grants may be gone with it.
                Some(Role::Primary) => return false,
                Some(Role::Replica) => replica = true,
                None => {}
            }
        }
        replica
    }
}
