//! The Postgres backend: leases kept in tables of the database the application already has,
//! for services that run no Redis.
//!
//! ```rust,no_run
//! use std::time::Duration;
//! use tower_lock_engine::{LockEngine, postgres::PostgresBackend};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let builder = PostgresBackend::builder("postgres://app@127.0.0.1/app")
//!     .schema("tower_lock")
//!     .table_prefix("");
//! // Once per deployment (or at start-up: it is idempotent and serialized).
//! builder.migrate().await?;
//! let engine = LockEngine::new(builder.build().await?);
//! let lease = engine.lock("invoice:42").wait(Duration::from_secs(2)).acquire().await?;
//! println!("fence {}", lease.fence());
//! lease.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Tables
//!
//! In the schema the builder names (default `tower_lock`), each table name after the
//! table prefix (default none):
//!
//! - `locks (key text primary key, token text, fence bigint, expires_at timestamptz,
//!   queued boolean, shared_until timestamptz, released text, label text)`: one row per key held (in
//!   either mode), or released within the last [`TOMBSTONE_MARGIN`], or queued for: the
//!   key's one space. `token` is its lone holder's (the lock); `NULL` once released: the
//!   row is then the key's fence tombstone, kept so that the next grant's fence, in either
//!   mode, exceeds it. A row whose `expires_at` has passed holds nothing (a lease that ran
//!   out is its own tombstone). `fence` is the last fence granted in either mode.
//!   `shared_until`: no shared lease of the key lasts past it (the lock's fast path needs
//!   no other read). `queued`: the key may have tickets (it has none when false), which
//!   keeps acquires and releases off their one-statement fast paths. `released`: the id of
//!   the key's last release, so that a release sent again after its connection was lost
//!   answers what the first did. `label`: its lone holder's label (see
//!   [`Holder::label`](crate::Holder::label); `NULL`: none; shared leases and tickets carry
//!   theirs in a `label` column too, and a hand-off copies the ticket's). The sweeper
//!   deletes every row whose `expires_at` and `shared_until` are more than
//!   [`TOMBSTONE_MARGIN`] past and that nobody queues for (found by an index on the later
//!   of the two, in batches: see [`PostgresBackend::sweep`]).
//! - `shared_leases (key, token, fence, alone, expires_at, label)`: a key's shared holders
//!   ([`Mode::Shared`](crate::Mode::Shared)), one row each (`alone` for a limit of 1),
//!   deleted by its release or once it ran out. A key has either one holder alone (its
//!   lock, or a shared lease with a limit of 1) or up to each shared holder's limit of
//!   shared holders, never both.
//! - `tickets (key, id, seq, token, deadline, ttl_ms, claim_ms, lim, nonce, label)`: the waiters of
//!   both modes, one row each, in one arrival order (`seq`, an identity column; a node's
//!   acquires of a key are lined up in the order they were called, see
//!   `AcquireRequest::leave_line`, so its calls taking different pooled connections cannot
//!   swap places), each with everything a release needs to grant it the key without asking
//!   anyone: its token, its mode (`lim`, `0` the lock), its lease TTL, its claim period (how
//!   long a hand-off to it lasts before it confirms, its ticket TTL) and the nonce of its
//!   latest registration (which the grant names). A ticket lives until `deadline` unless
//!   its waiter refreshes it (every fallback period); a dead one is skipped by a release and
//!   deleted by the next acquire or the sweeper. A release grants from the queue's head as
//!   many waiters as now fit, stopping at the first that does not (a waiting lock is never
//!   overtaken by later shared arrivals), in the releasing statement, and notifies each.
//! - `numbers (key text primary key, value double precision, expires_at timestamptz)`: the
//!   numeric values of [`NumericKey`](crate::NumericKey), `infinity` for no expiry; swept
//!   once expired.
//! - `pools (pool text, member text)`: the members of each [`LockPool`](crate::LockPool),
//!   kept until removed (as a Redis pool is).
//! - `records (key, fingerprint, meta, body, completed_at_ms, kept, expires_at)`: the
//!   records of [`Lease::complete`](crate::Lease::complete), each until its retention ends;
//!   swept then.
//! - `schema_version (version int)`: what [`PostgresBackendBuilder::build`] checks (2 since
//!   shared leases, 3 since `queued`, 4 since one space and one queue per key for both
//!   modes, 5 since a hand-off is notified to its waiter's node alone, the lock functions
//!   commit asynchronously and hand-off fences are floored at the server's start);
//!   [`PostgresBackendBuilder::migrate`] upgrades a version 1, 2, 3 or 4 schema in
//!   place, with its leases held and its waiters queued.
//!
//! # Rolling upgrade
//!
//! A fleet mid-deploy runs old and new nodes on one schema: run the new version's
//! `migrate()` first (under traffic: it takes no lock a call in flight conflicts with on a
//! schema that is up to date, and one transaction otherwise). From its commit, every call
//! of a node still running version 3 goes to the new functions, whose added arguments
//! have defaults (a lock's acquire, release, extend and renewal, the holders, the waiters;
//! its shared-lease functions are kept as calls of those in the shared mode), and its
//! waiters read the new grant notifications (the nonce is their fourth field, which they
//! ignore): a version 3 node locks in the key's one space and queue too, without the
//! nonce's guarantee. A version 3 node that starts after the migration is refused by
//! `build()` ("newer than this library"), as any version mismatch.
//!
//! # Statements
//!
//! Every operation is one statement (see `schema/` for each function's contract): a call
//! of a function that [`PostgresBackendBuilder::migrate`] installs. A function runs in the
//! statement's own transaction, and holds the lock of the key's row in `locks` before it reads
//! what it decides on (released at commit): so "is it free / is it mine / who is next" and
//! the write that follows see one state, as a Lua script does on Redis. An acquire of a free
//! key nobody queues for, and a release nobody waits for, are one `INSERT … ON CONFLICT` or
//! one `UPDATE` inside their function (the row's `queued` flag says when they apply).
//! Nothing outlives the statement on its connection: no session advisory lock, no `SET`, no
//! prepared statement (calls go out in the simple query protocol, their values written as
//! hex-decoded literals, never spliced as text), so the backend works unchanged behind
//! PgBouncer in transaction pooling mode. A function that changes only lock state commits
//! asynchronously (`synchronous_commit = off` for its own transaction: no WAL flush per
//! lock operation); one that stores a record or a numeric value commits synchronously
//! whatever the database says. See "Durability" below.
//!
//! Every call runs as a task on the engine's runtime (one thread hop), where the backend's
//! own connections live: a runtime the application shuts down or blocks takes no connection
//! and no call with it. (Over the application's pool, [`PostgresBackend::from_pool`], the
//! connections are the application's.)
//!
//! Time is the database's (`clock_timestamp()`, which moves within a transaction, unlike
//! `now()`): lease expiries, ticket deadlines and fences are judged by one clock.
//!
//! An uncontended acquire and release are one statement each (two round trips). sqlx's pool
//! also pings each connection as it takes it back (a protocol `Sync`, no statement), off the
//! caller's path, and pings none before a call: a connection that died while idle
//! (`idle_session_timeout`, `pg_terminate_backend`, a restart) fails the call it serves.
//! Which calls are then sent again, once, on a fresh connection, is decided in one place
//! (`resend`) by what the server could have done: a statement that never ran (the
//! session's end was the first thing the server answered) is sent again whatever it is, a
//! release included; one that may have run, only if repeating it changes nothing.
//!
//! # Fences
//!
//! A grant's fence is `max(last fence + 1, database time in µs)`, the last fence read from
//! the key's row (a holder's, a lapsed lease's or a tombstone's, in either mode); a
//! hand-off's is `max(last fence + 1, the server's start time in µs)`
//! (`pg_postmaster_start_time()`): the last fence + 1, but for the first hand-off of a row
//! the server kept through a crash. Every fence is at most the database time at its grant
//! (plus one per grant within the same microsecond), so once a row is swept (at least
//! [`TOMBSTONE_MARGIN`] after it stopped holding), or taken back by a crash with the commits
//! that wrote it (the server's start is later than every grant of its previous run), the
//! floor has moved past it: fences strictly increase per key unless the database clock
//! steps back by more than that margin (or by more than the crash and restart took).
//!
//! # Durability
//!
//! As on Redis, a lease is ephemeral: the lock functions commit asynchronously, so a crash
//! of the database may forget the last ~3 × `wal_writer_delay` (600 ms by default) of
//! grants, releases and renewals. Three things hold through it: fences never go back (above;
//! `tests/postgres/restarts.rs`: `fences_keep_rising_through_a_kill_9_crash`); a restart is
//! a reset (every lease granted before it is `lost()`: the listener's connection ending,
//! or another `pg_postmaster_start_time()` when it connects again, is reported to the
//! engine as [`Resets`](crate::Resets), before a restarted server can grant anyone else;
//! see the engine README for the limit); and a record stored
//! with [`Lease::complete`](crate::Lease::complete) or a numeric value is committed
//! synchronously (it survives a crash as any committed row). The transactional layer's
//! records are the user's transaction's, and its durability is the user's.
//!
//! # Waiting
//!
//! A failed attempt registers the waiter's ticket. A release hands the key over itself: the
//! releasing statement makes the queue's first live tickets that fit holders (for the
//! waiter's claim period, then renewed to the full TTL by the engine) and sends `NOTIFY`
//! with each ticket's id, fence, claim and the nonce of its latest registration; a release
//! that grants nobody notifies nobody. Each attempt registers with a fresh random nonce,
//! and a waiter takes a grant only if it names the latest: a grant of an earlier
//! registration, delivered late (it may have lapsed and gone to another since), is refused
//! whatever the clocks say, and a grant that still stands is found by the next attempt. One
//! listener connection per backend (a direct one: `LISTEN` needs its session) hears the
//! grant and completes the waiter's acquire. Each backend has a channel of its own
//! ([`PostgresBackend::wake_channel`]), the only one its waiters' grants are notified on,
//! and `LISTEN`s on it (and on the base channel, where an admin's force release is
//! notified) only while one of its waiters queues or it holds a lease (and 2 s after): an
//! idle node is never woken by a hand-off, and one with waiters is told only its own grants
//! (Postgres up to 18 still wakes every listening connection of the database for each
//! `NOTIFY`, which then finds nothing on its channel: a hand-off's server cost grows with
//! the nodes that wait or hold, not with the fleet; see `listener`). A waiter also retries on a
//! fallback timer (at most 250 ms apart), which refreshes its ticket and finds a
//! grant whose notification was lost (re-entry): the listener's reconnects cost at most
//! that.
//!
//! # Capabilities
//!
//! Shared leases (permits, in the key's one space and queue), admin operations
//! ([`LockAdmin`](crate::LockAdmin): `admin_set` on the key's lock, `force_release` of
//! every holder, each told first: a `NOTIFY "revoke\n<token>\n<key>"` on the hand-off
//! channel, which the holder's listener hears, so its lease reads lost and its engine gives
//! the key back to the next waiter; after 1 s the admin releases what is left by token;
//! `active_keys`, a range of the key rows' index), numeric compare-and-set
//! ([`NumericKey`](crate::NumericKey), table `numbers`), lock pools
//! ([`LockPool`](crate::LockPool), table `pools`) and records written with a release
//! ([`Lease::complete`](crate::Lease::complete), table `records`) all work.

