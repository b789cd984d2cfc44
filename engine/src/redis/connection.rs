//! The command connection pool: bb8 over multiplexed connections, with broken-connection
//! detection that costs no round trip.
//!
//! A multiplexed connection does not reconnect by itself, and bb8-redis's manager never
//! reports one as broken, so a pool would keep handing out dead sockets after a Redis
//! restart. Here every connection carries the pool's generation at connect time; any
//! connection-level failure (I/O error, dropped connection, timeout) bumps the
//! generation, which retires every older connection at its next check-out. The check is a
//! local comparison, not a PING.
//!
//! A check-out lasts only as long as it takes to clone the connection: calls run on the
//! clone, so concurrent calls pipeline over a few sockets rather than each holding one for
//! a round trip (with 16 connections, 50 concurrent callers used to queue for them).

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    task::Poll,
    time::Duration,
};

use redis::{FromRedisValue, RedisError, ScriptInvocation, Value, aio::MultiplexedConnection};
use tokio::time::Instant;

use crate::runtime;
use crate::{BackendError, BackendErrorKind};

/// Makes and vets the pool's connections.
pub(crate) struct Connector {
    client: ClientSource,
    config: redis::AsyncConnectionConfig,
    generation: AtomicU64,
    /// The last connect failure, to say "unavailable" rather than "timeout" when the pool
    /// gives up because the server refuses connections.
    last_connect_error: Mutex<Option<(Instant, RedisError)>>,
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
    /// Signalled at every failed connect, so check-outs waiting for a connection that will
    /// not come fail at once.
    went_down: tokio::sync::Notify,
}

/// The server is known to be unreachable.
struct Outage {
    since: Instant,
    /// The last connect failure (the probe's, once it has tried).
    error: RedisError,
}

/// Where the server's address comes from.
pub(crate) enum ClientSource {
    /// A fixed server.
    Fixed(redis::Client),
    /// The primary Sentinel names now, asked again for every new connection: after a
    /// failover, retired connections reconnect to the new primary.
    #[cfg(feature = "redis-sentinel")]
    Sentinel(super::sentinel::SentinelLookup),
}

/// A pooled connection and the generation it belongs to.
pub(crate) struct PooledConn {
    inner: MultiplexedConnection,
    generation: u64,
    broken: bool,
}

impl Connector {
    pub(crate) fn new(client: ClientSource, timeout: Duration) -> Self {
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        let target = match &client {
            ClientSource::Fixed(client) => {
                format!("redis at {}", client.get_connection_info().addr())
            }
            #[cfg(feature = "redis-sentinel")]
            ClientSource::Sentinel(_) => "the redis primary that Sentinel names".to_owned(),
        };
        Connector {
            client,
            config,
            generation: AtomicU64::new(0),
            last_connect_error: Mutex::new(None),
            target,
            outage: Mutex::new(None),
            down: AtomicBool::new(false),
            trying: AtomicBool::new(false),
            went_down: tokio::sync::Notify::new(),
        }
    }

