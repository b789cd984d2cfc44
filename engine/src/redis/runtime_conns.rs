//! [`RuntimeConns`]: the command connections of the callers' own runtimes.
//!
//! A call made from a user's tokio runtime goes out on a connection whose driver task runs
//! on that runtime, so a round trip costs no hop to the engine's thread and back (two
//! cross-thread wake-ups, most of an uncontended cycle's time beside a lock that does its
//! I/O where it is called). Work that must outlive a user runtime (renewals, wake-ups,
//! detached releases and completions) runs on the engine's runtime, and its calls use the
//! engine's pool.
//!
//! Each runtime's connection is its own: a runtime that blocks delays its own calls only,
//! and one that shuts down takes its connection's driver with it. A guard task spawned on
//! the runtime with its first connection drops the runtime's entry when the runtime drops
//! its tasks, so a runtime that went away leaves nothing behind here.
//!
//! A connection is used while it is current (the connector's generation, bumped by any
//! connection-level failure, retires it as it retires the pool's); a call that finds none
//! connects on its runtime, through the connector's outage admission.
//!
//! The guard task also keeps one timer of its runtime armed while the runtime makes calls
//! (see [`Armed`]): without it, the timeout every call arms would wake a worker parked in
//! the runtime's driver, a cross-thread wake-up per call on a runtime otherwise at rest.

use std::{
    sync::{
        Arc, Mutex, Weak,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use redis::aio::MultiplexedConnection;
use tokio::{
    runtime::{Handle, Id},
    sync::Notify,
};

use super::connector::{Connector, PooledConn};
use crate::runtime;

/// How long a replaced connection stays open: a call that timed out on it (a paused or
/// stalled server) may still sit in the server's queue, and closing the socket would
/// make the server drop it. A release queued so lands when the server resumes, as it
/// would on the pool, whose retired connections close as lazily.
const RETIRED_GRACE: Duration = Duration::from_secs(10);

/// The current connection of each user runtime that has made calls, by runtime.
pub(super) struct RuntimeConns {
    entries: Mutex<Vec<Entry>>,
    /// Connections replaced by a newer one, open until their grace ends.
    retired: Mutex<Vec<(Instant, PooledConn)>>,
    /// The command timeout: no call's deadline is nearer than this.
    timeout: Duration,
}

struct Entry {
    runtime: Id,
    conn: Option<PooledConn>,
    armed: Arc<Armed>,
}

/// Keeps a timer of one runtime armed while the runtime makes calls, so that arming a
/// call's own timeout never has to wake one of its workers.
///
/// tokio wakes the worker parked in a runtime's driver (an `eventfd` write, and that
/// worker's round through `epoll_wait`) whenever a timer is armed earlier than the
/// driver's next planned wake-up, and a driver with no timer at all plans none: on a
/// runtime at rest between calls, each call's timeout (the engine's, and redis-rs's
/// response timeout) cost one such wake, two per uncontended acquire. A sleep of one
/// command timeout, re-armed as it ends, is never later than the deadline of a call made
/// after it was armed, so while it is armed no call's timeout moves the driver's wake-up
/// earlier. A runtime that made no call for a whole period keeps no timer until its
/// next call (which pays that one wake).
struct Armed {
    /// A call was made since the timer was last re-armed.
    used: AtomicBool,
    /// Resumes an idle task (a permit is stored if it is not waiting yet).
    resume: Notify,
}

impl Armed {
    /// A call is being made on this runtime.
    fn used(&self) {
        // A load first: a busy runtime's calls find it set and write nothing.
        if !self.used.load(Ordering::Relaxed) && !self.used.swap(true, Ordering::Relaxed) {
            self.resume.notify_one();
        }
    }

    /// The guard task's loop: a sleep of `period` at a time while calls are made, until
    /// the engine's connections (`conns`) are gone.
    async fn keep_armed(&self, period: Duration, conns: &Weak<RuntimeConns>) {
        loop {
            tokio::time::sleep(period).await;
            if conns.strong_count() == 0 {
                return;
            }
            if !self.used.swap(false, Ordering::Relaxed) {
                // No call for a whole period: no timer until the next one.
                self.resume.notified().await;
            }
        }
    }
}

/// Dropped with the tasks of its runtime: the runtime's entry goes.
struct Gone {
    conns: Weak<RuntimeConns>,
    runtime: Id,
}

impl Drop for Gone {
    fn drop(&mut self) {
        if let Some(conns) = self.conns.upgrade() {
            conns
                .entries
                .lock()
                .unwrap()
                .retain(|e| e.runtime != self.runtime);
        }
    }
}

impl RuntimeConns {
    /// No connections yet; calls made on them time out after `timeout`.
    pub(super) fn new(timeout: Duration) -> Self {
        Self {
            entries: Mutex::default(),
            retired: Mutex::default(),
            timeout,
        }
    }

    /// The runtime the caller is on, if it is a user's (not the engine's, whose calls use
    /// the pool, nor none). A release begun on one runtime and the next acquire of its key
    /// on another (two actix workers) take two sockets: the engine orders them itself (an
    /// acquire waits for this engine's own release of its key, see `releasing`).
    pub(super) fn user_runtime() -> Option<Id> {
        let current = Handle::try_current().ok()?;
        let id = current.id();
        (id != runtime::handle().id()).then_some(id)
    }

    /// The user runtime a detached operation polled in place came from
    /// ([`runtime::Origin`]): its calls take that runtime's connection if it has a current
    /// one (never a new one: that would be made on the engine's runtime), else the pool.
    pub(super) fn origin() -> Option<Id> {
        runtime::Origin::get()
    }

    /// `runtime`'s connection, if it has a current one.
    pub(super) fn get(&self, runtime: Id, connector: &Connector) -> Option<MultiplexedConnection> {
        let entries = self.entries.lock().unwrap();
        let entry = entries.iter().find(|e| e.runtime == runtime)?;
        let conn = entry.conn.as_ref()?;
        if !connector.current(conn) {
            return None;
        }
        entry.armed.used();
        Some(conn.inner.clone())
    }

    /// Keep `conn`, made on `runtime` (the current one), as its connection.
    pub(super) fn keep(self: &Arc<Self>, runtime: Id, conn: PooledConn) {
        let mut entries = self.entries.lock().unwrap();
        if let Some(entry) = entries.iter_mut().find(|e| e.runtime == runtime) {
            entry.armed.used();
            let replaced = entry.conn.replace(conn);
            drop(entries);
            let now = Instant::now();
            let mut retired = self.retired.lock().unwrap();
            retired.retain(|(since, _)| now.duration_since(*since) < RETIRED_GRACE);
            retired.extend(replaced.map(|conn| (now, conn)));
            return;
        }
        let armed = Arc::new(Armed {
            used: AtomicBool::new(true),
            resume: Notify::new(),
        });
        entries.push(Entry {
            runtime,
            conn: Some(conn),
            armed: armed.clone(),
        });
        drop(entries);
        let gone = Gone {
            conns: Arc::downgrade(self),
            runtime,
        };
        let period = self.timeout;
        tokio::spawn(async move {
            armed.keep_armed(period, &gone.conns).await;
            drop(gone);
        });
    }
}