mod acquire;
mod admin;
mod backend;
mod builder;
mod listener;
mod names;
mod numeric;
mod pools;
mod records;
mod resend;
mod restarts;
mod schema;
mod sql;
mod sweeper;

use std::{fmt, sync::Arc, time::Duration};

pub use builder::{DEFAULT_POOL_SIZE, MAX_COMMAND_TIMEOUT, PostgresBackendBuilder};
/// The sqlx crate the backend is built on (0.8): name its `PgPool` through this path for
/// [`PostgresBackend::from_pool`], and no version mismatch can arise.
pub use sqlx;

use self::{listener::Listener, names::Names};
use crate::{BackendError, BackendErrorKind, LockError, runtime};

/// The default schema.
pub const DEFAULT_SCHEMA: &str = "tower_lock";
/// The longest schema name and table prefix accepted, in bytes (so that every table,
/// function and channel name fits Postgres's 63-byte identifiers).
pub const MAX_NAME_LEN: usize = 24;
/// How long a released key's row (its fence tombstone) is kept before the sweeper deletes
/// it; a lease that ran out unreleased is kept as long after its expiry.
pub const TOMBSTONE_MARGIN: Duration = Duration::from_secs(5);
/// Waiters retry at least this often, whatever the listener does.
pub(crate) const FALLBACK_CAP: Duration = Duration::from_millis(250);
/// How often the sweeper deletes lapsed rows: a tombstone lives at most
/// [`TOMBSTONE_MARGIN`] + this after its release.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// The Postgres backend: see the [module docs](self) for the tables, the statements and the
/// waiting. Cheap to clone; clones share the pool, the listener and the sweeper.
#[derive(Clone)]
pub struct PostgresBackend {
    inner: Arc<Inner>,
}

