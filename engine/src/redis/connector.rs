//! [`Connector`]: makes the command connections to one server (or to the primary Sentinel
//! names), tells a current connection from a retired one, and keeps track of an outage.
//!
//! A multiplexed connection does not reconnect by itself, and bb8-redis's manager never
//! reports one as broken, so a pool would keep handing out dead sockets after a Redis
//! restart. Here every connection carries the connector's generation at connect time; any
//! connection-level failure (I/O error, dropped connection, timeout) bumps the
//! generation, which retires every older connection at its next check-out. The check is a
//! local comparison, not a PING.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use redis::{RedisError, aio::MultiplexedConnection};
use tokio::time::Instant;

use crate::{BackendError, BackendErrorKind, BoxFuture, runtime};

/// Makes and vets the connections to one server, shared by the command pool and the
/// wake-up subscriber (which connects through it, and so follows Sentinel too).
pub(crate) struct Connector {
    client: Box<dyn ClientSource>,
    config: redis::AsyncConnectionConfig,
    generation: AtomicU64,
    /// The last connect failure, to say "unavailable" rather than "timeout" when the pool
    /// gives up because the server refuses connections.
    pub(super) last_connect_error: Mutex<Option<(Instant, RedisError)>>,
    /// Where connections go, for errors: `127.0.0.1:6379`, or the primary Sentinel names.
    target: String,
    /// Set while the server is known to be unreachable (a connect failed, and none has
    /// succeeded since): calls fail at once instead of each waiting out its timeout, and
    /// one background probe looks for the server.
    outage: Mutex<Option<Outage>>,
    /// Whether `outage` is set: read by every call, so that the common case takes no lock.
    down: AtomicBool,
    /// Whether a call is trying to connect during an outage (see [`Connector::admit`]).
    trying: AtomicBool,
    /// Signalled when the call trying to connect during an outage is done trying.
    tried: tokio::sync::Notify,
    /// Signalled at every failed connect, so check-outs waiting for a connection that will
    /// not come fail at once.
    pub(super) went_down: tokio::sync::Notify,
}

/// The server is known to be unreachable.
struct Outage {
    since: Instant,
    /// The last connect failure (the probe's, once it has tried).
    error: RedisError,
}

/// Where the server's address comes from: a fixed [`redis::Client`], or (with Sentinel)
/// the primary Sentinel names now, asked again for every new connection, so that after a
/// failover retired connections reconnect to the new primary.
pub(crate) trait ClientSource: Send + Sync {
    /// A client for the server to connect to now.
    fn client(&self) -> BoxFuture<'_, Result<redis::Client, RedisError>>;

    /// Where connections go, for errors: `redis at 127.0.0.1:6379`.
    fn describe(&self) -> String;
}

impl ClientSource for redis::Client {
    fn client(&self) -> BoxFuture<'_, Result<redis::Client, RedisError>> {
        Box::pin(std::future::ready(Ok(self.clone())))
    }

    fn describe(&self) -> String {
        format!("redis at {}", self.get_connection_info().addr())
    }
}

/// A pooled connection and the generation it belongs to.
pub(crate) struct PooledConn {
    pub(super) inner: MultiplexedConnection,
    generation: u64,
    broken: bool,
}

impl Connector {
    pub(crate) fn new(client: Box<dyn ClientSource>, timeout: Duration) -> Self {
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        let target = client.describe();
        Self {
            client,
            config,
            generation: AtomicU64::new(0),
            last_connect_error: Mutex::new(None),
            target,
            outage: Mutex::new(None),
            down: AtomicBool::new(false),
            trying: AtomicBool::new(false),
            tried: tokio::sync::Notify::new(),
            went_down: tokio::sync::Notify::new(),
        }
    }

