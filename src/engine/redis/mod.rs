//! The Redis backend: leases shared by every node talking to one Redis.
//!
//! ```no_run
//! use std::time::Duration;
//! use tower_lock::{LockEngine, engine::redis::RedisBackend};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let backend = RedisBackend::builder("redis://127.0.0.1:6379")
//!     .prefix("tower-lock")
//!     .command_timeout(Duration::from_millis(500))
//!     .pool_size(16)
//!     .build()
//!     .await?;
//! let engine = LockEngine::new(backend);
//! let lease = engine.lock("invoice:42").wait(Duration::from_secs(2)).acquire().await?;
//! println!("fence {}", lease.fence());
//! lease.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # How it works
//!
//! Every operation is one Lua script (see `scripts.rs`), run with `EVALSHA` over a bb8 pool
//! of multiplexed connections, each call bounded by the command timeout. Waiters do not
//! poll: a failed try returns the holder's remaining TTL, the waiter subscribes to the
//! key's wake-up channel (one subscriber connection per backend, reference counted per
//! key), retries once the subscription is confirmed (skipped when the channel was already
//! subscribed before the failed try and no message came since: then no release went
//! unheard), then sleeps until a release message
//! or a fallback timer of `min(remaining TTL, 250 ms)`, so a lost message costs at most a
//! quarter second, never a lease TTL. A release wakes one waiter per node (in FIFO mode,
//! only the queue head).
//!
//! # Key layout
//!
//! For a lock key `K` under prefix `P`, with `T` the 16 hex digits of the FNV-1a 64-bit
//! hash of `K`:
//!
//! | Redis key / channel   | Type   | Lifetime                                          |
//! |-----------------------|--------|---------------------------------------------------|
//! | `P:{T}:lock:K`        | hash   | `t` = owner token, `f` = fence; the lease TTL     |
//! | `P:{T}:fence:K`       | string | last fence granted; lease TTL + 10 s, 10 s after release (the tombstone) |
//! | `P:{T}:queue:K`       | zset   | FIFO tickets by arrival; exists only while FIFO waiters wait, expires one ticket TTL after the last refresh |
//! | `P:{T}:wait:K`        | zset   | every waiter's ticket by deadline (counts waiters on all nodes, enforces `max_waiters`); exists only while someone waits, same expiry |
//! | `P:{T}:wake:K`        | channel| release notifications (payload: FIFO head ticket, or empty) |
//! | `P:{T}:num:K`         | string | a numeric value of [`NumericKey`](crate::engine::NumericKey); the user's data, with the TTL they give |
//! | `P:{T}:pool:K`        | hash   | a [`LockPool`](crate::engine::LockPool): member key → its `lock` key; the user's data, until cleared |
//!
//! The hash tag `{T}` is chosen by the engine, so every key of one lock lands in one
//! Cluster slot and nothing in `K` (braces included) can steer it: Redis uses the first
//! `{…}`, and the prefix may not contain braces. The kind word sits before `K`, so user
//! key material can never spell another lock's key or one of the engine's own. Lock keys
//! are at most 512 bytes and prefixes at most 64, so every Redis key stays under 610 bytes.
//! When nothing holds or waits for a key, only the fence tombstone remains, and it expires.
//!
//! # Fencing
//!
//! A fence is `max(last fence + 1, Redis server time in µs)`. The last fence lives in the
//! tombstone, which outlives the lease by 10 s, so fences strictly increase per key without
//! a permanent key per lock name. Fences go backwards only if the Redis server clock steps
//! back by more than those 10 s (or the server loses its data): keep the server on NTP with
//! slewing, and on a failover use replicas whose clocks agree.
//! The acquire script writes the tombstone with `SET … GET`, so the backend needs Redis 6.2
//! or later.
//!
//! # Failures
//!
//! Every call is bounded by the command timeout and fails with [`LockError::Backend`]. An
//! acquire whose reply is lost (timeout, dropped connection, dropped future) is released by
//! its token in a spawned task, so a grant nobody saw cannot block others for a TTL. That
//! release is sent on the very connection the acquire went out on, so it cannot overtake
//! it. (With a caller-supplied token that already held the key, this also ends the earlier
//! acquisition; its lease then reports lost.) Waiters refresh their tickets with every
//! retry (at least every 250 ms); a dead waiter's ticket lapses by the server clock after
//! the ticket TTL: 3 s, or three times (command timeout + 250 ms) if that is longer. After a Redis restart the same
//! backend reconnects by itself: stale pooled connections are retired, and the subscriber
//! reconnects, resubscribes and wakes every local waiter.
//!
//! Redis Cluster: all keys of a lock share a slot, but the backend uses a standalone
//! client and plain `PUBLISH`; the batched renewal touches several locks per script.

