//! The schema the backend owns: its tables, and every PL/pgSQL function the calls run, each
//! with its contract (arguments, what it returns, why it is atomic, statements inside).
//!
//! Every function that changes a key takes `pg_advisory_xact_lock(class, hashtext(key))`
//! first: a transaction-level lock (released at the statement's commit, so nothing is left
//! on a pooled connection), `class` a number of this schema and prefix. Two calls on one key
//! so run one after the other, each seeing the other's commit (a function reads with a fresh
//! snapshot per statement, taken after the lock): the compare-token-then-write of a release,
//! the "free, and am I next?" of an acquire and the hand-off are each one atomic step. Two
//! keys whose hashes collide only wait for each other a moment. The batched renewal takes its
//! keys' locks in hash order, and every other function takes one key's: no cycle, no
//! deadlock.
//!
//! Every function that changes a lease also sets `synchronous_commit` on for its own
//! transaction (`set_config(..., true)`: nothing stays on the session): a grant the caller
//! was told of must survive a crash of the server, or a second holder would be granted after
//! the restart while the first still runs. A database or role configured with
//! `synchronous_commit = off` so still keeps every lease it reported.
//!
//! Microsecond fences (about 2^51) fit a `bigint`. Durations travel as milliseconds.

use super::MAX_NAME_LEN;
use crate::{BackendError, BackendErrorKind};

/// The version of the tables and functions [`MIGRATION`] installs; `build()` refuses a
/// database whose `schema_version` is another.
pub(super) const SCHEMA_VERSION: i32 = 1;

/// The qualified, quoted names of one schema and table prefix.
#[derive(Clone, Debug)]
pub(super) struct Names {
    schema: String,
    prefix: String,
    /// `"<schema>"."<prefix>"`, to which a table or function name is appended.
    qualified: String,
    /// The first key of the advisory locks: a hash of schema and prefix, so that two
    /// deployments in one database never wait for each other.
    class: i32,
    acquire: String,
    release: String,
    leave: String,
    extend: String,
    renew: String,
    holder: String,
    waiters: String,
    sweep: String,
    admin_set: String,
    force_release: String,
    compare_and_set: String,
    numeric_get: String,
    pool_modify: String,
    pool_members: String,
    pool_holders: String,
    complete: String,
    record: String,
    forget: String,
}

impl Names {
    /// The names for `schema` and `prefix`, if both are plain lower-case identifiers.
    pub(super) fn new(schema: &str, prefix: &str) -> Result<Self, BackendError> {
        let plain = |s: &str| {
            s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        };
        if schema.is_empty()
            || schema.len() > MAX_NAME_LEN
            || !plain(schema)
            || schema.as_bytes()[0].is_ascii_digit()
        {
            return Err(BackendError::new(
                BackendErrorKind::Config,
                format!(
                    "schema {schema:?}: 1 to {MAX_NAME_LEN} bytes of a-z, 0-9 and _, not \
                     starting with a digit"
                ),
            ));
        }
        if prefix.len() > MAX_NAME_LEN || !plain(prefix) {
            return Err(BackendError::new(
                BackendErrorKind::Config,
                format!("table prefix {prefix:?}: at most {MAX_NAME_LEN} bytes of a-z, 0-9 and _"),
            ));
        }
        let qualified = format!("\"{schema}\".\"{prefix}");
        let function = |name: &str| format!("{qualified}{name}\"");
        // FNV-1a: stable across builds and platforms (the class must agree between nodes).
        let mut hash: u32 = 0x811c_9dc5;
        for byte in schema.bytes().chain([b'.']).chain(prefix.bytes()) {
            hash = (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193);
        }
        Ok(Self {
            schema: schema.to_owned(),
            prefix: prefix.to_owned(),
            class: i32::from_ne_bytes(hash.to_ne_bytes()),
            acquire: function("acquire"),
            release: function("release"),
            leave: function("leave"),
            extend: function("extend"),
            renew: function("renew"),
            holder: function("holder"),
            waiters: function("waiters"),
            sweep: function("sweep"),
            admin_set: function("admin_set"),
            force_release: function("force_release"),
            compare_and_set: function("compare_and_set"),
            numeric_get: function("numeric_get"),
            pool_modify: function("pool_modify"),
            pool_members: function("pool_members"),
            pool_holders: function("pool_holders"),
            complete: function("complete"),
            record: function("record"),
            forget: function("forget"),
            qualified,
        })
    }