    /// Whether a call may go ahead: always, unless the server is known to be unreachable.
    /// Then one call at a time is let through to try a connection itself (`Some`: it is
    /// the one trying until the guard drops), so that calls work again as soon as the
    /// server is back rather than when the background probe next looks. Every other call
    /// waits for that one's outcome (within `deadline`) and fails if it failed: a server
    /// that refuses connections answers the one trying at once, so they all fail at once;
    /// one that came back lets them all through (a release right after a stall must not
    /// fail because another call happened to be the one trying).
    pub(super) async fn admit(
        &self,
        what: &'static str,
        deadline: Instant,
    ) -> Result<Option<Trying<'_>>, BackendError> {
        if self.outage(what).is_none() {
            return Ok(None);
        }
        // Listening before trying to become the one trying: its end cannot be missed.
        let tried = self.tried.notified();
        let mut tried = std::pin::pin!(tried);
        tried.as_mut().enable();
        if self
            .trying
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            return Ok(Some(Trying(self)));
        }
        let _ = tokio::time::timeout_at(deadline, tried).await;
        match self.outage(what) {
            None => Ok(None),
            Some(down) => Err(down),
        }
    }

    /// While the server is known to be unreachable: the error a call gets at once.
    pub(super) fn outage(&self, what: &'static str) -> Option<BackendError> {
        if !self.down.load(Ordering::Acquire) {
            return None;
        }
        let outage = self.outage.lock().unwrap();
        let outage = outage.as_ref()?;
        Some(
            BackendError::new(
                BackendErrorKind::Unavailable,
                format!(
                    "redis {what} failed: cannot connect to {} (unreachable for {:?}; retrying in the background)",
                    self.target,
                    outage.since.elapsed()
                ),
            )
            .with_source(outage.error.clone()),
        )
    }

    /// A connect failed: the server is unreachable until a connect succeeds. The first
    /// failure of an outage starts the one probe that looks for the server.
    fn connect_failed(self: &Arc<Self>, error: &RedisError) {
        if !(error.is_connection_refusal()
            || error.is_io_error()
            || error.is_timeout()
            || error.is_connection_dropped())
        {
            // Refused for another reason (credentials, protocol): not an outage.
            return;
        }
        let began = {
            let mut outage = self.outage.lock().unwrap();
            match outage.as_mut() {
                Some(outage) => {
                    outage.error = error.clone();
                    false
                }
                None => {
                    *outage = Some(Outage {
                        since: Instant::now(),
                        error: error.clone(),
                    });
                    self.down.store(true, Ordering::Release);
                    true
                }
            }
        };
        self.went_down.notify_waiters();
        if !began {
            return;
        }
        // At debug level: the layer logs an outage at its transitions, for the user.
        tracing::debug!(target = %self.target, %error, "redis unreachable; calls fail at once until a connect succeeds");
        runtime::handle().spawn(probe(Arc::downgrade(self)));
    }

    /// A connect succeeded: the outage, if any, is over.
    fn connected(&self) {
        if !self.down.load(Ordering::Acquire) {
            return;
        }
        let mut outage = self.outage.lock().unwrap();
        self.down.store(false, Ordering::Release);
        if let Some(outage) = outage.take() {
            tracing::debug!(target = %self.target, after = ?outage.since.elapsed(), "redis reachable again");
        }
    }

    /// Where connections go, for errors: `redis at 127.0.0.1:6379`.
    pub(crate) fn target(&self) -> &str {
        &self.target
    }

    /// Retire every connection made so far.
    pub(crate) fn invalidate(&self) {
        self.generation.fetch_add(1, Ordering::Relaxed);
    }

    /// A client for the server to connect to now (for Sentinel: the current primary).
    pub(crate) async fn client(&self) -> Result<redis::Client, RedisError> {
        self.client.client().await
    }

    /// A client like [`client`](Self::client)'s that speaks RESP3, for the connections
    /// that receive pushes (the wake-up subscriber, the session watch).
    pub(crate) async fn resp3_client(&self) -> Result<redis::Client, RedisError> {
        let info = self.client().await?.get_connection_info().clone();
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(redis::ProtocolVersion::RESP3);
        redis::Client::open(info.set_redis_settings(settings))
    }

    /// Whether `conn` is of the current generation and was not found broken.
    pub(super) fn current(&self, conn: &PooledConn) -> bool {
        !conn.broken && conn.generation == self.generation.load(Ordering::Relaxed)
    }

    /// [`current`](Self::current), and if not, `conn` is about to be dropped: it stays
    /// open for a grace first ([`linger`]).
    pub(super) fn current_or_linger(&self, conn: &PooledConn) -> bool {
        let current = self.current(conn);
        if !current {
            linger(conn.inner.clone());
        }
        current
    }
}