mod pool;
mod scripts;
mod wakeup;

use std::{fmt, sync::Arc, time::Duration};

use redis::{ScriptInvocation, aio::MultiplexedConnection};
use tokio::time::Instant;

use self::{
    pool::{Connector, Pool},
    scripts::{
        ACQUIRE, ADMIN_SET, COMPARE_AND_SET, EXTEND, FORCE_RELEASE, HOLDER, LEAVE, LEAVE_SOURCE,
        NUMERIC_GET, POOL_HOLDERS, POOL_MEMBERS, POOL_MODIFY, RELEASE, RENEW, WAITERS,
    },
    wakeup::Wakeup,
};
use super::{
    AcquireRequest, Backend, BoxFuture, ExtendMode, Fence, Grant, Holder, LockError, LockKey,
    NumericAction, NumericOp, PoolHolders, PoolOp, Renewal, Token,
};
use crate::error::{BackendError, BackendErrorKind};

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "tower-lock";
/// The longest prefix accepted, in bytes.
pub const MAX_PREFIX_LEN: usize = 64;
/// Waiters retry at least this often, whatever the pub/sub connection does.
const FALLBACK_CAP: Duration = Duration::from_millis(250);
/// How much longer than the lease the fence tombstone lives.
const FENCE_MARGIN: Duration = Duration::from_secs(10);
/// Leases renewed per script call.
const RENEW_CHUNK: usize = 256;

/// Builds a [`RedisBackend`]; see [`RedisBackend::builder`].
#[derive(Clone, Debug)]
pub struct RedisBackendBuilder {
    url: String,
    prefix: String,
    command_timeout: Duration,
    pool_size: u32,
}

impl RedisBackendBuilder {
    /// The namespace of every Redis key and channel (default `"tower-lock"`): 1 to
    /// [`MAX_PREFIX_LEN`] bytes, no `{`, `}` or control characters.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The limit on every Redis call, connection check-out included (default 500 ms).
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// How many multiplexed connections the pool keeps at most (default 16).
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = size;
        self
    }

    /// Validate the configuration, connect, and check that the server answers.
    ///
    /// Fails with a [`BackendErrorKind::Config`] error for a bad URL, prefix, pool size or
    /// timeout, and with `Unavailable` / `Timeout` when the server cannot be reached.
    pub async fn build(self) -> Result<RedisBackend, BackendError> {
        let config = |msg: String| BackendError::new(BackendErrorKind::Config, msg);
        if self.prefix.is_empty()
            || self.prefix.len() > MAX_PREFIX_LEN
            || self
                .prefix
                .chars()
                .any(|c| c == '{' || c == '}' || c.is_control())
        {
            return Err(config(format!(
                "redis key prefix {:?} must be 1 to {MAX_PREFIX_LEN} bytes without braces or control characters",
                self.prefix
            )));
        }
        if self.pool_size == 0 {
            return Err(config("redis pool size must be at least 1".into()));
        }
        if self.command_timeout.is_zero() {
            return Err(config("redis command timeout must be positive".into()));
        }
        let client = redis::Client::open(self.url.as_str())
            .map_err(|e| config("invalid redis URL".into()).with_source(e))?;
        let connector = Arc::new(Connector::new(client.clone(), self.command_timeout));
        let pool = Pool::new(connector.clone(), self.pool_size, self.command_timeout);
        // Load the scripts now, so first calls are one EVALSHA each (after a server restart
        // redis-rs reloads them on NOSCRIPT).
        pool.load(&scripts::all()).await?;
        let ticket_ttl = (3 * (self.command_timeout + FALLBACK_CAP)).max(Duration::from_secs(3));
        Ok(RedisBackend {
            inner: Arc::new(Inner {
                wakeup: Wakeup::new(client, connector, self.command_timeout),
                pool,
                prefix: self.prefix,
                ticket_ttl_ms: millis(ticket_ttl),
            }),
        })
    }
}

