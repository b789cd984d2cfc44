//! [`Commands`]: every Redis call of the backend, with its timeout, over the command
//! connections of one server ([`ServerPool`](super::pool::ServerPool)) or of a cluster.
//!
//! A call gets a connection from its [`Connections`], runs on it (a script is sent as
//! `EVALSHA`, reloaded on `NOSCRIPT`; `WAIT` may follow it in the same round trip), and
//! retires the connections a connection-level failure may have broken.

use std::{sync::Arc, task::Poll, time::Duration};

use redis::{FromRedisValue, RedisError, Value, aio::ConnectionLike};
use tokio::time::Instant;

pub(crate) use super::conn::Conn;
pub(crate) use super::script_call::ScriptCall;
use super::{server_checks::Deferred, session::Watch};
use crate::{BackendError, BackendErrorKind, BoxFuture};

/// Where the connection of each call comes from: a pool of connections to one server, or
/// a cluster connection (redis-rs routes each command to the primary of its keys' slot,
/// follows `MOVED` and reconnects by itself, so there is nothing to pool).
pub(crate) trait Connections: Send + Sync {
    /// A connection for one call, within `deadline`.
    fn get<'a>(
        &'a self,
        what: &'static str,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<Conn, BackendError>>;

    /// After a connection-level failure: retire the connections it may have broken (a
    /// cluster connection repairs itself).
    fn retire(&self);
}

/// Where [`Commands`] gets its connections: one server's pool, called directly (every call
/// takes a connection, and a boxed future per call would cost an allocation), or another
/// [`Connections`] (a cluster).
enum Source {
    Server(super::pool::ServerPool),
    #[cfg_attr(not(feature = "redis-cluster"), allow(dead_code))]
    Other(Box<dyn Connections>),
}

impl Source {
    async fn get(&self, what: &'static str, deadline: Instant) -> Result<Conn, BackendError> {
        match self {
            Self::Server(pool) => pool.conn(what, deadline).await,
            Self::Other(connections) => connections.get(what, deadline).await,
        }
    }

    fn retire(&self) {
        match self {
            Self::Server(pool) => pool.retire(),
            Self::Other(connections) => connections.retire(),
        }
    }
}

/// Every call of the backend goes through [`Commands::invoke`] (or its siblings): the
/// command connections plus the command timeout.
pub(crate) struct Commands {
    connections: Source,
    timeout: Duration,
    /// The server checks of a backend built before its server answered: every call waits
    /// for them to pass (see [`Deferred`]).
    checks: Option<Deferred>,
    /// The session watch: no call goes out while it is down (see [`Watch`]).
    watch: Option<Arc<Watch>>,
}

#[derive(Clone, Copy)]
enum Call<'a> {
    Script(&'a ScriptCall),
    /// A plain command: for reads that need no script (a script call costs the server
    /// several times a plain command's time). It may be sent twice (see [`Call::repeatable`]).
    Command(&'a redis::Cmd),
    /// The script with `WAIT` pipelined right behind it (see [`Commands::invoke_acked`]).
    ScriptThenWait(&'a ScriptCall, ReplicaAck),
}

impl Call<'_> {
    /// Whether running the call twice is harmless (see [`ScriptCall::repeatable`]); plain
    /// commands are reads, the server checks' probes and a record's `DEL` (which, run
    /// twice, deletes once and answers as if the record was gone already).
    fn repeatable(&self) -> bool {
        match self {
            Self::Script(inv) | Self::ScriptThenWait(inv, _) => inv.repeatable,
            Self::Command(_) => true,
        }
    }
}

/// `WAIT replicas timeout`: how many replicas must acknowledge a write, and how long the
/// primary waits for them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReplicaAck {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
}

impl Commands {
    /// Calls over one server's `pool`, each within `timeout`.
    pub(crate) fn server(pool: super::pool::ServerPool, timeout: Duration) -> Self {
        Self {
            connections: Source::Server(pool),
            timeout,
            checks: None,
            watch: None,
        }
    }

    // The way in for connections of another kind: only the cluster backend has one.
    #[cfg_attr(not(feature = "redis-cluster"), allow(dead_code))]
    /// Calls over `connections` of another kind, each within `timeout`.
    pub(crate) fn new(connections: impl Connections + 'static, timeout: Duration) -> Self {
        Self {
            connections: Source::Other(Box::new(connections)),
            timeout,
            checks: None,
            watch: None,
        }
    }

    /// Run `checks` before the first call that reaches the server, and let no call through
    /// until they pass (for a backend built before its server answered).
    pub(crate) fn defer_checks(&mut self, checks: Deferred) {
        self.checks = Some(checks);
    }

