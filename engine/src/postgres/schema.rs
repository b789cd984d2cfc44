//! The schema the backend owns: its tables, and every PL/pgSQL function the calls run, each
//! with its contract (arguments, what it returns, why it is atomic, statements inside).
//!
//! Every function that changes a key's lock or its queue holds the lock of the key's row
//! first (a row lock, released at the statement's commit, so nothing is left on a pooled
//! connection): the row is the key's mutex, and its `queued` flag tells the one-statement fast
//! paths (a free key nobody queues for, a release nobody waits for) that they do not apply
//! (see `locks` for why that keeps arrival order and every hand-off). Two calls on one key so
//! run one after the other, each seeing the other's commit: the compare-token-then-write of a
//! release, the "free, and am I next?" of an acquire and the hand-off are each one atomic
//! step. A function locks one key's row, except the batched renewal, which goes through its
//! keys in hash order, and the sweeper, which skips the rows it cannot lock at once: no cycle,
//! no deadlock. The functions of a key's numeric value and a pool take a
//! transaction-level advisory lock instead (`pg_advisory_xact_lock(class, hashtext(...))`,
//! `class` a number of this schema and prefix).
//!
//! Durability (issue 52). The functions that change only lock state (acquire, release,
//! leave, extend, the batched renewal, admin set and force release) commit with
//! `synchronous_commit = off` for their own transaction (`set_config(..., true)`, an
//! expression rather than a statement: nothing stays on the session, and it works behind
//! PgBouncer): no call waits for a WAL flush. A crash of the server may so take back the
//! last grants and releases (up to about 3 × `wal_writer_delay`, 600 ms by default), as a
//! Redis restart forgets its last writes: leases are ephemeral. What must hold through it
//! holds otherwise: every grant's fence is at least the database clock in µs, a hand-off's
//! at least the server's start time in µs (see `locks`), so fences handed out after the restart exceed every fence handed out before
//! whatever the crash took back, and the backend reports a restart as a reset (`restarts`),
//! so every lease granted before it is lost. The functions that store a user's data keep
//! `synchronous_commit = on` whatever the database says: `complete` (a stored response
//! must survive a crash, or a request would run twice) and `compare_and_set` (a numeric
//! value is the application's). A database configured with `synchronous_commit = off`
//! still keeps those.
//!
//! Microsecond fences (about 2^51) fit a `bigint`. Durations travel as milliseconds.

mod capabilities;
mod leases;
mod locks;
mod upgrade;

/// The version of the tables and functions [`migration`] installs; `build()` refuses a
/// database whose `schema_version` is another. Version 2 added the shared leases, version
/// 3 the `queued` flag of a key's row; version 4 made one space and one queue per key for
/// both modes (the shared leases' own queue, fences and functions folded into the lock's);
/// version 5 added the holders' labels, notifies a hand-off on the channel of the waiter's
/// node alone, sweeps by expiry indexes, commits the lock functions asynchronously and
/// floors a hand-off's fence at the server's start time in µs.
/// `migrate()` brings a version 1, 2, 3 or 4 schema up in place, leases held and waiters
/// queued (see `upgrade`). On a schema that is up to date it takes no table lock that
/// conflicts with the calls in flight: every step that would is skipped after a look at
/// the catalog.
pub(super) const SCHEMA_VERSION: i32 = 5;

/// The whole migration, with `@name@` where [`Names::migration`](super::names::Names::migration)
/// fills in a name: the tables, the upgrade of an older schema, every function (and what a
/// node of the previous version calls), then the version. One multi-statement message, so one implicit transaction, serialized by an
/// advisory lock.
pub(super) fn migration() -> String {
    [
        TABLES,
        upgrade::STEPS,
        upgrade::V5_LABEL,
        upgrade::V5_SWEEP,
        locks::FUNCTIONS,
        leases::FUNCTIONS,
        capabilities::FUNCTIONS,
        upgrade::OLD_CALLS,
        VERSION,
    ]
    .join("\n\n")
}

/// The tables (see the module docs of `postgres` for what each holds).
const TABLES: &str = r#"
-- Bounded by migrate()'s own timeout (at least 30 s), not by a database's or role's
-- statement_timeout or lock_timeout: a concurrent migration holds the lock below meanwhile.
SET LOCAL statement_timeout = 0;
SET LOCAL lock_timeout = 0;
SELECT pg_advisory_xact_lock(@class@, 0);
CREATE SCHEMA IF NOT EXISTS @schema@;
CREATE TABLE IF NOT EXISTS @version@ (version integer NOT NULL);
CREATE TABLE IF NOT EXISTS @locks@ (
  key text PRIMARY KEY,
  token text,
  fence bigint NOT NULL,
  expires_at timestamptz NOT NULL,
  queued boolean NOT NULL DEFAULT false,
  shared_until timestamptz NOT NULL DEFAULT '-infinity',
  released text,
  label text
) WITH (fillfactor = 70);
CREATE TABLE IF NOT EXISTS @tickets@ (
  key text NOT NULL,
  id text NOT NULL,
  seq bigint GENERATED ALWAYS AS IDENTITY,
  token text NOT NULL,
  deadline timestamptz NOT NULL,
  ttl_ms bigint NOT NULL,
  claim_ms bigint NOT NULL,
  lim bigint NOT NULL DEFAULT 0,
  nonce text NOT NULL DEFAULT '',
  label text,
  PRIMARY KEY (key, id)
);
CREATE TABLE IF NOT EXISTS @shared@ (
  key text NOT NULL,
  token text NOT NULL,
  fence bigint NOT NULL,
  alone boolean NOT NULL,
  expires_at timestamptz NOT NULL,
  label text,
  PRIMARY KEY (key, token)
) WITH (fillfactor = 70);
CREATE TABLE IF NOT EXISTS @pools@ (
  pool text NOT NULL,
  member text NOT NULL,
  PRIMARY KEY (pool, member)
);
CREATE TABLE IF NOT EXISTS @records@ (
  key text PRIMARY KEY,
  fingerprint bytea NOT NULL,
  meta bytea NOT NULL,
  body bytea NOT NULL,
  completed_at_ms bigint NOT NULL,
  kept boolean NOT NULL,
  expires_at timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS @numbers@ (
  key text PRIMARY KEY,
  value double precision NOT NULL,
  expires_at timestamptz NOT NULL
);
"#;

/// The version row, last: a migration that failed half way leaves the old one.
const VERSION: &str = r#"
DELETE FROM @version@;
INSERT INTO @version@ (version) VALUES (@schema_version@);
"#;