/// The Redis backend: see the [module docs](self) for the key layout, the scripts and the
/// failure behaviour. Cheap to clone; clones share the pool and the subscriber.
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    wakeup: Wakeup,
    prefix: String,
    ticket_ttl_ms: u64,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("prefix", &self.inner.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// A builder for `url` (`redis://host:port/db`, `rediss://…` with TLS where enabled).
    pub fn builder(url: impl Into<String>) -> RedisBackendBuilder {
        RedisBackendBuilder {
            url: url.into(),
            prefix: DEFAULT_PREFIX.to_owned(),
            command_timeout: Duration::from_millis(500),
            pool_size: 16,
        }
    }

    /// Connect with the defaults: prefix `"tower-lock"`, 500 ms timeout, 16 connections.
    pub async fn connect(url: impl Into<String>) -> Result<RedisBackend, BackendError> {
        Self::builder(url).build().await
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }
}

/// The Redis names of one lock.
struct Names {
    lock: String,
    fence: String,
    queue: String,
    wait: String,
    channel: String,
}

impl Names {
    fn new(prefix: &str, key: &LockKey) -> Self {
        let base = tagged_base(prefix, key);
        let key = key.as_str();
        let name = |kind: &str| format!("{base}{kind}:{key}");
        Names {
            lock: name("lock"),
            fence: name("fence"),
            queue: name("queue"),
            wait: name("wait"),
            channel: name("wake"),
        }
    }
}

/// `P:{T}:`, the start of every Redis name of `key`: the prefix and the engine's hash tag.
fn tagged_base(prefix: &str, key: &LockKey) -> String {
    format!("{prefix}:{{{:016x}}}:", fnv1a(key.as_str().as_bytes()))
}

/// The Redis name of one kind of object of `key` (`lock`, `num`, `pool`, ...), laid out
/// as [`Names`] lays out a lock's.
fn object_name(prefix: &str, kind: &str, key: &LockKey) -> String {
    format!("{}{kind}:{}", tagged_base(prefix, key), key.as_str())
}

fn malformed_member(e: super::KeyError) -> LockError {
    LockError::Backend(
        BackendError::new(
            BackendErrorKind::Protocol,
            "stored pool member is malformed",
        )
        .with_source(e),
    )
}

fn malformed_token(e: super::KeyError) -> LockError {
    LockError::Backend(
        BackendError::new(BackendErrorKind::Protocol, "stored token is malformed").with_source(e),
    )
}

/// FNV-1a, 64 bits: stable across processes and versions (unlike `std`'s hasher), which
/// the hash tag needs; it only spreads keys over slots, so it need not be cryptographic.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Milliseconds, rounded up, at least 1: a lease is never shorter on the server than asked.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000))
        .unwrap_or(u64::MAX)
        .max(1)
}

/// A remaining TTL reported by a script (`< 0`: none).
fn remaining(pttl: i64) -> Option<Duration> {
    u64::try_from(pttl).ok().map(Duration::from_millis)
}

enum Attempt {
    Granted(Grant),
    Busy(Option<Duration>),
    Full(Option<Duration>),
}

/// Cleans up after an acquire that ends without handing its outcome to the caller: removes
/// its ticket and, if a call was in flight (its grant may have landed unseen), releases by
/// token. Runs as a spawned task, so dropping the acquire future never blocks.
struct Cleanup {
    inner: Arc<Inner>,
    names: Arc<Names>,
    ticket: String,
    token: Token,
    armed: bool,
    in_flight: bool,
    /// The connection the last attempt went out on: the release must follow it there.
    pinned: Option<MultiplexedConnection>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if !self.armed || (self.ticket.is_empty() && !self.in_flight) {
            return;
        }
        let inner = self.inner.clone();
        let names = self.names.clone();
        let ticket = std::mem::take(&mut self.ticket);
        let token = self.token.clone();
        let release = self.in_flight;
        let pinned = if release { self.pinned.take() } else { None };
        // On the engine's runtime: the clean-up must not depend on the caller's.
        crate::engine::background::handle().spawn(async move {
            if let Err(error) = inner.leave(&names, &ticket, &token, release, pinned).await {
                tracing::debug!(%error, "lock waiter cleanup failed; its ticket will expire");
            }
        });
    }
}

impl Inner {
    async fn call<T: redis::FromRedisValue>(
        &self,
        what: &'static str,
        inv: &ScriptInvocation<'_>,
    ) -> Result<T, LockError> {
        self.pool
            .invoke(what, inv)
            .await
            .map_err(LockError::Backend)
    }

