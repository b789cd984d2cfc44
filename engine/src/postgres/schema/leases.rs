//! The functions of a lease's life and of inspection: extend, the watchdog's batched
//! renewal, the holders, the waiters; and the sweeper's.

/// The lease and inspection functions, each with its contract.
///
/// # `extend(k, tok, ms, mode, lim) -> bigint`
///
/// `tok`'s lease of `k` in mode `lim` (`0`: the lock, else shared). `mode` `'add'`: the
/// expiry moves `ms` later; `'replace'`: it becomes now + `ms` (at least 1 ms from now
/// either way). Returns the new remaining ms, `-1` another token holds `k`, `-2` nobody
/// does.
///
/// # `renew(ks, toks, ttls, lims) -> text`
///
/// The watchdog's batch, both modes (`lims`, `0` the lock; none: all the lock): for each
/// lease still held by its token, the expiry becomes the later of its current one and now +
/// its TTL (a renewal never shortens a lease: one that lands after an extension must not
/// undo it; it also turns a hand-off's claim into the full TTL). Returns one character per
/// lease, `1` renewed, `0` no longer held by that token. In the hash order of the keys,
/// each key's row locked first: one `UPDATE` per lock, two per shared lease (the row's
/// `shared_until`, then the lease).
///
/// # `holder(k) -> (token, ms, kind, fence, label)`, `waiters(k) -> bigint`
///
/// Reads, one snapshot: the live holders of `k`, its lock (`kind` `'x'`) and its shared
/// leases (`'a'` alone, `'s'` beside others), each with its remaining ms, its grant's
/// fence and its label (no row when free); the live tickets of its queue. (Version 4's
/// `holder` had no `fence` and `label`: the `V5_LABEL` step drops it, its type changed.) (Version 1's `holder` answered the lock's only,
/// without `kind`: the migration drops it first, its type changed.)
///
/// # `sweep(margin_ms, batch, try_only) -> bigint`
///
/// Deletes the rows that stopped holding more than `margin_ms` ago (tombstones and lapsed
/// leases, their shared leases too) unless someone queues for their key, the shared leases
/// that ran out and the dead tickets (each only if its key's row is free of calls right
/// now: its lock tried, never waited for), the expired numbers and records; clears `queued`
/// on the rows whose queue is empty; returns how many rows it deleted. Each step finds its
/// rows by an index on their expiry, at most `batch` of them (`0`, a version 4 node's
/// call: no limit), so a sweep costs what expired, never a scan of the table; a caller
/// sweeps again while a sweep deleted `batch` rows or more. One sweep at a time in the
/// fleet: it takes the transaction-level advisory lock `(class, 1)` first; with `try_only
/// = 1` it returns `-1` at once if another node's sweep holds it, else it waits for it.
pub(super) const FUNCTIONS: &str = r#"
CREATE OR REPLACE FUNCTION @extend@(k text, tok text, ms bigint, mode text, lim bigint DEFAULT 0)
RETURNS bigint LANGUAGE plpgsql AS $fn$
DECLARE
  t timestamptz;
  c @locks@%ROWTYPE;
  e timestamptz;
  sc text;
BEGIN
  sc := set_config('synchronous_commit', 'off', true);
  SELECT * INTO c FROM @locks@ WHERE key = k FOR NO KEY UPDATE;
  t := clock_timestamp();
  IF lim = 0 AND c.token = tok AND c.expires_at > t THEN
    e := c.expires_at;
  ELSIF lim > 0 AND c.shared_until > t THEN
    SELECT expires_at INTO e FROM @shared@ WHERE key = k AND token = tok AND expires_at > t;
  END IF;
  IF e IS NULL THEN
    RETURN CASE WHEN (c.token IS NOT NULL AND c.expires_at > t)
      OR EXISTS (SELECT 1 FROM @shared@ WHERE key = k AND expires_at > t) THEN -1 ELSE -2 END;
  END IF;
  IF mode = 'add' AND isfinite(e) THEN
    e := e + ms * interval '1 millisecond';
  ELSE
    e := t + ms * interval '1 millisecond';
  END IF;
  e := greatest(e, t + interval '1 millisecond');
  IF lim = 0 THEN
    UPDATE @locks@ SET expires_at = e WHERE key = k;
  ELSE
    UPDATE @shared@ SET expires_at = e WHERE key = k AND token = tok;
    UPDATE @locks@ SET shared_until = greatest(shared_until, e) WHERE key = k;
  END IF;
  RETURN @ms@(e, t);
