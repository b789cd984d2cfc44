//! [`RuntimeConns`]: the command connections of the callers' own runtimes.
//!
//! A call made from a user's tokio runtime goes out on a connection whose driver task runs
//! on that runtime, so a round trip costs no hop to the engine's thread and back (two
//! cross-thread wake-ups, most of an uncontended cycle's time beside a lock that does its
//! I/O where it is called). Work that must outlive a user runtime (renewals, wake-ups,
//! detached releases and completions, a release on drop) runs on the engine's runtime, and
//! its calls use the engine's pool: a request handed to a user runtime's connection is
//! written by that runtime's driver, and lost if the runtime shuts down first.
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
use tokio::runtime::{Handle, Id};

use super::connector::{self, Connector, PooledConn};
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
    /// The runtime the caller is on, if it is a user's (not the engine's, whose calls use
    /// the pool, nor none). A release begun on one runtime and the next acquire of its key
    /// on another (two actix workers) take two sockets: the engine orders them itself (an
    /// acquire waits for this engine's own release of its key, see `releasing`).
    pub(super) fn user_runtime() -> Option<Id> {
        let current = Handle::try_current().ok()?;
        let id = current.id();
        (id != runtime::handle().id()).then_some(id)
    }

    /// The user runtime a [`Detachable`](runtime::Detachable) awaited in place came from
    /// ([`runtime::Origin`]; none for [`runtime::detach`]): its calls take that runtime's
    /// connection if it has a current one (never a new one: that would be made on the
    /// engine's runtime), else the pool.
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
            let replaced = entry.conn.replace(conn);
            drop(entries);
            // A call that timed out on it may still sit in the server's queue.
            if let Some(replaced) = replaced {
                connector::linger(replaced.inner);
            }
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
