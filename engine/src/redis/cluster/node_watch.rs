//! The watch on one Redis Cluster node: a RESP3 connection of its own whose end is a reset,
//! unless the node is a replica.
//!
//! The moment it drops (the node killed or restarted, a failover's promoted replica taking
//! a slot, a reset network path), every grant made before may be gone: a reset, reported
//! from the connection's own driver task where it reads the end of the stream, so before a
//! restarted node can answer anyone (a killed process's sockets are closed by its kernel).
//! A node the latest topology names a replica grants nothing: its drop is weighed by the
//! watch's task instead, which asks the other nodes whether it is a replica still (`peers`),
//! and is no reset if so. Another close for a lesser reason (`CLIENT KILL`) of a primary's
//! connection is a reset too: early, and safe. The
//! connection is then made again, with a backoff while the node is down. A `PING` every
//! [`KEEPALIVE`] keeps it from looking idle: a node closes a connection idle longer than
//! its `timeout` (300 s is common), and every close is taken for a reset.

use std::{
    sync::{
        Arc, Mutex, Weak,
        atomic::{AtomicBool, AtomicU8, Ordering},
    },
    time::Duration,
};

use redis::{ConnectionInfo, PushInfo, PushKind, RedisError, aio::MultiplexedConnection};
use tokio::{sync::Notify, task::JoinHandle};

use super::{
    peers::{Peers, Slot},
    topology::{Addr, Role},
};
use crate::{Resets, runtime};

/// How often the watch pings its node: well inside the shortest idle `timeout` a server
/// can have (1 s; it counts in whole seconds).
pub(super) const KEEPALIVE: Duration = Duration::from_millis(400);

/// The name the watch's connections carry (`CLIENT LIST`), so an operator can tell them.
const NAME: &str = "tower-lock-watch";

/// One node's watch task; dropping it ends the task and says nothing (the node left the
/// topology, or the backend was dropped).
pub(super) struct NodeWatch {
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

/// What the watch's task shares with the topology task.
struct Shared {
    /// Its connection while it is up: the topology is read on it too.
    conn: Slot,
    /// The node's role in the latest topology the watch knows ([`UNKNOWN`], [`PRIMARY`],
    /// [`REPLICA`]): a replica's drop is no reset (see `peers`).
    role: AtomicU8,
    /// Set when the watch is ended on purpose: its connection's end is no reset.
    retired: AtomicBool,
    /// Set, and signalled, after the first connect attempt.
    tried: Notify,
    has_tried: AtomicBool,
}

const UNKNOWN: u8 = 0;
const PRIMARY: u8 = 1;
const REPLICA: u8 = 2;

impl NodeWatch {
    /// Watch the node `info` names (`addr`), reporting on `resets`; each connect is
    /// bounded by `timeout`. `peers` are the other nodes' watches, asked when this node's
    /// connection drops while it is known as a replica.
    pub(super) fn start(
        addr: Addr,
        info: ConnectionInfo,
        timeout: Duration,
        resets: Resets,
        revoke: Arc<str>,
        peers: Peers,
    ) -> Self {
        let shared = Arc::new(Shared {
            conn: Arc::new(Mutex::new(None)),
            role: AtomicU8::new(UNKNOWN),
            retired: AtomicBool::new(false),
            tried: Notify::new(),
            has_tried: AtomicBool::new(false),
        });
        peers.join(addr.clone(), &shared.conn);
        let watch = Watched {
            addr,
            info,
            timeout,
            resets,
            revoke,
            peers,
        };
        let task = runtime::handle().spawn(run(shared.clone(), watch));
        Self { shared, task }
    }

    /// Its node's role in the latest topology the watch knows (`None`: not named).
    pub(super) fn set_role(&self, role: Option<Role>) {
        let role = match role {
            None => UNKNOWN,
            Some(Role::Primary) => PRIMARY,
            Some(Role::Replica) => REPLICA,
        };
        self.shared.role.store(role, Ordering::Release);
    }

    /// Wait for the first connect attempt (made or failed), at most `limit`.
    pub(super) async fn tried(&self, limit: Duration) {
        let tried = self.shared.tried.notified();
        tokio::pin!(tried);
        tried.as_mut().enable();
        if self.shared.has_tried.load(Ordering::Acquire) {
            return;
        }
        let _ = tokio::time::timeout(limit, tried).await;
    }

