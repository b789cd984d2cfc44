//! [`Conn`]: the connection one Redis call runs on, one server's multiplexed connection
//! or another kind (a cluster connection) behind a box.

use redis::{Value, aio::ConnectionLike};

/// A command connection: one server's multiplexed connection, or a cluster connection.
/// Cloning shares the socket(s): commands sent on a clone run in order with the others.
///
/// One server's connection is held as it is: every call takes one (and a waiter pins a
/// clone), so boxing it would cost allocations on every acquire and release. Other kinds
/// (a cluster connection) go through a box, which keeps their types out of this file.
pub(crate) enum Conn {
    Server(redis::aio::MultiplexedConnection),
    Other(Box<dyn CommandConnection>),
}

/// What a command connection is: a redis-rs connection that can be cloned.
pub(crate) trait CommandConnection: ConnectionLike + Send + Sync {
    fn clone_box(&self) -> Box<dyn CommandConnection>;
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> CommandConnection for C {
    fn clone_box(&self) -> Box<dyn CommandConnection> {
        Box::new(self.clone())
    }
}

impl Conn {
    // The way in for connections of another kind: only the cluster backend has one.
    #[cfg_attr(not(feature = "redis-cluster"), allow(dead_code))]
    /// Wrap a redis-rs connection of another kind than one server's.
    pub(crate) fn new(conn: impl ConnectionLike + Clone + Send + Sync + 'static) -> Self {
        Self::Other(Box::new(conn))
    }

    fn inner(&mut self) -> &mut dyn ConnectionLike {
        match self {
            Self::Server(conn) => conn,
            Self::Other(conn) => conn.as_mut(),
        }
    }
}

impl Clone for Conn {
    fn clone(&self) -> Self {
        match self {
            Self::Server(conn) => Self::Server(conn.clone()),
            Self::Other(conn) => Self::Other(conn.clone_box()),
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        self.inner().req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        self.inner().req_packed_commands(cmd, offset, count)
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Server(conn) => conn.get_db(),
            Self::Other(conn) => conn.get_db(),
        }
    }
}
