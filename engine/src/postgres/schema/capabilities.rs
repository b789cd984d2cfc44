//! The functions of the optional capabilities: admin operations, numeric compare-and-set,
//! lock pools, records written with the release.

/// The capability functions, each with its contract.
///
/// # `admin_set(k, tok, ms) -> integer`, `force_release(k) -> integer`
///
/// Admin, ignoring ownership: make `tok` the holder for `ms` (`< 0`: no expiry, an
/// `infinity` expiry) with a fresh fence, waiters left waiting; release whoever holds `k`
/// (its lock and its shared leases), granting the waiters that now fit (`pump`), `1` if
/// it was held, else `0`.
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
/// release it, granting the waiters that now fit (`pump`), under the key's row lock: the record appears in the
/// same commit as the release, so a waiter granted by it finds the record. `-1` another
/// token holds `k`, `-2` nobody does: nothing is written. `record(k)`: the live record, its
/// bytes as hex (the text protocol carries them whole). `forget(k)`: delete it, `1` if it
/// was live.
pub(super) const FUNCTIONS: &str = r#"
CREATE OR REPLACE FUNCTION @admin_set@(k text, tok text, ms bigint) RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
  t timestamptz;
  e timestamptz;
  sc text;
BEGIN
  sc := set_config('synchronous_commit', 'off', true);
  t := clock_timestamp();
  IF ms < 0 THEN
    e := 'infinity';
  ELSE
    e := t + greatest(ms, 1) * interval '1 millisecond';
  END IF;
  -- One statement on the row, under its lock: the fence from its latest version, `queued`
  -- kept (the waiters wait on).
  INSERT INTO @locks@ AS l (key, token, fence, expires_at)
    VALUES (k, tok, floor(extract(epoch FROM t) * 1000000)::bigint, e)
    ON CONFLICT (key) DO UPDATE
      SET token = excluded.token, fence = greatest(l.fence + 1, excluded.fence),
          expires_at = excluded.expires_at, label = NULL;
  RETURN 1;
END
$fn$;

CREATE OR REPLACE FUNCTION @force_release@(k text) RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
  t timestamptz;
  c @locks@%ROWTYPE;
  held boolean;
  sc text;
BEGIN
  sc := set_config('synchronous_commit', 'off', true);
  SELECT * INTO c FROM @locks@ WHERE key = k FOR NO KEY UPDATE;
  t := clock_timestamp();
  IF NOT FOUND THEN
    RETURN 0;
  END IF;
  held := c.token IS NOT NULL AND c.expires_at > t;
  c.token := NULL;
  c.expires_at := least(c.expires_at, t);
  IF c.shared_until > t THEN
    DELETE FROM @shared@ WHERE key = k AND expires_at > t;
    held := held OR FOUND;
  END IF;
  PERFORM @pump@(c, t, true, '', '', 0, -1);
  RETURN CASE WHEN held THEN 1 ELSE 0 END;
END
$fn$;

CREATE OR REPLACE FUNCTION @compare_and_set@(
  k text, cmp text, given double precision, eps double precision, action text, ms bigint)
RETURNS integer LANGUAGE plpgsql AS $fn$
DECLARE
  t timestamptz;
  s double precision;
  ok boolean;
  sc text;
BEGIN
  -- '#': the numbers' keys apart from the locks' (a collision only serializes).
  PERFORM pg_advisory_xact_lock(@class@, hashtext('#' || k));
  sc := set_config('synchronous_commit', 'on', true);
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
  c @locks@%ROWTYPE;
  sc text;
BEGIN
  sc := set_config('synchronous_commit', 'on', true);
  SELECT * INTO c FROM @locks@ WHERE key = k FOR NO KEY UPDATE;
  t := clock_timestamp();
  IF NOT FOUND OR c.token IS NULL OR c.expires_at <= t THEN
    RETURN -2;
  END IF;
  IF c.token <> tok THEN
    RETURN -1;
  END IF;
  INSERT INTO @records@ (key, fingerprint, meta, body, completed_at_ms, kept, expires_at)
    VALUES (k, fp, meta, body, at_ms, kept = 1,
            t + greatest(retention_ms, 1) * interval '1 millisecond')
    ON CONFLICT (key) DO UPDATE SET fingerprint = excluded.fingerprint,
      meta = excluded.meta, body = excluded.body, completed_at_ms = excluded.completed_at_ms,
      kept = excluded.kept, expires_at = excluded.expires_at;
  c.token := NULL;
  c.expires_at := t;
  PERFORM @pump@(c, t, true, '', '', 0, -1);
  RETURN 1;
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
"#;