impl Connector {
    /// A new connection, made on the engine's runtime: its driver task lives there, so it
    /// keeps working whichever user runtime asked for it blocks or shuts down.
    pub(super) async fn connect(self: &Arc<Self>) -> Result<PooledConn, RedisError> {
        let this = self.clone();
        let connected = match runtime::handle()
            .spawn(async move { this.connect_here().await })
            .await
        {
            Ok(connected) => connected,
            // Only if the engine's runtime itself went away (a process exiting).
            Err(e) => Err(RedisError::from(std::io::Error::other(e))),
        };
        self.settle(&connected);
        connected
    }

    /// A new connection made on the caller's runtime: its driver task lives (and dies) with
    /// that runtime, for the calls made from it (see `RuntimeConns`).
    pub(super) async fn connect_on_this_runtime(
        self: &Arc<Self>,
    ) -> Result<PooledConn, RedisError> {
        let connected = self.connect_here().await;
        self.settle(&connected);
        connected
    }

    /// A connect ended: an outage ends or begins.
    fn settle(self: &Arc<Self>, connected: &Result<PooledConn, RedisError>) {
        match connected {
            Ok(_) => self.connected(),
            Err(e) => self.connect_failed(e),
        }
    }

    async fn connect_here(&self) -> Result<PooledConn, RedisError> {
        let generation = self.generation.load(Ordering::Relaxed);
        let connected = match self.client().await {
            Ok(client) => {
                client
                    .get_multiplexed_async_connection_with_config(&self.config)
                    .await
            }
            Err(e) => Err(e),
        };
        match connected {
            Ok(inner) => Ok(PooledConn {
                inner,
                generation,
                broken: false,
            }),
            Err(e) => {
                *self.last_connect_error.lock().unwrap() = Some((Instant::now(), e.clone()));
                Err(e)
            }
        }
    }
}

/// How long a retired connection stays open: a call that timed out on it (a server paused
/// by `CLIENT PAUSE WRITE`, as `FAILOVER` does, or stalled) may still sit in the server's
/// queue, and closing the socket would make the server drop it. A release so queued
/// lands when the server resumes, within this.
pub(super) const RETIRED_GRACE: Duration = Duration::from_secs(10);

/// Keep `conn` (a retired connection, whose other handles are being dropped) open for
/// [`RETIRED_GRACE`], then let it close: dropping the last handle of a multiplexed
/// connection ends its driver and closes the socket at once, requests in flight or not.
/// The handle waits on the engine's runtime.
pub(super) fn linger(conn: MultiplexedConnection) {
    runtime::handle().spawn(async move {
        tokio::time::sleep(RETIRED_GRACE).await;
        drop(conn);
    });
}

/// The call trying to connect during an outage (see [`Connector::admit`]); dropping it
/// lets the next one try, and tells the calls waiting for its outcome.
pub(super) struct Trying<'a>(&'a Connector);

impl Drop for Trying<'_> {
    fn drop(&mut self) {
        self.0.trying.store(false, Ordering::Release);
        self.0.tried.notify_waiters();
    }
}

/// The one probe of an outage: tries to connect, less and less often (50 ms doubling to
/// 500 ms: a server back is found within half a second), until a connection succeeds or the backend is dropped. Runs on the engine's
/// runtime.
async fn probe(connector: std::sync::Weak<Connector>) {
    let mut wait = Duration::from_millis(50);
    loop {
        tokio::time::sleep(wait).await;
        let Some(connector) = connector.upgrade() else {
            return;
        };
        match connector.connect_here().await {
            // The connection itself is not kept: the pool makes its own on demand.
            Ok(_) => {
                connector.connected();
                return;
            }
            Err(error) => {
                if let Some(outage) = connector.outage.lock().unwrap().as_mut() {
                    outage.error = error;
                }
            }
        }
        wait = (wait * 2).min(Duration::from_millis(500));
    }
}