    /// Its connection, while it is up.
    pub(super) fn connection(&self) -> Option<MultiplexedConnection> {
        self.shared.conn.lock().unwrap().clone()
    }
}

impl Drop for NodeWatch {
    fn drop(&mut self) {
        self.shared.retired.store(true, Ordering::Release);
        self.task.abort();
        // The connection's driver ends once the last clone of it is dropped; this one
        // goes now, whatever else still holds `shared` for a moment.
        self.shared.conn.lock().unwrap().take();
    }
}

/// What the watch's task is given.
struct Watched {
    addr: Addr,
    info: ConnectionInfo,
    timeout: Duration,
    resets: Resets,
    /// The prefix's revocation channel, which the watch subscribes to.
    revoke: Arc<str>,
    peers: Peers,
}

async fn run(shared: Arc<Shared>, watched: Watched) {
    let Watched {
        addr,
        info,
        timeout,
        resets,
        revoke,
        peers,
    } = watched;
    let node = format!("{:?}", info.addr());
    let mut backoff = Duration::from_millis(50);
    loop {
        // Set once this connection's end is reported.
        let reported = Arc::new(AtomicBool::new(false));
        let (dropped_tx, mut dropped) = tokio::sync::mpsc::unbounded_channel::<()>();
        // The closure lives in the connection's driver, which lives as long as a clone of
        // the connection does, and `shared` holds one: a strong reference here would keep
        // both alive for good once the watch is dropped.
        let on_push = {
            let (shared, resets, reported, node, revoke) = (
                Arc::downgrade(&shared),
                resets.clone(),
                reported.clone(),
                node.clone(),
                revoke.clone(),
            );
            move |push: PushInfo| {
                // An admin's force release (a plain `PUBLISH`: every node carries it, so
                // each watch reads it; a revocation is idempotent).
                if crate::redis::revocation::on_push(&resets, &revoke, &push) {
                    return Ok(());
                }
                if push.kind == PushKind::Disconnection && !is_retired(&shared) {
                    // Here, in the connection's driver: no task hop before the engine knows.
                    // A replica's is weighed by the task, below.
                    if !is_replica(&shared) && !reported.swap(true, Ordering::AcqRel) {
                        resets.reset(&format!(
                            "the connection to redis cluster node {node} was reset"
                        ));
                    }
                    let _ = dropped_tx.send(());
                }
                Ok::<(), std::convert::Infallible>(())
            }
        };
        let connected = tokio::time::timeout(timeout, connect(&info, on_push, &revoke))
            .await
            .unwrap_or_else(|_| {
                Err(RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "cluster watch connect timed out",
                )))
            });
        let mut conn = match connected {
            Ok(conn) => conn,
            Err(error) => {
                tracing::debug!(%error, node, "redis cluster watch could not connect");
                shared.has_tried.store(true, Ordering::Release);
                shared.tried.notify_waiters();
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(500));
                continue;
            }
        };
        backoff = Duration::from_millis(50);
        *shared.conn.lock().unwrap() = Some(conn.clone());
        shared.has_tried.store(true, Ordering::Release);
        shared.tried.notify_waiters();
        loop {
            tokio::select! {
                _ = dropped.recv() => break,
                () = tokio::time::sleep(KEEPALIVE) => {
                    // One that fails is the node's own trouble, which the connection's end
                    // reports.
                    let ping = redis::cmd("PING");
                    let _ = tokio::time::timeout(KEEPALIVE, ping.query_async::<()>(&mut conn)).await;
                }
            }
        }
        *shared.conn.lock().unwrap() = None;
        drop(conn);
        // Ended without its push (the driver gone some other way), or a replica's: the
        // same, unless the node is a replica still (its restart or crash loses no grant).
        if !shared.retired.load(Ordering::Acquire) && !reported.swap(true, Ordering::AcqRel) {
            if shared.role.load(Ordering::Acquire) == REPLICA
                && peers.still_replica(&addr, timeout).await
            {
                tracing::debug!(node, "redis cluster watch: a replica's connection ended");
            } else {
                resets.reset(&format!(
                    "the connection to redis cluster node {node} ended"
                ));
            }
        }
    }
}

/// Whether the watch was ended on purpose (or is gone altogether).
fn is_retired(shared: &Weak<Shared>) -> bool {
    shared
        .upgrade()
        .is_none_or(|shared| shared.retired.load(Ordering::Acquire))
}

/// Whether the topology the watch knows names the node a replica.
fn is_replica(shared: &Weak<Shared>) -> bool {
    shared
        .upgrade()
        .is_some_and(|shared| shared.role.load(Ordering::Acquire) == REPLICA)
}

/// A RESP3 connection to the node, its pushes to `on_push`, named [`NAME`], subscribed to
/// `revoke` (a user without the right watches unsubscribed: its revocations are then
/// learnt at the next renewal).
async fn connect(
    info: &ConnectionInfo,
    on_push: impl redis::aio::AsyncPushSender,
    revoke: &str,
) -> Result<MultiplexedConnection, RedisError> {
    let client = redis::Client::open(info.clone())?;
    // No response timeout: the connection mostly waits for its end; each command it sends
    // is bounded by its caller.
    let config = redis::AsyncConnectionConfig::new()
        .set_response_timeout(None)
        .set_push_sender(on_push);
    let mut conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await?;
    // A user without the right to name its connection watches unnamed.
    let named = redis::cmd("CLIENT")
        .arg("SETNAME")
        .arg(NAME)
        .query_async::<()>(&mut conn)
        .await;
    if let Err(error) = named {
        if error.is_unrecoverable_error() {
            return Err(error);
        }
        tracing::debug!(%error, "redis cluster watch could not name its connection");
    }
    if let Err(error) = conn.subscribe(revoke).await {
        if error.is_unrecoverable_error() {
            return Err(error);
        }
        tracing::debug!(%error, "redis cluster watch could not subscribe to revocations");
    }
    Ok(conn)
}