    /// Let no call go out while `watch` is down.
    pub(crate) fn watched_by(&mut self, watch: Arc<Watch>) {
        self.watch = Some(watch);
    }

    /// The connector of one server's connections (none for a cluster).
    pub(crate) fn connector(&self) -> Option<Arc<super::connector::Connector>> {
        match &self.connections {
            Source::Server(pool) => Some(pool.connector().clone()),
            Source::Other(_) => None,
        }
    }

    /// The command timeout.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Load scripts into the server's cache (also proves the server answers).
    pub(crate) async fn load(&self, scripts: &[&redis::Script]) -> Result<(), BackendError> {
        let deadline = Instant::now() + self.timeout;
        // In a cluster, redis-rs sends SCRIPT LOAD to every primary.
        let mut conn = self.connections.get("SCRIPT LOAD", deadline).await?;
        let load = async {
            for script in scripts {
                script.load_async(&mut conn).await?;
            }
            Ok::<_, RedisError>(())
        };
        match tokio::time::timeout_at(deadline, load).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(map_error("SCRIPT LOAD", e)),
            Err(_) => Err(timed_out("SCRIPT LOAD", self.timeout)),
        }
    }

    /// Run a script within the command timeout (connection check-out included).
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        what: &'static str,
        inv: &ScriptCall,
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

    /// [`query`](Self::query), ahead of any deferred server checks: for the checks' own
    /// commands.
    pub(crate) async fn query_unchecked<T: FromRedisValue>(
        &self,
        what: &'static str,
        cmd: &redis::Cmd,
    ) -> Result<T, BackendError> {
        let deadline = Instant::now() + self.timeout;
        let value = self
            .run_at(what, Call::Command(cmd), None, deadline)
            .await?;
        T::from_redis_value(value).map_err(|e| map_error(what, e.into()))
    }

    /// Like [`Commands::invoke`], but first stores a handle on the connection the script is
    /// sent on in `pin`. Commands sent later on that handle run after this one on the
    /// server, whatever happens to its reply: that is how an acquire whose reply is lost
    /// gets released without racing ahead of it.
    pub(crate) async fn invoke_pinned<T: FromRedisValue>(
        &self,
        what: &'static str,
        inv: &ScriptCall,
        pin: &mut Option<Conn>,
    ) -> Result<T, BackendError> {
        let value = self.run(what, Call::Script(inv), Some(pin)).await?;
        T::from_redis_value(value).map_err(|e| map_error(what, e.into()))
    }

    /// Like [`Commands::invoke_pinned`], with `WAIT` pipelined right behind the script on the
    /// same connection: one round trip, and `WAIT` covers exactly the writes of this
    /// script (Redis refuses `WAIT` inside a script). Returns the script's reply and how
    /// many replicas acknowledged. The call may take the command timeout plus the `WAIT`
    /// timeout.
    pub(crate) async fn invoke_acked<T: FromRedisValue>(
        &self,
        what: &'static str,
        inv: &ScriptCall,
        ack: ReplicaAck,
        pin: &mut Option<Conn>,
    ) -> Result<(T, u64), BackendError> {
        let value = self
            .run(what, Call::ScriptThenWait(inv, ack), Some(pin))
            .await?;
        <(T, u64)>::from_redis_value(value).map_err(|e| map_error(what, e.into()))
    }

    /// Run a command on a connection pinned by [`Commands::invoke_pinned`], within the timeout.
    pub(crate) async fn query_on<T: FromRedisValue>(
        &self,
        what: &'static str,
        cmd: &redis::Cmd,
        conn: &mut Conn,
    ) -> Result<T, BackendError> {
        match tokio::time::timeout(self.timeout, cmd.query_async::<T>(conn)).await {
            Ok(reply) => reply.map_err(|e| map_error(what, e)),
            Err(_) => Err(timed_out(what, self.timeout)),
        }
    }

    async fn run(
        &self,
        what: &'static str,
        call: Call<'_>,
        pin: Option<&mut Option<Conn>>,
    ) -> Result<Value, BackendError> {
        let mut deadline = Instant::now() + self.timeout;
        if let Call::ScriptThenWait(_, ack) = &call {
            // The primary holds the reply for up to the WAIT timeout by design.
            deadline += ack.timeout;
        }
        // Its timeouts (this one and redis-rs's) wake no parked worker of this runtime.
        crate::armed::call_with_timeout(self.timeout);
        // Nothing is granted unwatched: a lease the watch never saw could outlive, unseen,
        // the server that granted it.
        if let Some(watch) = &self.watch {
            watch.up(what, deadline).await?;
        }
        // Nothing is granted by a server the checks have not vouched for.
        if let Some(checks) = &self.checks {
            checks.passed(self, deadline).await?;
        }
        self.run_at(what, call, pin, deadline).await
    }

    async fn run_at(
        &self,
        what: &'static str,
        call: Call<'_>,
        mut pin: Option<&mut Option<Conn>>,
        deadline: Instant,
    ) -> Result<Value, BackendError> {
        // At most twice: again only when the first connection turned out to be closed
        // before the call was sent on it.
        let mut fresh = false;
        loop {
            // A multiplexed connection pipelines: the pooled one goes back at once, and the
            // call runs on a clone (same socket, same command order), so concurrent callers
            // share sockets instead of queueing for one each. A broken socket is retired
            // through the generation, which covers every clone.
            let mut inner = self.connections.get(what, deadline).await?;
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
                    self.connections.retire();
                    fresh = true;
                    continue;
                }
                Poll::Ready(reply) => Ok(reply),
                Poll::Pending => tokio::time::timeout_at(deadline, reply).await,
            };
            return match outcome {
                Ok(Ok(v)) => Ok(v),
                // The connection ended after the call was handed to it. Most often the
                // server had closed it while idle and its driver, on a runtime too busy to
                // read the close first, wrote the call to a closed socket (`broken pipe`):
                // the server never read it. That cannot be told from a server that died
                // after reading it, so only a call that may run twice goes again, once.
                Ok(Err(e)) if !fresh && e.is_connection_dropped() && call.repeatable() => {
                    tracing::debug!(what, error = %e, "redis connection ended under a call; a call that may run twice goes again on a fresh one");
                    self.connections.retire();
                    fresh = true;
                    // The end may be the server's (killed, restarted): nothing goes out
                    // unwatched, the second time either.
                    if let Some(watch) = &self.watch {
                        watch.up(what, deadline).await?;
                    }
                    continue;
                }
                Ok(Err(e)) => {
                    // READONLY: the server was demoted to a replica (a Sentinel failover);
                    // reconnecting finds the new primary.
                    if e.is_io_error()
                        || e.is_connection_dropped()
                        || e.is_timeout()
                        || e.code() == Some("READONLY")
                    {
                        self.connections.retire();
                    }
                    Err(map_error(what, e))
                }
                Err(_) => {
                    // The connection may be wedged (a paused or partitioned server): retire
                    // it.
                    self.connections.retire();
                    Err(timed_out(what, self.timeout))
                }
            };
        }
    }
}

