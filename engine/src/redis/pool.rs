//! [`ServerPool`]: the command connections to one server, a bb8 pool of multiplexed
//! connections made and vetted by the shared [`Connector`].
//!
//! A check-out lasts only as long as it takes to clone the connection: calls run on the
//! clone, so concurrent calls pipeline over a few sockets rather than each holding one for
//! a round trip (with 16 connections, 50 concurrent callers used to queue for them).
//!
//! The pool serves the engine's own runtime (renewals, wake-ups, detached work); a call
//! from a user's runtime uses that runtime's own connection ([`RuntimeConns`]).

use std::{sync::Arc, time::Duration};

use redis::RedisError;
use tokio::time::Instant;

use super::{
    commands::{Conn, map_error, timed_out},
    connector::{Connector, PooledConn},
    runtime_conns::RuntimeConns,
};
use crate::{BackendError, BackendErrorKind, runtime};

/// The command connections to one server (for Sentinel: to the primary it names now).
pub(crate) struct ServerPool {
    pool: bb8::Pool<PoolConnector>,
    connector: Arc<Connector>,
    /// The command timeout, for the errors of a check-out.
    timeout: Duration,
    /// The connections of the user runtimes that call.
    runtimes: Arc<RuntimeConns>,
}

/// What bb8 makes its connections with. bb8 owns it; it forwards to the shared
/// [`Connector`], so the subscriber connects (and retires connections) through the same one.
struct PoolConnector(Arc<Connector>);

impl ServerPool {
    /// At most `size` connections made by `connector`; a check-out waits at most `timeout`.
    pub(crate) fn new(connector: Arc<Connector>, size: u32, timeout: Duration) -> Self {
        let pool = bb8::Pool::builder()
            .max_size(size)
            .min_idle(None)
            .connection_timeout(timeout)
            // A refused connection is reported at once; the caller decides about retries.
            .retry_connection(false)
            // Our is_valid is a local generation check, not a PING.
            .test_on_check_out(true)
            .build_unchecked(PoolConnector(connector.clone()));
        Self {
            pool,
            connector,
            timeout,
            runtimes: Arc::default(),
        }
    }

    /// A connection for one call, within `deadline`.
    pub(super) async fn conn(
        &self,
        what: &'static str,
        deadline: Instant,
    ) -> Result<Conn, BackendError> {
        if let Some(runtime) = RuntimeConns::user_runtime() {
            if let Some(conn) = self.runtimes.get(runtime, &self.connector) {
                return Ok(Conn::Server(conn));
            }
            return self.connect_on_this_runtime(what, deadline, runtime).await;
        }
        if let Some(origin) = RuntimeConns::origin()
            && let Some(conn) = self.runtimes.get(origin, &self.connector)
        {
            return Ok(Conn::Server(conn));
        }
        let connector = &self.connector;
        let Some(_trying) = connector.admit(what, deadline).await? else {
            let conn = self.checkout(what, deadline).await?;
            return Ok(Conn::Server(conn.inner.clone()));
        };
        // The one call trying during an outage connects by itself: bb8 would have it wait
        // for a connect it counts as pending although that one has failed already, and
        // tells no waiter when a connect fails.
        let conn = match tokio::time::timeout_at(deadline, connector.connect()).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => {
                return Err(connector.outage(what).unwrap_or_else(|| map_error(what, e)));
            }
            Err(_) => return Err(timed_out(what, self.timeout)),
        };
        let inner = conn.inner.clone();
        // Kept for the calls that follow (dropped if the pool is full).
        let _ = self.pool.add(conn);
        Ok(Conn::Server(inner))
    }

    /// A connection made on the caller's runtime `runtime`, kept for its next calls; during
    /// an outage, admitted as the pool's connects are.
    async fn connect_on_this_runtime(
        &self,
        what: &'static str,
        deadline: Instant,
        runtime: tokio::runtime::Id,
    ) -> Result<Conn, BackendError> {
        let connector = &self.connector;
        let _trying = connector.admit(what, deadline).await?;
        let conn =
            match tokio::time::timeout_at(deadline, connector.connect_on_this_runtime()).await {
                Ok(Ok(conn)) => conn,
                Ok(Err(e)) => {
                    return Err(connector.outage(what).unwrap_or_else(|| map_error(what, e)));
                }
                Err(_) => return Err(timed_out(what, self.timeout)),
            };
        let inner = conn.inner.clone();
        self.runtimes.keep(runtime, conn);
        Ok(Conn::Server(inner))
    }

    async fn checkout(
        &self,
        what: &'static str,
        deadline: Instant,
    ) -> Result<bb8::PooledConnection<'_, PoolConnector>, BackendError> {
        let (pool, connector) = (&self.pool, &self.connector);
        // A connect that fails while we wait starts (or continues) an outage: then no
        // connection is coming, and the call fails at once rather than at its deadline.
        let went_down = connector.went_down.notified();
        let mut went_down = std::pin::pin!(went_down);
        went_down.as_mut().enable();
        // One that failed since this call was admitted, before it listened.
        if let Some(down) = connector.outage(what) {
            return Err(down);
        }
        // bb8 makes missing connections in tasks it spawns on the current runtime: let
        // that be the engine's.
        let get = runtime::on_engine(tokio::time::timeout_at(deadline, pool.get()));
        tokio::select! {
            got = get => match got {
                Ok(Ok(conn)) => Ok(conn),
                Ok(Err(bb8::RunError::User(e))) => Err(map_error(what, e)),
                Ok(Err(bb8::RunError::TimedOut)) | Err(_) => Err(self.checkout_failed(what)),
            },
            () = went_down => Err(connector
                .outage(what)
                .unwrap_or_else(|| self.checkout_failed(what))),
        }
    }

    fn checkout_failed(&self, what: &'static str) -> BackendError {
        let recent = self
            .connector
            .last_connect_error
            .lock()
            .unwrap()
            .as_ref()
            .filter(|(at, _)| at.elapsed() <= self.timeout * 2)
            .map(|(_, e)| e.clone());
        match recent {
            Some(e) => map_error(what, e),
            None => BackendError::new(
                BackendErrorKind::Timeout,
                format!("no redis connection for {what} within {:?}", self.timeout),
            ),
        }
    }
}

impl ServerPool {
    /// The connector the pool's connections come from.
    pub(super) fn connector(&self) -> &Arc<Connector> {
        &self.connector
    }

    /// After a connection-level failure: retire every connection made so far.
    pub(super) fn retire(&self) {
        self.connector.invalidate();
    }
}

impl bb8::ManageConnection for PoolConnector {
    type Connection = PooledConn;
    type Error = RedisError;

    async fn connect(&self) -> Result<PooledConn, RedisError> {
        self.0.connect().await
    }

    // A retired connection is dropped by bb8 right after either check: it lingers first
    // (a timed-out call on it may still be queued on the server; see `RETIRED_GRACE`).
    async fn is_valid(&self, conn: &mut PooledConn) -> Result<(), RedisError> {
        if self.0.current_or_linger(conn) {
            Ok(())
        } else {
            Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "connection retired",
            )))
        }
    }

    fn has_broken(&self, conn: &mut PooledConn) -> bool {
        !self.0.current_or_linger(conn)
    }
}