    pub(super) fn schema(&self) -> &str {
        &self.schema
    }

    pub(super) fn prefix(&self) -> &str {
        &self.prefix
    }

    pub(super) fn acquire(&self) -> &str {
        &self.acquire
    }

    pub(super) fn release(&self) -> &str {
        &self.release
    }

    pub(super) fn leave(&self) -> &str {
        &self.leave
    }

    pub(super) fn extend(&self) -> &str {
        &self.extend
    }

    pub(super) fn renew(&self) -> &str {
        &self.renew
    }

    pub(super) fn holder(&self) -> &str {
        &self.holder
    }

    pub(super) fn waiters(&self) -> &str {
        &self.waiters
    }

    pub(super) fn sweep(&self) -> &str {
        &self.sweep
    }

    pub(super) fn admin_set(&self) -> &str {
        &self.admin_set
    }

    pub(super) fn force_release(&self) -> &str {
        &self.force_release
    }

    pub(super) fn compare_and_set(&self) -> &str {
        &self.compare_and_set
    }

    pub(super) fn numeric_get(&self) -> &str {
        &self.numeric_get
    }

    pub(super) fn pool_modify(&self) -> &str {
        &self.pool_modify
    }

    pub(super) fn pool_members(&self) -> &str {
        &self.pool_members
    }

    pub(super) fn pool_holders(&self) -> &str {
        &self.pool_holders
    }

    pub(super) fn complete(&self) -> &str {
        &self.complete
    }

    pub(super) fn record(&self) -> &str {
        &self.record
    }

    pub(super) fn forget(&self) -> &str {
        &self.forget
    }

    /// The qualified name of table `name`.
    pub(super) fn table(&self, name: &str) -> String {
        format!("{}{name}\"", self.qualified)
    }

    /// The `NOTIFY` channel of hand-offs (at most 2 × 24 + 5 bytes: under the 63 of an
    /// identifier).
    pub(super) fn channel(&self) -> String {
        format!("{}.{}wake", self.schema, self.prefix)
    }

    /// The statement that reads the schema's version.
    pub(super) fn version_query(&self) -> String {
        format!(
            "SELECT max(version)::bigint FROM {}",
            self.table("schema_version")
        )
    }

    /// The whole migration, one multi-statement message (one implicit transaction),
    /// serialized against concurrent migrations by an advisory lock.
    pub(super) fn migration(&self) -> String {
        let channel = self.channel();
        MIGRATION
            .replace("@schema@", &format!("\"{}\"", self.schema))
            .replace("@locks@", &self.table("locks"))
            .replace("@tickets@", &self.table("tickets"))
            .replace("@numbers@", &self.table("numbers"))
            .replace("@records@", &self.table("records"))
            .replace("@complete@", &self.complete)
            .replace("@record@", &self.record)
            .replace("@forget@", &self.forget)
            .replace("@pools@", &self.table("pools"))
            .replace("@pool_modify@", &self.pool_modify)
            .replace("@pool_members@", &self.pool_members)
            .replace("@pool_holders@", &self.pool_holders)
            .replace("@compare_and_set@", &self.compare_and_set)
            .replace("@numeric_get@", &self.numeric_get)
            .replace("@version@", &self.table("schema_version"))
            .replace(
                "@queue_index@",
                &format!("\"{}tickets_queue\"", self.prefix),
            )
            .replace("@handoff@", &format!("{}handoff\"", self.qualified))
            .replace("@ms@", &format!("{}ms\"", self.qualified))
            .replace("@admin_set@", &self.admin_set)
            .replace("@force_release@", &self.force_release)
            .replace("@acquire@", &self.acquire)
            .replace("@release@", &self.release)
            .replace("@leave@", &self.leave)
            .replace("@extend@", &self.extend)
            .replace("@renew@", &self.renew)
            .replace("@holder@", &self.holder)
            .replace("@waiters@", &self.waiters)
            .replace("@sweep@", &self.sweep)
            .replace("@class@", &self.class.to_string())
            .replace("@channel@", &format!("'{channel}'"))
            .replace("@schema_version@", &SCHEMA_VERSION.to_string())
    }
}