struct Inner {
    pool: sqlx::PgPool,
    names: Names,
    /// Every call's bound.
    timeout: Duration,
    /// How long a waiter's ticket lives unrefreshed, in ms; also the claim period of a
    /// hand-off to this node's waiters, which their tickets carry.
    ticket_ttl_ms: u64,
    listener: Listener,
    /// The watch on the server's restarts (fed by the listener): the engine's resets.
    restarts: Arc<restarts::Restarts>,
    /// The sweep the sweeper runs, and its failures' count.
    sweep: sweeper::Sweep,
    /// Ends the sweeper with the backend.
    _sweeper: sweeper::Sweeper,
}

impl fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("schema", &self.inner.names.schema())
            .field("table_prefix", &self.inner.names.prefix())
            .finish_non_exhaustive()
    }
}

impl PostgresBackend {
    /// A builder for `url` (`postgres://user:password@host:port/database`): the backend
    /// opens a pool of its own there, and its listener connection too unless
    /// [`listen_url`](PostgresBackendBuilder::listen_url) says otherwise (the direct
    /// address, when `url` is a PgBouncer's). With the defaults an engine opens at most 4
    /// connections: up to [`DEFAULT_POOL_SIZE`] pooled ones on demand, and its listener's
    /// (see [`PostgresBackendBuilder::pool_size`]).
    pub fn builder(url: impl Into<String>) -> PostgresBackendBuilder {
        PostgresBackendBuilder::new(builder::Source::Url(url.into()))
    }