END
$fn$;

CREATE OR REPLACE FUNCTION @renew@(ks text[], toks text[], ttls bigint[], lims bigint[] DEFAULT NULL)
RETURNS text LANGUAGE plpgsql AS $fn$
DECLARE
  t timestamptz;
  e timestamptz;
  i integer;
  renewed text[] := array_fill('0'::text, ARRAY[coalesce(array_length(ks, 1), 0)]);
  sc text;
BEGIN
  sc := set_config('synchronous_commit', 'off', true);
  -- The rows' locks in hash order, as any other batch takes them: no cycle.
  FOR i IN SELECT o FROM generate_subscripts(ks, 1) AS o ORDER BY hashtext(ks[o]), o LOOP
    t := clock_timestamp();
    e := t + ttls[i] * interval '1 millisecond';
    IF coalesce(lims[i], 0) = 0 THEN
      UPDATE @locks@ SET expires_at = greatest(expires_at, e)
        WHERE key = ks[i] AND token = toks[i] AND expires_at > t;
    ELSE
      -- The key's row first (its lock, as every call takes it), only if shared leases
      -- may be live; `shared_until` stays an upper bound if this one is not.
      UPDATE @locks@ SET shared_until = greatest(shared_until, e)
        WHERE key = ks[i] AND shared_until > t;
      IF FOUND THEN
        UPDATE @shared@ SET expires_at = greatest(expires_at, e)
          WHERE key = ks[i] AND token = toks[i] AND expires_at > t;
      END IF;
    END IF;
    IF FOUND THEN
      renewed[i] := '1';
    END IF;
  END LOOP;
  RETURN array_to_string(renewed, '');
END
$fn$;

DO $do$ BEGIN
  IF EXISTS (SELECT 1 FROM pg_proc WHERE oid = to_regprocedure('@holder@(text)')
               AND NOT ('kind' = ANY (proargnames))) THEN
    DROP FUNCTION @holder@(text);
  END IF;
END $do$;

CREATE OR REPLACE FUNCTION @holder@(k text, OUT token text, OUT ms bigint, OUT kind text,
  OUT fence bigint, OUT label text)
RETURNS SETOF record LANGUAGE sql AS $fn$
  SELECT l.token, @ms@(l.expires_at, clock_timestamp()), 'x', l.fence, l.label
    FROM @locks@ l
    WHERE l.key = k AND l.token IS NOT NULL AND l.expires_at > clock_timestamp()
  UNION ALL
  SELECT s.token, @ms@(s.expires_at, clock_timestamp()), CASE WHEN s.alone THEN 'a' ELSE 's' END,
      s.fence, s.label
    FROM @shared@ s
    WHERE s.key = k AND s.expires_at > clock_timestamp()
$fn$;

CREATE OR REPLACE FUNCTION @waiters@(k text) RETURNS bigint LANGUAGE sql AS $fn$
  SELECT count(*) FROM @tickets@ WHERE key = k AND deadline > clock_timestamp()
$fn$;

CREATE OR REPLACE FUNCTION @sweep@(margin_ms bigint, batch bigint DEFAULT 0,
  try_only bigint DEFAULT 0) RETURNS bigint
