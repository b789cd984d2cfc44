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
/// `UPDATE` per lease, after the locks of every key in hash order.
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
/// leases), the shared leases that ran out, the shared fence rows whose fence is more than
/// `margin_ms` in the past (see `shared_fence`), the dead tickets of both queues and the
/// expired numbers, each only if its key's lock is free right now (a try, so the sweep
/// never waits for a call); returns how many.
pub(super) const FUNCTIONS: &str = r#"
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
BEGIN
  -- CASE: the lock is tried only for the rows to delete (AND evaluates in any order).
  DELETE FROM @locks@ WHERE CASE
    WHEN expires_at < t - margin_ms * interval '1 millisecond'
    THEN pg_try_advisory_xact_lock(@class@, hashtext(key)) ELSE false END;
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
  DELETE FROM @tickets@ WHERE CASE
    WHEN deadline < t THEN pg_try_advisory_xact_lock(@class@, hashtext(key)) ELSE false END;
  GET DIAGNOSTICS tickets = ROW_COUNT;
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