    /// A builder over the application's own pool: its connections serve the calls. The
    /// listener takes one of them for as long as the backend lives, unless
    /// [`listen_url`](PostgresBackendBuilder::listen_url) names a direct address (which it
    /// must when the pool goes through PgBouncer in transaction mode: `LISTEN` needs a
    /// session).
    pub fn from_pool(pool: sqlx::PgPool) -> PostgresBackendBuilder {
        PostgresBackendBuilder::new(builder::Source::Pool(pool))
    }

    /// Connect with the defaults (schema `tower_lock`, no table prefix), after checking the
    /// schema (see [`PostgresBackendBuilder::build`]).
    pub async fn connect(url: impl Into<String>) -> Result<Self, BackendError> {
        Self::builder(url).build().await
    }

    /// The schema of the backend's tables.
    pub fn schema(&self) -> &str {
        self.inner.names.schema()
    }

    /// The prefix of the backend's table names.
    pub fn table_prefix(&self) -> &str {
        self.inner.names.prefix()
    }

    /// The `NOTIFY` channel of the hand-offs to this backend's waiters
    /// (`<schema>.<prefix>wake_<node>`, `<node>` 8 random hex digits per backend): a
    /// release notifies the channel of the granted waiter's node alone, and the backend
    /// `LISTEN`s on it only while one of its waiters queues or it holds a lease (see the
    /// module docs, "Waiting").
    pub fn wake_channel(&self) -> &str {
        self.inner.listener.channel()
    }