/// The tables and functions, as installed by `migrate()`. `@name@` marks a name
/// [`Names::migration`] fills in.
///
/// # `acquire(k, tok, ttl_ms, tid, ticket_ms, max_waiters) -> (status, val)`
///
/// Acquire `k` for `tok`, or register / refresh the waiter's ticket `tid` (`''`: a plain
/// try that never registers). Returns `(1, fence)` granted; `(0, pttl)` not granted (the
/// ticket registered or refreshed when one was given; `pttl` the holder's remaining ms, `-2`
/// when the key is free but another waiter goes first); `(2, pttl)` refused, `max_waiters`
/// (`-1`: no limit) live tickets already wait.
///
/// Re-entry (`tok` holds `k`) sets the TTL to `ttl_ms` and keeps the fence; it is also how
/// a waiter whose notification was lost finds its grant. Only the queue's first live ticket
/// may take a free key, FIFO or not, so nobody waiting is overtaken by a newcomer; dead
/// tickets are deleted first. A grant's fence is `max(row's fence + 1, now in µs)` (see the
/// module docs). A new ticket carries the waiter's lease TTL and claim period (its ticket
/// TTL), so the release that grants it needs nothing else.
///
/// Statements: an uncontended grant 4 (lock, clock, `SELECT` the row, upsert) plus 2 when
/// the key was free (dead tickets, queue head); a waiter's registration or refresh 4 to 6.
///
/// # `release(k, tok) -> integer`
///
/// `-2` nobody holds `k` (nothing done), `-1` another token holds it (nothing done), `1`
/// released (the row becomes the fence tombstone), `2` handed to the next waiter
/// (`handoff`). Statements: 3, and `handoff`'s 3 or 4.
///
/// # `handoff(k, f, t) -> integer` (called with `k`'s lock held)
///
/// Deletes `k`'s dead tickets, then pops its first live one: makes that ticket's token the
/// holder for `min(its TTL, its claim)` with fence `f + 1`, and `NOTIFY`s
/// `"<ticket id> <fence> <claim ms>"` on the backend's channel (delivered at commit);
/// returns 2. No live ticket: the row becomes a tombstone (token `NULL`, expiring now),
/// nobody is notified; returns 1.
///
/// # `leave(k, tid, tok) -> bigint`
///
/// A waiter leaves (timed out, cancelled, failed): deletes its ticket, and gives back a
/// grant it may have received unseen (a hand-off, or an attempt whose reply was lost), as a
/// release would. Returns the holder's remaining ms, `-2` when the key is free now.
///
/// # `extend(k, tok, ms, mode) -> bigint`
///
/// `mode` `'add'`: the expiry moves `ms` later; `'replace'`: it becomes now + `ms` (at least
/// 1 ms from now either way). Returns the new remaining ms, `-1` another token holds `k`,
/// `-2` nobody does.
///
/// # `renew(ks, toks, ttls) -> text`
///
/// The watchdog's batch: for each lease still held by its token, the expiry becomes the
/// later of its current one and now + its TTL (a renewal never shortens a lease: one that
/// lands after an extension must not undo it; it also turns a hand-off's claim into the full
/// TTL). Returns one character per lease, `1` renewed, `0` no longer held by that token. One
/// `UPDATE` per lease, after the locks of every key in hash order.
///
/// # `admin_set(k, tok, ms) -> integer`, `force_release(k) -> integer`
///
/// Admin, ignoring ownership: make `tok` the holder for `ms` (`< 0`: no expiry, an
/// `infinity` expiry) with a fresh fence, waiters left waiting; release whoever holds `k`,
/// handing it to the next waiter (`handoff`), `1` if it was held, else `0`.
///
/// # `compare_and_set(k, cmp, given, eps, action, ms) -> integer`, `numeric_get(k)`
///
/// Numeric values, in a table of their own (`numbers`, a key namespace apart from the
/// locks'): if no live value is stored, or `given` compares to it as `cmp` says (`gt` `lt`
/// `ge` `le` `eq` `ne`, the last four within `eps`), store `given` for `ms` (`< 0`: no
/// expiry) or delete it (`action` `'del'`) and return `1`; else `0`. Atomic under the key's
/// lock, so two raisers of a high-water mark never both win. `numeric_get`: the live value.
///
/// # `pool_modify(p, op, ms) -> bigint`, `pool_members(p)`, `pool_holders(p)`
///
/// Lock pools, in a table of their own (`pools`, one row per member): `op` `add`, `rem`,
/// `replace` (all of them, never seen half done) or `clear`, under the pool's lock; returns
/// the new size. `pool_members`: the members (unordered). `pool_holders`: every member with
/// its live holder and remaining ms (`NULL` token when free, `-1` ms for no expiry), one
/// statement, so one snapshot: every member read at the same instant.
///
/// # `complete(k, tok, fp, meta, body, at_ms, kept, retention_ms) -> integer`
///
/// Records written with the release that ends the work they record (`records`, one row per
/// key, kept `retention_ms`): if `tok` holds `k`, store the record (replacing any) and
/// release or hand the key on (`handoff`), under the key's lock: the record appears in the
/// same commit as the release, so a waiter granted by it finds the record. `-1` another
/// token holds `k`, `-2` nobody does: nothing is written. `record(k)`: the live record, its
/// bytes as hex (the text protocol carries them whole). `forget(k)`: delete it, `1` if it
/// was live.
///
/// # `ms(e, t) -> bigint`
///
/// The ms from `t` to `e`, rounded up; `-1` for no expiry.
///
/// # `holder(k) -> (token, ms)`, `waiters(k) -> bigint`
///
/// Reads: the live holder and its remaining ms (no row when free); the live tickets.
///
/// # `sweep(margin_ms) -> bigint`
///
/// Deletes the rows that stopped holding more than `margin_ms` ago (tombstones and lapsed
/// leases), the dead tickets and the expired numbers, each only if its key's lock is free
/// right now (a try, so the sweep never waits for a call); returns how many.
const MIGRATION: &str = r#"
SELECT pg_advisory_xact_lock(@class@, 0);
CREATE SCHEMA IF NOT EXISTS @schema@;
CREATE TABLE IF NOT EXISTS @version@ (version integer NOT NULL);
CREATE TABLE IF NOT EXISTS @locks@ (
  key text PRIMARY KEY,
  token text,
  fence bigint NOT NULL,
  expires_at timestamptz NOT NULL
) WITH (fillfactor = 70);
CREATE TABLE IF NOT EXISTS @tickets@ (
  key text NOT NULL,
  id text NOT NULL,
  seq bigint GENERATED ALWAYS AS IDENTITY,
  token text NOT NULL,
  deadline timestamptz NOT NULL,
  ttl_ms bigint NOT NULL,
  claim_ms bigint NOT NULL,
  PRIMARY KEY (key, id)
);
CREATE INDEX IF NOT EXISTS @queue_index@ ON @tickets@ (key, seq);
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