/// The error of a call that did not answer within `timeout`.
pub(crate) fn timed_out(what: &'static str, timeout: Duration) -> BackendError {
    BackendError::new(
        BackendErrorKind::Timeout,
        format!("redis {what} did not answer within {timeout:?}"),
    )
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
    call: &ScriptCall,
    ack: Option<ReplicaAck>,
    conn: &mut Conn,
) -> Result<Value, RedisError> {
    if ack.is_none() {
        // The common case: the one command, no pipeline around it.
        match conn.req_packed_command(&call.cmd).await {
            Ok(Value::ServerError(e)) if e.kind() == Some(redis::ServerErrorKind::NoScript) => {}
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {}
            Ok(Value::ServerError(e)) => return Err(e.into()),
            reply => return reply,
        }
    }
    // Without WAIT, the command alone has met NOSCRIPT already: the loading pipeline only.
    let loads: &[bool] = if ack.is_none() {
        &[true]
    } else {
        &[false, true]
    };
    for &load in loads {
        let mut pipe = redis::pipe();
        if load {
            for script in super::scripts::all() {
                pipe.load_script(script).ignore();
            }
        }
        pipe.add_command(call.cmd.clone());
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
    // The server's "not now": the command did not run (a refusal, not an ambiguity).
    let refusal = matches!(
        e.code(),
        Some("BUSY" | "LOADING" | "MASTERDOWN" | "TRYAGAIN" | "CLUSTERDOWN" | "READONLY")
    );
    let kind = if e.is_timeout() {
        BackendErrorKind::Timeout
    } else if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || refusal {
        BackendErrorKind::Unavailable
    } else {
        BackendErrorKind::Protocol
    };
    let e_code = e.code().map(str::to_owned);
    let e_code = e_code.as_deref();
    let error = BackendError::new(kind, format!("redis {what} failed")).with_source(e);
    match e_code {
        Some("BUSY") => error.busy(),
        _ if refusal => error.refused(),
        _ => error,
    }
}