    async fn attempt(
        &self,
        names: &Names,
        req: &AcquireRequest,
        ticket: &str,
        registered: bool,
        pin: &mut Option<MultiplexedConnection>,
    ) -> Result<Attempt, LockError> {
        let mut inv = ACQUIRE.prepare_invoke();
        inv.key(&names.lock)
            .key(&names.fence)
            .key(&names.queue)
            .key(&names.wait)
            .arg(req.token.as_str())
            .arg(millis(req.ttl))
            .arg(ticket)
            .arg(if req.fifo { "1" } else { "0" })
            .arg(
                req.max_waiters
                    .map_or(-1, |m| i64::try_from(m).unwrap_or(i64::MAX)),
            )
            .arg(self.ticket_ttl_ms)
            .arg(millis(FENCE_MARGIN))
            .arg(if registered { "1" } else { "0" });
        // Taken before sending: the TTL cannot have started on the server any earlier.
        let sent = Instant::now();
        let (status, value): (i64, i64) = self
            .pool
            .invoke_pinned("acquire", &inv, pin)
            .await
            .map_err(LockError::Backend)?;
        Ok(match status {
            1 => Attempt::Granted(Grant::new(
                Fence::new(u64::try_from(value).unwrap_or(0)),
                sent,
            )),
            0 => Attempt::Busy(remaining(value)),
            2 => Attempt::Full(remaining(value)),
            other => {
                return Err(LockError::Backend(BackendError::new(
                    BackendErrorKind::Protocol,
                    format!("acquire script answered status {other}"),
                )));
            }
        })
    }

    async fn leave(
        &self,
        names: &Names,
        ticket: &str,
        token: &Token,
        release: bool,
        pinned: Option<MultiplexedConnection>,
    ) -> Result<Option<Duration>, LockError> {
        let keys = [&names.lock, &names.fence, &names.queue, &names.wait];
        let release = if release { "1" } else { "0" };
        let fence_margin = millis(FENCE_MARGIN).to_string();
        let args = [
            ticket,
            token.as_str(),
            release,
            &names.channel,
            &fence_margin,
        ];
        if let Some(mut conn) = pinned {
            // Behind the unseen acquire on its own connection, so it cannot overtake it.
            let mut eval = redis::cmd("EVAL");
            eval.arg(LEAVE_SOURCE.as_str())
                .arg(keys.len())
                .arg(&keys)
                .arg(&args);
            match self.pool.query_on::<i64>("leave", &eval, &mut conn).await {
                Ok(pttl) => return Ok(remaining(pttl)),
                // That connection is gone, and with it anything still unsent on it.
                Err(e) if e.kind() == BackendErrorKind::Unavailable => {}
                Err(e) => return Err(LockError::Backend(e)),
            }
        }
        let mut inv = LEAVE.prepare_invoke();
        inv.key(&keys).arg(&args);
        let pttl: i64 = self.call("leave", &inv).await?;
        Ok(remaining(pttl))
    }

