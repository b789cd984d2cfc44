//! [`RuntimeConns`]: the command connections of the callers' own runtimes.
//!
//! A call made from a user's multi-threaded tokio runtime goes out on a connection whose
//! driver task runs on that runtime, so a round trip costs no hop to the engine's thread and back (two
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

use std::sync::{Arc, Mutex, Weak};

use redis::aio::MultiplexedConnection;
use tokio::runtime::{Handle, Id, RuntimeFlavor};

use super::connector::{Connector, PooledConn};
use crate::runtime;

/// The current connection of each user runtime that has made calls, by runtime.
#[derive(Default)]
pub(super) struct RuntimeConns {
    entries: Mutex<Vec<Entry>>,
}

struct Entry {
    runtime: Id,
    conn: Option<PooledConn>,
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
    /// The runtime the caller is on, if it is a user's multi-threaded one (not the
    /// engine's, whose calls use the pool, nor none).
    ///
    /// Current-thread runtimes share the engine's pool: a server that runs one per worker
    /// (actix-web) would otherwise send a release (as a response ends, on one worker) and
    /// the client's next request (on another worker) on two sockets, and Redis could run
    /// the acquire first. One multi-threaded runtime serves all of an application's
    /// requests on its one connection, in order.
    pub(super) fn user_runtime() -> Option<Id> {
        let current = Handle::try_current().ok()?;
        let id = current.id();
        (id != runtime::handle().id() && current.runtime_flavor() == RuntimeFlavor::MultiThread)
            .then_some(id)
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
        let conn = entries
            .iter()
            .find(|e| e.runtime == runtime)?
            .conn
            .as_ref()?;
        connector.current(conn).then(|| conn.inner.clone())
    }

    /// Keep `conn`, made on `runtime` (the current one), as its connection.
    pub(super) fn keep(self: &Arc<Self>, runtime: Id, conn: PooledConn) {
        let mut entries = self.entries.lock().unwrap();
        if let Some(entry) = entries.iter_mut().find(|e| e.runtime == runtime) {
            entry.conn = Some(conn);
            return;
        }
        entries.push(Entry {
            runtime,
            conn: Some(conn),
        });
        drop(entries);
        let gone = Gone {
            conns: Arc::downgrade(self),
            runtime,
        };
        tokio::spawn(async move {
            let _gone = gone;
            std::future::pending::<()>().await;
        });
    }
}