    /// Whether a call may go ahead: always, unless the server is known to be unreachable.
    /// Then one call at a time is let through to try a connection itself (`Some`: it is
    /// the one trying until the guard drops), so that calls work again as soon as the
    /// server is back rather than when the background probe next looks; every other call
    /// fails at once. A server that refuses connections answers the one trying at once
    /// too; one that does not answer at all keeps it for its timeout, and only it.
    fn admit(&self, what: &'static str) -> Result<Option<Trying<'_>>, BackendError> {
        let Some(down) = self.outage(what) else {
            return Ok(None);
        };
        match self
            .trying
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
        {
            Ok(_) => Ok(Some(Trying(&self.trying))),
            Err(_) => Err(down),
        }
    }

    /// While the server is known to be unreachable: the error a call gets at once.
    fn outage(&self, what: &'static str) -> Option<BackendError> {
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

    /// Retire every connection made so far.
    pub(crate) fn invalidate(&self) {
        self.generation.fetch_add(1, Ordering::Relaxed);
    }

    /// A client for the server to connect to now (for Sentinel: the current primary).
    pub(crate) async fn client(&self) -> Result<redis::Client, RedisError> {
        match &self.client {
            ClientSource::Fixed(client) => Ok(client.clone()),
            #[cfg(feature = "redis-sentinel")]
            ClientSource::Sentinel(sentinel) => sentinel.primary().await,
        }
    }

    fn current(&self, conn: &PooledConn) -> bool {
        !conn.broken && conn.generation == self.generation.load(Ordering::Relaxed)
    }
}

impl Connector {
    /// A new connection, made on the engine's runtime: its driver task lives there, so it
    /// keeps working whichever user runtime asked for it blocks or shuts down.
    async fn connect(self: &Arc<Self>) -> Result<PooledConn, RedisError> {
        let this = self.clone();
        let connected = match runtime::handle()
            .spawn(async move { this.connect_here().await })
            .await
        {
            Ok(connected) => connected,
            // Only if the engine's runtime itself went away (a process exiting).
            Err(e) => Err(RedisError::from(std::io::Error::other(e))),
        };
        match &connected {
            Ok(_) => self.connected(),
            Err(e) => self.connect_failed(e),
        }
        connected
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

/// The call trying to connect during an outage (see [`Connector::admit`]); dropping it
/// lets the next one try.
struct Trying<'a>(&'a AtomicBool);

impl Drop for Trying<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
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

/// A command connection: one server's multiplexed connection, or a cluster connection
/// (redis-rs routes each command to the primary of its keys' slot, follows `MOVED` and
/// reconnects by itself). Cloning shares the socket(s).
#[derive(Clone)]
pub(crate) enum Conn {
    Single(MultiplexedConnection),
    #[cfg(feature = "redis-cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// Where the command connections come from.
#[derive(Clone)]
enum Source {
    /// One server: a bb8 pool of multiplexed connections.
    Pooled {
        pool: bb8::Pool<SharedConnector>,
        connector: Arc<Connector>,
    },
    /// A cluster: one cluster connection, itself one multiplexed connection per node.
    #[cfg(feature = "redis-cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

/// The pool plus its timeout: every command goes through [`Pool::invoke`].
#[derive(Clone)]
pub(crate) struct Pool {
    source: Source,
    timeout: Duration,
}

#[derive(Clone, Copy)]
enum Call<'a, 'b> {
    Script(&'a ScriptInvocation<'b>),
    /// A plain command: for reads that need no script (a script call costs the server
    /// several times a plain command's time).
    Command(&'a redis::Cmd),
    /// The script with `WAIT` pipelined right behind it (see [`Pool::invoke_acked`]).
    ScriptThenWait(&'a ScriptInvocation<'b>, ReplicaAck),
}

/// `WAIT replicas timeout`: how many replicas must acknowledge a write, and how long the
/// primary waits for them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReplicaAck {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
}

/// bb8 owns its manager; this forwards to the shared [`Connector`] so the subscriber can
/// invalidate the same generation.
pub(crate) struct SharedConnector(pub(crate) Arc<Connector>);

impl Pool {
    pub(crate) fn new(connector: Arc<Connector>, size: u32, timeout: Duration) -> Self {
        let pool = bb8::Pool::builder()
            .max_size(size)
            .min_idle(None)
            .connection_timeout(timeout)
            // A refused connection is reported at once; the caller decides about retries.
            .retry_connection(false)
            // Our is_valid is a local generation check, not a PING.
            .test_on_check_out(true)
            .build_unchecked(SharedConnector(connector.clone()));
        Pool {
            source: Source::Pooled { pool, connector },
            timeout,
        }
    }

    /// Commands over one cluster connection (made with the command timeout).
    #[cfg(feature = "redis-cluster")]
    pub(crate) fn cluster(
        conn: redis::cluster_async::ClusterConnection,
        timeout: Duration,
    ) -> Self {
        Pool {
            source: Source::Cluster(conn),
            timeout,
        }
    }

    /// A connection for one call, within `deadline`.
    async fn conn(&self, what: &'static str, deadline: Instant) -> Result<Conn, BackendError> {
        match &self.source {
            Source::Pooled { pool, connector } => {
                let Some(_trying) = connector.admit(what)? else {
                    let conn = self.checkout(what, deadline).await?;
                    return Ok(Conn::Single(conn.inner.clone()));
                };
                // The one call trying during an outage connects by itself: bb8 would have
                // it wait for a connect it counts as pending although that one has failed
                // already, and tells no waiter when a connect fails.
                let conn = match tokio::time::timeout_at(deadline, connector.connect()).await {
                    Ok(Ok(conn)) => conn,
                    Ok(Err(e)) => {
                        return Err(connector.outage(what).unwrap_or_else(|| map_error(what, e)));
                    }
                    Err(_) => return Err(self.timed_out(what)),
                };
                let inner = conn.inner.clone();
                // Kept for the calls that follow (dropped if the pool is full).
                let _ = pool.add(conn);
                Ok(Conn::Single(inner))
            }
            #[cfg(feature = "redis-cluster")]
            Source::Cluster(conn) => Ok(Conn::Cluster(conn.clone())),
        }
    }

    /// After a connection-level failure: retire the pooled connections (a cluster
    /// connection repairs itself).
    fn invalidate(&self) {
        match &self.source {
            Source::Pooled { connector, .. } => connector.invalidate(),
            #[cfg(feature = "redis-cluster")]
            Source::Cluster(_) => {}
        }
    }

    /// The pool and its connector; only called on a pooled source.
    fn pooled(&self) -> (&bb8::Pool<SharedConnector>, &Arc<Connector>) {
        match &self.source {
            Source::Pooled { pool, connector } => (pool, connector),
            #[cfg(feature = "redis-cluster")]
            Source::Cluster(_) => unreachable!("a cluster connection is not checked out"),
        }
    }

    /// Load scripts into the server's cache (also proves the server answers).
    pub(crate) async fn load(&self, scripts: &[&redis::Script]) -> Result<(), BackendError> {
        let deadline = Instant::now() + self.timeout;
        // In a cluster, redis-rs sends SCRIPT LOAD to every primary.
        let mut conn = self.conn("SCRIPT LOAD", deadline).await?;
        let load = async {
            for script in scripts {
                script.load_async(&mut conn).await?;
            }
            Ok::<_, RedisError>(())
        };
        match tokio::time::timeout_at(deadline, load).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(map_error("SCRIPT LOAD", e)),
            Err(_) => Err(self.timed_out("SCRIPT LOAD")),
        }
    }

    async fn checkout(
        &self,
        what: &'static str,
        deadline: Instant,
    ) -> Result<bb8::PooledConnection<'_, SharedConnector>, BackendError> {
        let (pool, connector) = self.pooled();
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

    /// Run a script within the command timeout (connection check-out included).
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        what: &'static str,
        inv: &ScriptInvocation<'_>,
    ) -> Result<T, BackendError> {
        let value = self.run(what, Call::Script(inv), None).await?;
        T::from_redis_value(value).map_err(|e| map_error(what, e.into()))
    }

    /// Run a plain command within the command timeout (connection check-out included).
    pub(crate) async fn query<T: FromRedisValue>(
        &self,
        what: &'static str,
        cmd: &redis::Cmd,
    ) -> Result<T, BackendError> {
        let value = self.run(what, Call::Command(cmd), None).await?;
        T::from_redis_value(value).map_err(|e| map_error(what, e.into()))
    }

    /// Like [`Pool::invoke`], but first stores a handle on the connection the script is
    /// sent on in `pin`. Commands sent later on that handle run after this one on the
    /// server, whatever happens to its reply: that is how an acquire whose reply is lost
    /// gets released without racing ahead of it.
    pub(crate) async fn invoke_pinned<T: FromRedisValue>(
        &self,
        what: &'static str,
        inv: &ScriptInvocation<'_>,
        pin: &mut Option<Conn>,
    ) -> Result<T, BackendError> {
        let value = self.run(what, Call::Script(inv), Some(pin)).await?;
        T::from_redis_value(value).map_err(|e| map_error(what, e.into()))
    }

    /// Like [`Pool::invoke_pinned`], with `WAIT` pipelined right behind the script on the
    /// same connection: one round trip, and `WAIT` covers exactly the writes of this
    /// script (Redis refuses `WAIT` inside a script). Returns the script's reply and how
    /// many replicas acknowledged. The call may take the command timeout plus the `WAIT`
    /// timeout.
    pub(crate) async fn invoke_acked<T: FromRedisValue>(
        &self,
        what: &'static str,
        inv: &ScriptInvocation<'_>,
        ack: ReplicaAck,
        pin: &mut Option<Conn>,
    ) -> Result<(T, u64), BackendError> {
        let value = self
            .run(what, Call::ScriptThenWait(inv, ack), Some(pin))
            .await?;
        <(T, u64)>::from_redis_value(value).map_err(|e| map_error(what, e.into()))
    }

    /// Run a command on a connection pinned by [`Pool::invoke_pinned`], within the timeout.
    pub(crate) async fn query_on<T: FromRedisValue>(
        &self,
        what: &'static str,
        cmd: &redis::Cmd,
        conn: &mut Conn,
    ) -> Result<T, BackendError> {
        match tokio::time::timeout(self.timeout, cmd.query_async::<T>(conn)).await {
            Ok(reply) => reply.map_err(|e| map_error(what, e)),
            Err(_) => Err(self.timed_out(what)),
        }
    }

    fn timed_out(&self, what: &'static str) -> BackendError {
        BackendError::new(
            BackendErrorKind::Timeout,
            format!("redis {what} did not answer within {:?}", self.timeout),
        )
    }

    async fn run(
        &self,
        what: &'static str,
        call: Call<'_, '_>,
        mut pin: Option<&mut Option<Conn>>,
    ) -> Result<Value, BackendError> {
        let mut deadline = Instant::now() + self.timeout;
        if let Call::ScriptThenWait(_, ack) = &call {
            // The primary holds the reply for up to the WAIT timeout by design.
            deadline += ack.timeout;
        }
        // At most twice: again only when the first connection turned out to be closed
        // before the call was sent on it.
        let mut fresh = false;
        loop {
            // A multiplexed connection pipelines: the pooled one goes back at once, and the
            // call runs on a clone (same socket, same command order), so concurrent callers
            // share sockets instead of queueing for one each. A broken socket is retired
            // through the generation, which covers every clone.
            let mut inner = self.conn(what, deadline).await?;
            if let Some(pin) = pin.as_deref_mut() {
                *pin = Some(inner.clone());
            }
            let reply = async {
                match call {
                    Call::Script(inv) => script(inv, None, &mut inner).await,
                    Call::Command(cmd) => cmd.query_async::<Value>(&mut inner).await,
                    Call::ScriptThenWait(inv, ack) => script(inv, Some(ack), &mut inner).await,
                }
            };
            let mut reply = std::pin::pin!(reply);
            // The first poll hands the call to the connection's driver task. A connection
            // whose driver has already ended (the server, a proxy or a `CLIENT KILL` closed
            // it while it sat idle in the pool) refuses it right there, in that same poll:
            // nothing was written, so nothing reached Redis, and the call can go again on
            // a fresh connection without any risk of running twice. A connection that dies
            // after the call was handed over fails later, and that failure is ambiguous:
            // it is reported, never retried here.
            let first = std::future::poll_fn(|cx| Poll::Ready(reply.as_mut().poll(cx))).await;
            let outcome = match first {
                Poll::Ready(Err(e)) if !fresh && e.is_connection_dropped() => {
                    tracing::debug!(what, error = %e, "redis connection closed while idle; the call goes again on a fresh one");
                    // Its siblings idled as long: retire them all.
                    self.invalidate();
                    fresh = true;
                    continue;
                }
                Poll::Ready(reply) => Ok(reply),
                Poll::Pending => tokio::time::timeout_at(deadline, reply).await,
            };
            return match outcome {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(e)) => {
                    // READONLY: the server was demoted to a replica (a Sentinel failover);
                    // reconnecting finds the new primary.
                    if e.is_io_error()
                        || e.is_connection_dropped()
                        || e.is_timeout()
                        || e.code() == Some("READONLY")
                    {
                        self.invalidate();
                    }
                    Err(map_error(what, e))
                }
                Err(_) => {
                    // The connection may be wedged (a paused or partitioned server): retire
                    // it.
                    self.invalidate();
                    Err(self.timed_out(what))
                }
            };
        }
    }

    fn checkout_failed(&self, what: &'static str) -> BackendError {
        let (_, connector) = self.pooled();
        let recent = connector
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

impl bb8::ManageConnection for SharedConnector {
    type Connection = PooledConn;
    type Error = RedisError;

    async fn connect(&self) -> Result<PooledConn, RedisError> {
        self.0.connect().await
    }

    async fn is_valid(&self, conn: &mut PooledConn) -> Result<(), RedisError> {
        if self.0.current(conn) {
            Ok(())
        } else {
            Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "connection retired",
            )))
        }
    }

    fn has_broken(&self, conn: &mut PooledConn) -> bool {
        !self.0.current(conn)
    }
}

/// Run a script (`EVALSHA`), with `WAIT` pipelined right behind it when `ack` is given
/// (then the reply is `[script reply, replicas acknowledged]`).
///
/// Redis answers `NOSCRIPT` for a script it does not have cached (after a restart, or on a
/// replica promoted by a failover: `SCRIPT LOAD` is not replicated). The script call is
/// then sent again behind `SCRIPT LOAD` of every script of the backend, in one pipeline:
/// the pipeline goes where the `EVALSHA` goes (in a cluster, to its keys' slot's node), so
/// the node that lacked the script gets them all in one round trip. (redis-rs's own
/// reload sends `SCRIPT LOAD` to every primary of a cluster, and hangs while one of them
/// is unreachable, which is exactly when promoted replicas lack scripts.)
async fn script(
    inv: &ScriptInvocation<'_>,
    ack: Option<ReplicaAck>,
    conn: &mut Conn,
) -> Result<Value, RedisError> {
    for load in [false, true] {
        let mut pipe = redis::pipe();
        if load {
            for script in super::scripts::all() {
                pipe.load_script(script).ignore();
            }
        }
        pipe.invoke_script(inv);
        if let Some(ack) = ack {
            let timeout_ms = u64::try_from(ack.timeout.as_millis())
                .unwrap_or(u64::MAX)
                .max(1);
            pipe.cmd("WAIT").arg(ack.replicas).arg(timeout_ms);
        }
        // Errors come back as values, so a NOSCRIPT can be told apart below.
        pipe.ignore_errors();
        let mut replies: Vec<Value> = pipe.query_async(conn).await?;
        let wanted = if ack.is_some() { 2 } else { 1 };
        if replies.len() != wanted {
            return Err(RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "script pipeline answered the wrong number of replies",
            )));
        }
        let acked = if ack.is_some() { replies.pop() } else { None };
        let script = replies.pop().expect("one reply per command");
        match script {
            Value::ServerError(e) if e.kind() == Some(redis::ServerErrorKind::NoScript) => {}
            Value::ServerError(e) => return Err(e.into()),
            script => {
                return Ok(match acked {
                    Some(acked) => Value::Array(vec![script, acked.extract_error()?]),
                    None => script,
                });
            }
        }
    }
    Err(RedisError::from((
        redis::ErrorKind::Server(redis::ServerErrorKind::NoScript),
        "script still unknown to the server after loading it",
    )))
}

/// Classify a redis-rs error.
pub(crate) fn map_error(what: &'static str, e: RedisError) -> BackendError {
    let kind = if e.is_timeout() {
        BackendErrorKind::Timeout
    } else if e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.code(),
            Some("BUSY" | "LOADING" | "MASTERDOWN" | "TRYAGAIN" | "CLUSTERDOWN" | "READONLY")
        )
    {
        BackendErrorKind::Unavailable
    } else {
        BackendErrorKind::Protocol
    };
    BackendError::new(kind, format!("redis {what} failed")).with_source(e)
}