    async fn acquire(self: Arc<Self>, req: AcquireRequest) -> Result<Grant, LockError> {
        let started = Instant::now();
        let deadline = req.wait.map(|w| started + w);
        let waiting = req.wait != Some(Duration::ZERO);
        let names = Arc::new(Names::new(&self.prefix, &req.key));
        let ticket = if waiting {
            format!("{:032x}", rand::random::<u128>())
        } else {
            String::new()
        };
        let mut cleanup = Cleanup {
            inner: self.clone(),
            names: names.clone(),
            ticket: ticket.clone(),
            token: req.token.clone(),
            armed: true,
            in_flight: false,
            pinned: None,
        };
        let mut subscription = None;
        // Whether an earlier attempt may have registered the ticket.
        let mut registered = false;
        loop {
            // Where the wake-up channel stands before this attempt goes out (see `covered`).
            let mark = match &subscription {
                None if waiting => self.wakeup.mark(&names.channel),
                _ => None,
            };
            cleanup.in_flight = true;
            // On error the cleanup stays armed with `in_flight`: the grant may have landed.
            let outcome = self
                .attempt(&names, &req, &ticket, registered, &mut cleanup.pinned)
                .await?;
            cleanup.in_flight = false;
            cleanup.pinned = None;
            let retry_after = match outcome {
                Attempt::Granted(grant) => {
                    cleanup.armed = false;
                    return Ok(grant);
                }
                Attempt::Full(retry_after) => {
                    // Nothing was registered by this call; an earlier registration expired.
                    cleanup.armed = false;
                    return Err(LockError::QueueFull { retry_after });
                }
                Attempt::Busy(retry_after) if !waiting => {
                    cleanup.armed = false;
                    return Err(LockError::Busy { retry_after });
                }
                Attempt::Busy(retry_after) => {
                    registered = true;
                    retry_after
                }
            };
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                let left = self.leave(&names, &ticket, &req.token, false, None).await;
                let retry_after = match left {
                    Ok(left) => {
                        cleanup.armed = false;
                        left.or(retry_after)
                    }
                    Err(_) => retry_after,
                };
                return Err(LockError::TimedOut {
                    waited: started.elapsed(),
                    retry_after,
                });
            }
            let fallback = retry_after
                .map_or(FALLBACK_CAP, |r| r.min(FALLBACK_CAP))
                .max(Duration::from_millis(1));
            let wake_at = deadline.map_or(now + fallback, |d| d.min(now + fallback));
            match &subscription {
                None => {
                    let sub = self.wakeup.subscribe(
                        &names.channel,
                        req.fifo.then_some(ticket.as_str()),
                        mark,
                    );
                    if sub.covered() {
                        // Subscribed since before the attempt and nothing heard since: no
                        // release went unheard, so wait for one like any later turn.
                        tokio::select! {
                            _ = sub.woken() => {}
                            _ = tokio::time::sleep_until(wake_at) => {}
                        }
                    } else {
                        // Retry once the subscription is confirmed: a release before it
                        // was unheard, one after it will be heard.
                        tokio::select! {
                            _ = sub.confirmed() => {}
                            _ = tokio::time::sleep_until(wake_at) => {}
                        }
                    }
                    subscription = Some(sub);
                }
                Some(sub) => {
                    tokio::select! {
                        _ = sub.woken() => {}
                        _ = tokio::time::sleep_until(wake_at) => {}
                    }
                }
            }
        }
    }
}

fn outcome(code: i64) -> Result<(), LockError> {
    match code {
        -1 => Err(LockError::NotOwned),
        -2 | 0 => Err(LockError::Expired),
        _ => Ok(()),
    }
}