CREATE OR REPLACE FUNCTION @ms@(e timestamptz, t timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $fn$
  SELECT CASE WHEN isfinite(e) THEN ceil(extract(epoch FROM e - t) * 1000)::bigint ELSE -1 END
$fn$;

CREATE OR REPLACE FUNCTION @handoff@(k text, f bigint, t timestamptz) RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
  w @tickets@%ROWTYPE;
  g bigint;
BEGIN
  DELETE FROM @tickets@ WHERE key = k AND deadline <= t;
  DELETE FROM @tickets@
    WHERE key = k AND id = (SELECT id FROM @tickets@ WHERE key = k ORDER BY seq LIMIT 1)
    RETURNING * INTO w;
  IF NOT FOUND THEN
    UPDATE @locks@ SET token = NULL, expires_at = t WHERE key = k;
    RETURN 1;
  END IF;
  g := least(w.ttl_ms, w.claim_ms);
  UPDATE @locks@ SET token = w.token, fence = f + 1, expires_at = t + g * interval '1 millisecond'
    WHERE key = k;
  PERFORM pg_notify(@channel@, w.id || ' ' || (f + 1) || ' ' || g);
  RETURN 2;
END
$fn$;

CREATE OR REPLACE FUNCTION @acquire@(
  k text, tok text, ttl_ms bigint, tid text, ticket_ms bigint, max_waiters bigint,
  OUT status integer, OUT val bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
  t timestamptz;
  cur @locks@%ROWTYPE;
  live boolean;
  head text;
  f bigint;
BEGIN
  PERFORM pg_advisory_xact_lock(@class@, hashtext(k));
  PERFORM set_config('synchronous_commit', 'on', true);
  t := clock_timestamp();
  SELECT * INTO cur FROM @locks@ WHERE key = k;
  live := FOUND AND cur.token IS NOT NULL AND cur.expires_at > t;
  IF live AND cur.token = tok THEN
    UPDATE @locks@ SET expires_at = t + ttl_ms * interval '1 millisecond' WHERE key = k;
    IF tid <> '' THEN
      DELETE FROM @tickets@ WHERE key = k AND id = tid;
    END IF;
    status := 1;
    val := cur.fence;
    RETURN;
  END IF;
  IF live THEN
    val := @ms@(cur.expires_at, t);
  ELSE
    DELETE FROM @tickets@ WHERE key = k AND deadline <= t;
    SELECT id INTO head FROM @tickets@ WHERE key = k ORDER BY seq LIMIT 1;
    IF head IS NULL OR head = tid THEN
      f := greatest(coalesce(cur.fence + 1, 0), floor(extract(epoch FROM t) * 1000000)::bigint);
      INSERT INTO @locks@ (key, token, fence, expires_at)
        VALUES (k, tok, f, t + ttl_ms * interval '1 millisecond')
        ON CONFLICT (key) DO UPDATE
          SET token = excluded.token, fence = excluded.fence, expires_at = excluded.expires_at;
      IF head IS NOT NULL THEN
        DELETE FROM @tickets@ WHERE key = k AND id = tid;
      END IF;
      status := 1;
      val := f;
      RETURN;
    END IF;
    val := -2;
  END IF;
  IF tid = '' THEN
    status := 0;
    RETURN;
  END IF;
  UPDATE @tickets@ SET deadline = t + ticket_ms * interval '1 millisecond'
    WHERE key = k AND id = tid;
  IF NOT FOUND THEN
    IF max_waiters >= 0 THEN
      IF live THEN
        DELETE FROM @tickets@ WHERE key = k AND deadline <= t;
      END IF;
      IF (SELECT count(*) FROM @tickets@ WHERE key = k) >= max_waiters THEN
        status := 2;
        RETURN;
      END IF;
    END IF;
    INSERT INTO @tickets@ (key, id, token, deadline, ttl_ms, claim_ms)
      VALUES (k, tid, tok, t + ticket_ms * interval '1 millisecond', ttl_ms, ticket_ms);
  END IF;
  status := 0;
END
$fn$;

CREATE OR REPLACE FUNCTION @release@(k text, tok text) RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
  t timestamptz;
  cur @locks@%ROWTYPE;
BEGIN
  PERFORM pg_advisory_xact_lock(@class@, hashtext(k));
  PERFORM set_config('synchronous_commit', 'on', true);
  t := clock_timestamp();
  SELECT * INTO cur FROM @locks@ WHERE key = k;
  IF NOT FOUND OR cur.token IS NULL OR cur.expires_at <= t THEN
    RETURN -2;
  END IF;
  IF cur.token <> tok THEN
    RETURN -1;
  END IF;
  RETURN @handoff@(k, cur.fence, t);
END
$fn$;

CREATE OR REPLACE FUNCTION @leave@(k text, tid text, tok text) RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
  t timestamptz;
  cur @locks@%ROWTYPE;
BEGIN
  PERFORM pg_advisory_xact_lock(@class@, hashtext(k));
  PERFORM set_config('synchronous_commit', 'on', true);
  t := clock_timestamp();
  IF tid <> '' THEN
    DELETE FROM @tickets@ WHERE key = k AND id = tid;
  END IF;
  SELECT * INTO cur FROM @locks@ WHERE key = k;
  IF NOT FOUND OR cur.token IS NULL OR cur.expires_at <= t THEN
    RETURN -2;
  END IF;
  IF cur.token = tok THEN
    PERFORM @handoff@(k, cur.fence, t);
    RETURN -2;
  END IF;
  RETURN @ms@(cur.expires_at, t);
END
$fn$;

CREATE OR REPLACE FUNCTION @extend@(k text, tok text, ms bigint, mode text) RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
  t timestamptz;
  cur @locks@%ROWTYPE;
  e timestamptz;
BEGIN
  PERFORM pg_advisory_xact_lock(@class@, hashtext(k));
  PERFORM set_config('synchronous_commit', 'on', true);
  t := clock_timestamp();
  SELECT * INTO cur FROM @locks@ WHERE key = k;
  IF NOT FOUND OR cur.token IS NULL OR cur.expires_at <= t THEN
    RETURN -2;
  END IF;
  IF cur.token <> tok THEN
    RETURN -1;
  END IF;
  IF mode = 'add' AND isfinite(cur.expires_at) THEN
    e := cur.expires_at + ms * interval '1 millisecond';
  ELSE
    e := t + ms * interval '1 millisecond';
  END IF;
  e := greatest(e, t + interval '1 millisecond');
  UPDATE @locks@ SET expires_at = e WHERE key = k;
  RETURN @ms@(e, t);
END
$fn$;

CREATE OR REPLACE FUNCTION @renew@(ks text[], toks text[], ttls bigint[]) RETURNS text
LANGUAGE plpgsql AS $fn$
DECLARE
  t timestamptz;
  i integer;
  renewed text := '';
BEGIN
  FOR i IN SELECT o FROM generate_subscripts(ks, 1) AS o ORDER BY hashtext(ks[o]) LOOP
    PERFORM pg_advisory_xact_lock(@class@, hashtext(ks[i]));
  END LOOP;
  PERFORM set_config('synchronous_commit', 'on', true);
  t := clock_timestamp();
  FOR i IN 1 .. coalesce(array_length(ks, 1), 0) LOOP
    UPDATE @locks@ SET expires_at = greatest(expires_at, t + ttls[i] * interval '1 millisecond')
      WHERE key = ks[i] AND token = toks[i] AND expires_at > t;
    renewed := renewed || CASE WHEN FOUND THEN '1' ELSE '0' END;
  END LOOP;
  RETURN renewed;
END
$fn$;

CREATE OR REPLACE FUNCTION @admin_set@(k text, tok text, ms bigint) RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
  t timestamptz;
  cur @locks@%ROWTYPE;
  e timestamptz;
BEGIN
  PERFORM pg_advisory_xact_lock(@class@, hashtext(k));
  PERFORM set_config('synchronous_commit', 'on', true);
  t := clock_timestamp();
  SELECT * INTO cur FROM @locks@ WHERE key = k;
  IF ms < 0 THEN
    e := 'infinity';
  ELSE
    e := t + greatest(ms, 1) * interval '1 millisecond';
  END IF;
  INSERT INTO @locks@ (key, token, fence, expires_at)
    VALUES (k, tok, greatest(coalesce(cur.fence + 1, 0), floor(extract(epoch FROM t) * 1000000)::bigint), e)
    ON CONFLICT (key) DO UPDATE
      SET token = excluded.token, fence = excluded.fence, expires_at = excluded.expires_at;
  RETURN 1;
END
$fn$;

CREATE OR REPLACE FUNCTION @force_release@(k text) RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
  t timestamptz;
  cur @locks@%ROWTYPE;
BEGIN
  PERFORM pg_advisory_xact_lock(@class@, hashtext(k));
  PERFORM set_config('synchronous_commit', 'on', true);
  t := clock_timestamp();
  SELECT * INTO cur FROM @locks@ WHERE key = k;
  IF NOT FOUND OR cur.token IS NULL OR cur.expires_at <= t THEN
    RETURN 0;
  END IF;
  PERFORM @handoff@(k, cur.fence, t);
  RETURN 1;
END
$fn$;

CREATE OR REPLACE FUNCTION @compare_and_set@(
  k text, cmp text, given double precision, eps double precision, action text, ms bigint)
RETURNS integer LANGUAGE plpgsql AS $fn$
DECLARE
  t timestamptz;
  s double precision;
  ok boolean;
BEGIN
  -- '#': the numbers' keys apart from the locks' (a collision only serializes).
  PERFORM pg_advisory_xact_lock(@class@, hashtext('#' || k));
  PERFORM set_config('synchronous_commit', 'on', true);
  t := clock_timestamp();
  SELECT value INTO s FROM @numbers@ WHERE key = k AND expires_at > t;
  IF FOUND THEN
    ok := CASE cmp
      WHEN 'gt' THEN given > s
      WHEN 'lt' THEN given < s
      WHEN 'ge' THEN given >= s - eps
      WHEN 'le' THEN given <= s + eps
      WHEN 'eq' THEN abs(given - s) <= eps
      WHEN 'ne' THEN abs(given - s) > eps
    END;
    IF ok IS NULL THEN
      RAISE EXCEPTION 'unknown comparison %', cmp;
    END IF;
    IF NOT ok THEN
      RETURN 0;
    END IF;
  END IF;
  IF action = 'del' THEN
    DELETE FROM @numbers@ WHERE key = k;
  ELSE
    INSERT INTO @numbers@ (key, value, expires_at)
      VALUES (k, given, CASE WHEN ms < 0 THEN 'infinity'
                             ELSE t + greatest(ms, 1) * interval '1 millisecond' END)
      ON CONFLICT (key) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at;
  END IF;
  RETURN 1;
END
$fn$;

CREATE OR REPLACE FUNCTION @numeric_get@(k text) RETURNS SETOF double precision
LANGUAGE sql AS $fn$
  SELECT value FROM @numbers@ WHERE key = k AND expires_at > clock_timestamp()
$fn$;

CREATE OR REPLACE FUNCTION @pool_modify@(p text, op text, ms text[]) RETURNS bigint
LANGUAGE plpgsql AS $fn$
BEGIN
  -- '%': the pools' names apart from the locks' (a collision only serializes).
  PERFORM pg_advisory_xact_lock(@class@, hashtext('%' || p));
  IF op = 'replace' OR op = 'clear' THEN
    DELETE FROM @pools@ WHERE pool = p;
  END IF;
  IF op = 'add' OR op = 'replace' THEN
    INSERT INTO @pools@ (pool, member) SELECT p, m FROM unnest(ms) AS m
      ON CONFLICT DO NOTHING;
  ELSIF op = 'rem' THEN
    DELETE FROM @pools@ WHERE pool = p AND member = ANY (ms);
  END IF;
  RETURN (SELECT count(*) FROM @pools@ WHERE pool = p);
END
$fn$;

CREATE OR REPLACE FUNCTION @pool_members@(p text) RETURNS SETOF text
LANGUAGE sql AS $fn$
  SELECT member FROM @pools@ WHERE pool = p
$fn$;

CREATE OR REPLACE FUNCTION @pool_holders@(p text, OUT member text, OUT token text, OUT ms bigint)
RETURNS SETOF record LANGUAGE sql AS $fn$
  SELECT m.member, l.token, @ms@(l.expires_at, clock_timestamp())
    FROM @pools@ m
    LEFT JOIN @locks@ l
      ON l.key = m.member AND l.token IS NOT NULL AND l.expires_at > clock_timestamp()
    WHERE m.pool = p
$fn$;

CREATE OR REPLACE FUNCTION @complete@(
  k text, tok text, fp bytea, meta bytea, body bytea, at_ms bigint, kept bigint,
  retention_ms bigint)
RETURNS integer LANGUAGE plpgsql AS $fn$
DECLARE
  t timestamptz;
  cur @locks@%ROWTYPE;
BEGIN
  PERFORM pg_advisory_xact_lock(@class@, hashtext(k));
  PERFORM set_config('synchronous_commit', 'on', true);
  t := clock_timestamp();
  SELECT * INTO cur FROM @locks@ WHERE key = k;
  IF NOT FOUND OR cur.token IS NULL OR cur.expires_at <= t THEN
    RETURN -2;
  END IF;
  IF cur.token <> tok THEN
    RETURN -1;
  END IF;
  INSERT INTO @records@ (key, fingerprint, meta, body, completed_at_ms, kept, expires_at)
    VALUES (k, fp, meta, body, at_ms, kept = 1,
            t + greatest(retention_ms, 1) * interval '1 millisecond')
    ON CONFLICT (key) DO UPDATE SET fingerprint = excluded.fingerprint,
      meta = excluded.meta, body = excluded.body, completed_at_ms = excluded.completed_at_ms,
      kept = excluded.kept, expires_at = excluded.expires_at;
  RETURN @handoff@(k, cur.fence, t);
END
$fn$;

CREATE OR REPLACE FUNCTION @record@(
  k text, OUT fingerprint text, OUT meta text, OUT body text, OUT completed_at_ms bigint,
  OUT kept integer)
RETURNS SETOF record LANGUAGE sql AS $fn$
  SELECT encode(r.fingerprint, 'hex'), encode(r.meta, 'hex'), encode(r.body, 'hex'),
         r.completed_at_ms, CASE WHEN r.kept THEN 1 ELSE 0 END
    FROM @records@ r
    WHERE r.key = k AND r.expires_at > clock_timestamp()
$fn$;

CREATE OR REPLACE FUNCTION @forget@(k text) RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
  live boolean;
BEGIN
  DELETE FROM @records@ WHERE key = k RETURNING expires_at > clock_timestamp() INTO live;
  RETURN CASE WHEN live THEN 1 ELSE 0 END;
END
$fn$;

CREATE OR REPLACE FUNCTION @holder@(k text, OUT token text, OUT ms bigint)
RETURNS SETOF record LANGUAGE sql AS $fn$
  SELECT l.token, @ms@(l.expires_at, clock_timestamp())
    FROM @locks@ l
    WHERE l.key = k AND l.token IS NOT NULL AND l.expires_at > clock_timestamp()
$fn$;

CREATE OR REPLACE FUNCTION @waiters@(k text) RETURNS bigint LANGUAGE sql AS $fn$
  SELECT count(*) FROM @tickets@ WHERE key = k AND deadline > clock_timestamp()
$fn$;

CREATE OR REPLACE FUNCTION @sweep@(margin_ms bigint) RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
  t timestamptz := clock_timestamp();
  leases bigint;
  tickets bigint;
  numbers bigint;
  records bigint;
BEGIN
  -- CASE: the lock is tried only for the rows to delete (AND evaluates in any order).
  DELETE FROM @locks@ WHERE CASE
    WHEN expires_at < t - margin_ms * interval '1 millisecond'
    THEN pg_try_advisory_xact_lock(@class@, hashtext(key)) ELSE false END;
  GET DIAGNOSTICS leases = ROW_COUNT;
  DELETE FROM @tickets@ WHERE CASE
    WHEN deadline < t THEN pg_try_advisory_xact_lock(@class@, hashtext(key)) ELSE false END;
  GET DIAGNOSTICS tickets = ROW_COUNT;
  DELETE FROM @numbers@ WHERE CASE
    WHEN expires_at < t THEN pg_try_advisory_xact_lock(@class@, hashtext('#' || key))
    ELSE false END;
  GET DIAGNOSTICS numbers = ROW_COUNT;
  DELETE FROM @records@ WHERE expires_at < t;
  GET DIAGNOSTICS records = ROW_COUNT;
  RETURN leases + tickets + numbers + records;
END
$fn$;

DELETE FROM @version@;
INSERT INTO @version@ (version) VALUES (@schema_version@);
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_plain_identifiers() {
        assert!(Names::new("tower_lock", "").is_ok());
        assert!(Names::new("s1", "app_").is_ok());
        for (schema, prefix) in [
            ("", ""),
            ("1s", ""),
            ("Upper", ""),
            ("s\"x", ""),
            ("s", "a b"),
            ("s", &"p".repeat(MAX_NAME_LEN + 1)),
        ] {
            let e = Names::new(schema, prefix).unwrap_err();
            assert_eq!(e.kind(), BackendErrorKind::Config);
        }
    }

    #[test]
    fn the_migration_names_everything() {
        let sql = Names::new("s", "p_").unwrap().migration();
        assert!(!sql.contains('@'), "an unfilled name: {sql}");
        assert!(sql.contains("\"s\".\"p_locks\""));
        assert!(sql.contains("'s.p_wake'"));
    }
}
