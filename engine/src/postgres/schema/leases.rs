//! The functions of a lease's life and of inspection: extend, the watchdog's batched
//! renewal, the holder, the waiters; and the sweeper's.

/// The lease and inspection functions, each with its contract.
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
/// `UPDATE` per lease, in the hash order of the keys (each locks its key's row).
///
/// # `holder(k) -> (token, ms, kind)`, `waiters(k) -> bigint`
///
/// Reads, one snapshot for both spaces of `k`: the live holders, the lock's (`kind` `'x'`)
/// and the shared leases' (`'a'` alone, `'s'` beside others), each with its remaining ms
/// (no row when free); the live tickets of both queues. (Version 1's `holder` answered
/// the lock's only, without `kind`: the migration drops it first, its type changed.)
///
/// # `sweep(margin_ms) -> bigint`
///
/// Deletes the rows that stopped holding more than `margin_ms` ago (tombstones and lapsed
/// leases) unless someone queues for their key, the shared leases that ran out, the shared
/// fence rows whose fence is more than `margin_ms` in the past (see `shared_fence`), the dead
/// tickets of both queues and the expired numbers, each only if its key is free of calls right
/// now (its row's lock, or its advisory lock, tried: the sweep never waits for a call); clears
/// `queued` on the rows whose queue is empty; returns how many rows it deleted.
pub(super) const FUNCTIONS: &str = r#"
CREATE OR REPLACE FUNCTION @extend@(k text, tok text, ms bigint, mode text) RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
  t timestamptz;
  cur @locks@%ROWTYPE;
  e timestamptz;
  sc text;
BEGIN
  sc := set_config('synchronous_commit', 'on', true);
  SELECT * INTO cur FROM @locks@ WHERE key = k FOR NO KEY UPDATE;
  t := clock_timestamp();
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
  renewed text[] := array_fill('0'::text, ARRAY[coalesce(array_length(ks, 1), 0)]);
  sc text;
BEGIN
  sc := set_config('synchronous_commit', 'on', true);
  -- The rows' locks in hash order, as any other batch takes them: no cycle.
  FOR i IN SELECT o FROM generate_subscripts(ks, 1) AS o ORDER BY hashtext(ks[o]), o LOOP
    t := clock_timestamp();
    UPDATE @locks@ SET expires_at = greatest(expires_at, t + ttls[i] * interval '1 millisecond')
      WHERE key = ks[i] AND token = toks[i] AND expires_at > t;
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

CREATE OR REPLACE FUNCTION @holder@(k text, OUT token text, OUT ms bigint, OUT kind text)
RETURNS SETOF record LANGUAGE sql AS $fn$
  SELECT l.token, @ms@(l.expires_at, clock_timestamp()), 'x'
    FROM @locks@ l
    WHERE l.key = k AND l.token IS NOT NULL AND l.expires_at > clock_timestamp()
  UNION ALL
  SELECT s.token, @ms@(s.expires_at, clock_timestamp()), CASE WHEN s.alone THEN 'a' ELSE 's' END
    FROM @shared@ s
    WHERE s.key = k AND s.expires_at > clock_timestamp()
$fn$;

CREATE OR REPLACE FUNCTION @waiters@(k text) RETURNS bigint LANGUAGE sql AS $fn$
  SELECT (SELECT count(*) FROM @tickets@ WHERE key = k AND deadline > clock_timestamp())
       + (SELECT count(*) FROM @shared_tickets@ WHERE key = k AND deadline > clock_timestamp())
$fn$;

CREATE OR REPLACE FUNCTION @sweep@(margin_ms bigint) RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
  t timestamptz := clock_timestamp();
  leases bigint;
  tickets bigint;
  numbers bigint;
  records bigint;
  shared bigint;
  fences bigint;
  shared_tickets bigint;
  ks text[];
BEGIN
  -- A key's tickets and its `queued` flag change only under its row's lock: the rows of the
  -- keys with dead tickets, locked (those a call holds skipped), then their dead tickets
  -- deleted (and any of a key without a row, which an older schema could leave).
  SELECT coalesce(array_agg(key), '{}') INTO ks FROM (
    SELECT l.key FROM @locks@ l
      WHERE EXISTS (SELECT 1 FROM @tickets@ w WHERE w.key = l.key AND w.deadline < t)
      FOR NO KEY UPDATE OF l SKIP LOCKED) s;
  DELETE FROM @tickets@ w WHERE w.deadline < t
    AND (w.key = ANY (ks) OR NOT EXISTS (SELECT 1 FROM @locks@ l WHERE l.key = w.key));
  GET DIAGNOSTICS tickets = ROW_COUNT;
  -- The keys nobody queues for any more, locked, then (a snapshot taken under their locks:
  -- no registration is in flight) cleared.
  SELECT coalesce(array_agg(key), '{}') INTO ks FROM (
    SELECT l.key FROM @locks@ l
      WHERE l.queued AND NOT EXISTS (SELECT 1 FROM @tickets@ w WHERE w.key = l.key)
      FOR NO KEY UPDATE OF l SKIP LOCKED) s;
  UPDATE @locks@ l SET queued = false
    WHERE l.key = ANY (ks) AND NOT EXISTS (SELECT 1 FROM @tickets@ w WHERE w.key = l.key);
  -- The rows that stopped holding long ago and nobody queues for.
  DELETE FROM @locks@ WHERE key IN (
    SELECT key FROM @locks@
      WHERE expires_at < t - margin_ms * interval '1 millisecond' AND NOT queued
      FOR UPDATE SKIP LOCKED);
  GET DIAGNOSTICS leases = ROW_COUNT;
  DELETE FROM @shared@ WHERE CASE
    WHEN expires_at < t THEN pg_try_advisory_xact_lock(@class@, hashtext('&' || key))
    ELSE false END;
  GET DIAGNOSTICS shared = ROW_COUNT;
  DELETE FROM @shared_fences@ WHERE CASE
    WHEN fence < floor(extract(epoch FROM t - margin_ms * interval '1 millisecond') * 1000000)
    THEN pg_try_advisory_xact_lock(@class@, hashtext('&' || key)) ELSE false END;
  GET DIAGNOSTICS fences = ROW_COUNT;
  DELETE FROM @shared_tickets@ WHERE CASE
    WHEN deadline < t THEN pg_try_advisory_xact_lock(@class@, hashtext('&' || key))
    ELSE false END;
  GET DIAGNOSTICS shared_tickets = ROW_COUNT;
  DELETE FROM @numbers@ WHERE CASE
    WHEN expires_at < t THEN pg_try_advisory_xact_lock(@class@, hashtext('#' || key))
    ELSE false END;
  GET DIAGNOSTICS numbers = ROW_COUNT;
  DELETE FROM @records@ WHERE expires_at < t;
  GET DIAGNOSTICS records = ROW_COUNT;
  RETURN leases + tickets + numbers + records + shared + fences + shared_tickets;
END
$fn$;
"#;