impl Backend for RedisBackend {
    fn acquire(&self, req: AcquireRequest) -> BoxFuture<'_, Result<Grant, LockError>> {
        Box::pin(self.inner.clone().acquire(req))
    }

    fn release<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(async move {
            let names = Names::new(&self.inner.prefix, key);
            let mut inv = RELEASE.prepare_invoke();
            inv.key(&names.lock)
                .key(&names.fence)
                .key(&names.queue)
                .key(&names.wait)
                .arg(token.as_str())
                .arg(&names.channel)
                .arg(millis(FENCE_MARGIN));
            outcome(self.inner.call("release", &inv).await?)
        })
    }

    fn extend<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        ttl: Duration,
        mode: ExtendMode,
    ) -> BoxFuture<'a, Result<Duration, LockError>> {
        Box::pin(async move {
            let names = Names::new(&self.inner.prefix, key);
            let mut inv = EXTEND.prepare_invoke();
            inv.key(&names.lock)
                .key(&names.fence)
                .arg(token.as_str())
                .arg(millis(ttl))
                .arg(match mode {
                    ExtendMode::Add => "add",
                    ExtendMode::Replace => "replace",
                })
                .arg(millis(FENCE_MARGIN));
            let left: i64 = self.inner.call("extend", &inv).await?;
            outcome(left)?;
            Ok(Duration::from_millis(u64::try_from(left).unwrap_or(1)))
        })
    }

    fn renew<'a>(&'a self, leases: &'a [Renewal]) -> BoxFuture<'a, Result<Vec<bool>, LockError>> {
        Box::pin(async move {
            let mut renewed = Vec::with_capacity(leases.len());
            for chunk in leases.chunks(RENEW_CHUNK) {
                let mut inv = RENEW.prepare_invoke();
                inv.arg(millis(FENCE_MARGIN));
                for lease in chunk {
                    let names = Names::new(&self.inner.prefix, &lease.key);
                    inv.key(names.lock)
                        .key(names.fence)
                        .arg(lease.token.as_str())
                        .arg(millis(lease.ttl));
                }
                let results: Vec<i64> = self.inner.call("renew", &inv).await?;
                if results.len() != chunk.len() {
                    return Err(LockError::Backend(BackendError::new(
                        BackendErrorKind::Protocol,
                        "renew script answered the wrong number of results",
                    )));
                }
                renewed.extend(results.into_iter().map(|r| r == 1));
            }
            Ok(renewed)
        })
    }

    fn holder<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<Option<Holder>, LockError>> {
        Box::pin(async move {
            let names = Names::new(&self.inner.prefix, key);
            let mut inv = HOLDER.prepare_invoke();
            inv.key(&names.lock);
            let (token, pttl): (String, i64) = self.inner.call("holder", &inv).await?;
            if token.is_empty() {
                return Ok(None);
            }
            let token = Token::new(&token).map_err(malformed_token)?;
            Ok(Some(Holder::new(token, remaining(pttl))))
        })
    }

    fn waiters<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<usize, LockError>> {
        Box::pin(async move {
            let names = Names::new(&self.inner.prefix, key);
            let mut inv = WAITERS.prepare_invoke();
            inv.key(&names.wait);
            let n: i64 = self.inner.call("waiters", &inv).await?;
            Ok(usize::try_from(n).unwrap_or(0))
        })
    }

    fn admin_set<'a>(
        &'a self,
        key: &'a LockKey,
        value: &'a Token,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(async move {
            let names = Names::new(&self.inner.prefix, key);
            let mut inv = ADMIN_SET.prepare_invoke();
            inv.key(&names.lock)
                .key(&names.fence)
                .arg(value.as_str())
                .arg(ttl.map_or(-1, |t| i64::try_from(millis(t)).unwrap_or(i64::MAX)))
                .arg(millis(FENCE_MARGIN));
            let _fence: String = self.inner.call("admin set", &inv).await?;
            Ok(())
        })
    }

    fn force_release<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<bool, LockError>> {
        Box::pin(async move {
            let names = Names::new(&self.inner.prefix, key);
            let mut inv = FORCE_RELEASE.prepare_invoke();
            inv.key(&names.lock)
                .key(&names.fence)
                .key(&names.queue)
                .key(&names.wait)
                .arg(&names.channel)
                .arg(millis(FENCE_MARGIN));
            let was_held: i64 = self.inner.call("force release", &inv).await?;
            Ok(was_held == 1)
        })
    }

    fn compare_and_set<'a>(
        &'a self,
        key: &'a LockKey,
        op: &'a NumericOp,
    ) -> BoxFuture<'a, Result<bool, LockError>> {
        Box::pin(async move {
            let name = object_name(&self.inner.prefix, "num", key);
            let (action, ttl) = match op.action {
                NumericAction::Set { ttl } => (
                    "set",
                    ttl.map_or(-1, |t| i64::try_from(millis(t)).unwrap_or(i64::MAX)),
                ),
                NumericAction::Delete => ("del", -1),
            };
            let mut inv = COMPARE_AND_SET.prepare_invoke();
            // `{:e}` is the shortest text that reads back as the same f64, in Lua and Rust.
            inv.key(&name)
                .arg(op.compare.as_str())
                .arg(format!("{:e}", op.value))
                .arg(format!("{:e}", op.epsilon))
                .arg(action)
                .arg(ttl);
            let applied: i64 = self.inner.call("compare and set", &inv).await?;
            Ok(applied == 1)
        })
    }

    fn numeric_get<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<f64>, LockError>> {
        Box::pin(async move {
            let name = object_name(&self.inner.prefix, "num", key);
            let mut inv = NUMERIC_GET.prepare_invoke();
            inv.key(&name);
            let text: Option<String> = self.inner.call("numeric get", &inv).await?;
            text.map(|t| {
                t.parse::<f64>().map_err(|e| {
                    LockError::Backend(
                        BackendError::new(
                            BackendErrorKind::Protocol,
                            "stored value is not a number",
                        )
                        .with_source(e),
                    )
                })
            })
            .transpose()
        })
    }

    fn pool_modify<'a>(
        &'a self,
        pool: &'a LockKey,
        op: &'a PoolOp,
    ) -> BoxFuture<'a, Result<usize, LockError>> {
        Box::pin(async move {
            let name = object_name(&self.inner.prefix, "pool", pool);
            let mut inv = POOL_MODIFY.prepare_invoke();
            inv.key(&name);
            let with_locks = |inv: &mut ScriptInvocation<'_>, keys: &[LockKey]| {
                for k in keys {
                    inv.arg(k.as_str())
                        .arg(object_name(&self.inner.prefix, "lock", k));
                }
            };
            match op {
                PoolOp::Add(keys) => {
                    inv.arg("add");
                    with_locks(&mut inv, keys);
                }
                PoolOp::Replace(keys) => {
                    inv.arg("replace");
                    with_locks(&mut inv, keys);
                }
                PoolOp::Remove(keys) => {
                    inv.arg("rem");
                    for k in keys {
                        inv.arg(k.as_str());
                    }
                }
                PoolOp::Clear => {
                    inv.arg("clear");
                }
            }
            let len: i64 = self.inner.call("pool modify", &inv).await?;
            Ok(usize::try_from(len).unwrap_or(0))
        })
    }

    fn pool_members<'a>(
        &'a self,
        pool: &'a LockKey,
    ) -> BoxFuture<'a, Result<Vec<LockKey>, LockError>> {
        Box::pin(async move {
            let name = object_name(&self.inner.prefix, "pool", pool);
            let mut inv = POOL_MEMBERS.prepare_invoke();
            inv.key(&name);
            let members: Vec<String> = self.inner.call("pool members", &inv).await?;
            let mut members = members
                .iter()
                .map(|m| LockKey::new(m).map_err(malformed_member))
                .collect::<Result<Vec<_>, _>>()?;
            members.sort();
            Ok(members)
        })
    }

    fn pool_holders<'a>(
        &'a self,
        pool: &'a LockKey,
    ) -> BoxFuture<'a, Result<PoolHolders, LockError>> {
        Box::pin(async move {
            let name = object_name(&self.inner.prefix, "pool", pool);
            let mut inv = POOL_HOLDERS.prepare_invoke();
            inv.key(&name);
            let flat: Vec<(String, String, i64)> = self.inner.call("pool holders", &inv).await?;
            let mut out = Vec::with_capacity(flat.len());
            for (member, token, pttl) in flat {
                let member = LockKey::new(&member).map_err(malformed_member)?;
                let holder = if token.is_empty() {
                    None
                } else {
                    Some(Holder::new(
                        Token::new(&token).map_err(malformed_token)?,
                        remaining(pttl),
                    ))
                };
                out.push((member, holder));
            }
            out.sort_by(|a, b| a.0.cmp(&b.0));
            Ok(out)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_braces_never_reach_the_hash_tag() {
        let key = LockKey::new("}{evil}").unwrap();
        let n = Names::new("app", &key);
        let tag = &n.lock[n.lock.find('{').unwrap()..=n.lock.find('}').unwrap()];
        assert_eq!(tag.len(), 18, "{tag}");
        assert!(tag[1..17].bytes().all(|b| b.is_ascii_hexdigit()));
        for name in [&n.fence, &n.queue, &n.wait, &n.channel] {
            assert!(name.starts_with(&n.lock[..n.lock.find('}').unwrap() + 1]));
        }
    }

    #[test]
    fn user_keys_cannot_spell_engine_keys() {
        // "queue:x" as a user key must not produce the queue key of "x".
        let a = Names::new("p", &LockKey::new("queue:x").unwrap());
        let b = Names::new("p", &LockKey::new("x").unwrap());
        for x in [&a.lock, &a.fence, &a.queue, &a.wait] {
            for y in [&b.lock, &b.fence, &b.queue, &b.wait] {
                assert_ne!(x, y);
            }
        }
    }

    #[tokio::test]
    async fn misconfiguration_is_refused_at_build_time() {
        // Port 1: nothing listens, but none of these gets as far as connecting.
        let builder = || RedisBackend::builder("redis://127.0.0.1:1");
        for bad in [
            builder().prefix("a{b}"),
            builder().prefix(""),
            builder().prefix("x".repeat(MAX_PREFIX_LEN + 1)),
            builder().pool_size(0),
            builder().command_timeout(Duration::ZERO),
            RedisBackend::builder("not a url"),
        ] {
            let err = bad.build().await.unwrap_err();
            assert_eq!(err.kind(), BackendErrorKind::Config, "{err}");
        }
        let err = builder().build().await.unwrap_err();
        assert_eq!(err.kind(), BackendErrorKind::Unavailable, "{err}");
    }

    #[test]
    fn millis_round_up() {
        assert_eq!(millis(Duration::from_micros(1)), 1);
        assert_eq!(millis(Duration::from_micros(1500)), 2);
        assert_eq!(millis(Duration::ZERO), 1);
    }
}