LANGUAGE plpgsql
-- Each statement planned with its values, and by the expiry indexes: a generic plan (what
-- a pooled session's cached plans become after five calls) reads a cutoff it cannot see
-- as a third of the table and sorts the whole table for the first 1,000 rows.
SET plan_cache_mode = force_custom_plan
SET enable_seqscan = off
AS $fn$
DECLARE
  t timestamptz := clock_timestamp();
  old timestamptz := clock_timestamp() - margin_ms * interval '1 millisecond';
  -- `LIMIT NULL`: no limit (a version 4 node's call).
  most bigint := CASE WHEN batch > 0 THEN batch END;
  leases bigint;
  tickets bigint;
  shared bigint;
  numbers bigint;
  records bigint;
  ks text[];
BEGIN
  -- One sweeper at a time in the fleet: a node that finds another sweeping leaves it the
  -- work (`try_only`), or waits for its batch to end (a sweep asked for by hand).
  IF try_only = 1 THEN
    IF NOT pg_try_advisory_xact_lock(@class@, 1) THEN
      RETURN -1;
    END IF;
  ELSE
    PERFORM pg_advisory_xact_lock(@class@, 1);
  END IF;
  -- Each step reads what expired by an index on its expiry, at most `batch` rows: its cost
  -- is what expired, not the table. A key's tickets, shared leases and `queued` flag
  -- change only under its row's lock: the rows of the keys with dead tickets or lapsed
  -- shared leases, locked (those a call holds skipped), then those deleted (and any of a
  -- key without a row).
  SELECT coalesce(array_agg(key), '{}') INTO ks FROM (
    SELECT l.key FROM @locks@ l
      WHERE l.key = ANY (ARRAY(
        (SELECT w.key FROM @tickets@ w WHERE w.deadline < t ORDER BY w.deadline LIMIT most)
        UNION
        (SELECT s.key FROM @shared@ s WHERE s.expires_at < t ORDER BY s.expires_at LIMIT most)))
      FOR NO KEY UPDATE OF l SKIP LOCKED) s;
  DELETE FROM @tickets@ w WHERE w.deadline < t
    AND (w.key = ANY (ks) OR NOT EXISTS (SELECT 1 FROM @locks@ l WHERE l.key = w.key));
  GET DIAGNOSTICS tickets = ROW_COUNT;
  DELETE FROM @shared@ s WHERE s.expires_at < t
    AND (s.key = ANY (ks) OR NOT EXISTS (SELECT 1 FROM @locks@ l WHERE l.key = s.key));
  GET DIAGNOSTICS shared = ROW_COUNT;
  -- The keys nobody queues for any more (by the index of the queued rows), locked, then
  -- (a snapshot taken under their locks: no registration is in flight) cleared.
  SELECT coalesce(array_agg(key), '{}') INTO ks FROM (
    SELECT l.key FROM @locks@ l
      WHERE l.queued AND NOT EXISTS (SELECT 1 FROM @tickets@ w WHERE w.key = l.key)
      LIMIT most
      FOR NO KEY UPDATE OF l SKIP LOCKED) s;
  UPDATE @locks@ l SET queued = false
    WHERE l.key = ANY (ks) AND NOT EXISTS (SELECT 1 FROM @tickets@ w WHERE w.key = l.key);
  -- The rows that stopped holding long ago, in both modes, and nobody queues for (by the
  -- index of their last expiry in either mode, which leaves the queued rows out).
  DELETE FROM @locks@ WHERE key IN (
    SELECT key FROM @locks@
      WHERE greatest(expires_at, shared_until) < old AND NOT queued
      ORDER BY greatest(expires_at, shared_until)
      LIMIT most
      FOR UPDATE SKIP LOCKED);
  GET DIAGNOSTICS leases = ROW_COUNT;
  DELETE FROM @numbers@ n WHERE n.key IN (
      SELECT key FROM @numbers@ WHERE expires_at < t ORDER BY expires_at LIMIT most)
    AND CASE WHEN n.expires_at < t
      THEN pg_try_advisory_xact_lock(@class@, hashtext('#' || n.key)) ELSE false END;
  GET DIAGNOSTICS numbers = ROW_COUNT;
  DELETE FROM @records@ r WHERE r.key IN (
      SELECT key FROM @records@ WHERE expires_at < t ORDER BY expires_at LIMIT most)
    AND r.expires_at < t;
  GET DIAGNOSTICS records = ROW_COUNT;
  RETURN leases + tickets + shared + numbers + records;
END
$fn$;
"#;