    /// The backend's pool (the application's own, or the one it opened).
    pub fn pool(&self) -> &sqlx::PgPool {
        &self.inner.pool
    }

    /// Delete now the rows nothing holds any more (what the background sweeper does every
    /// 5 s: fence tombstones and lapsed leases past [`TOMBSTONE_MARGIN`], dead tickets,
    /// expired numbers and records), for a maintenance task or a test: returns how many
    /// rows it deleted. It finds them by an index on their expiry, 1,000 rows per table and
    /// transaction, until none is left: its cost is what expired, not the tables' size. One
    /// node of the fleet sweeps at a time: this one waits for a sweep another node is
    /// running to finish its batch, then sweeps (a background sweep that finds another
    /// running leaves it the work). A failure is logged at `warn` and counted in
    /// [`failed_sweeps`](Self::failed_sweeps), as the background sweeper's are.
    pub async fn sweep(&self) -> Result<u64, LockError> {
        let sweep = self.inner.sweep.clone();
        runtime::handle()
            .spawn(async move { sweep.run(true).await.map(Option::unwrap_or_default) })
            .await
            .unwrap_or_else(|e| {
                Err(LockError::Backend(BackendError::new(
                    BackendErrorKind::Unavailable,
                    format!("postgres sweep did not finish: {e}"),
                )))
            })
    }

    /// How many sweeps failed since the backend was built, the background sweeper's and
    /// [`sweep`](Self::sweep)'s: each is also a `warn!` naming its cause. Export it to
    /// your metrics (a counter): while it rises, expired rows are not deleted.
    pub fn failed_sweeps(&self) -> u64 {
        self.inner.sweep.failed()
    }
}

/// A failure of the database or of the connection to it, as the engine reports it.
fn backend_error(what: &'static str, e: sqlx::Error) -> LockError {
    let kind = match &e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Tls(_) => BackendErrorKind::Unavailable,
        // Class 08: connection exceptions; 57P01-03: the server shutting down or starting.
        sqlx::Error::Database(db)
            if db
                .code()
                .is_some_and(|c| c.starts_with("08") || c.starts_with("57P")) =>
        {
            BackendErrorKind::Unavailable
        }
        sqlx::Error::Configuration(_) => BackendErrorKind::Config,
        _ => BackendErrorKind::Protocol,
    };
    LockError::Backend(BackendError::new(kind, format!("postgres {what} failed")).with_source(e))
}

fn timed_out(what: &'static str, after: Duration) -> LockError {
    LockError::Backend(BackendError::new(
        BackendErrorKind::Timeout,
        format!("postgres {what} did not answer within {after:?}"),
    ))
}

/// Milliseconds, rounded up, at least 1, at most `i64::MAX`: a lease is never shorter on
/// the server than asked.
fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_nanos().div_ceil(1_000_000))
        .unwrap_or(i64::MAX)
        .max(1)
}

/// A remaining TTL reported by a function (`< 0`: none).
fn remaining(ms: i64) -> Option<Duration> {
    u64::try_from(ms).ok().map(Duration::from_millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_round_up_and_saturate() {
        assert_eq!(millis(Duration::from_micros(1)), 1);
        assert_eq!(millis(Duration::from_micros(1500)), 2);
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::MAX), i64::MAX);
    }
}
