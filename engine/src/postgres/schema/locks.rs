//! The functions that get and give a key: acquire (or queue as a waiter), release, the
//! hand-off a release makes, and a waiter's leaving.

/// The lock functions, each with its contract.
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
/// Statements inside: a grant of a free key 6 (lock, synchronous commit, `SELECT` the row,
/// dead tickets, queue head, upsert); a re-entry 4 or 5; a waiter's registration or refresh
/// 4 to 8.
///
/// # `release(k, tok) -> integer`
///
/// `-2` nobody holds `k` (nothing done), `-1` another token holds it (nothing done), `1`
/// released (the row becomes the fence tombstone), `2` handed to the next waiter
/// (`handoff`). Statements inside: 3 (lock, synchronous commit, `SELECT` the row), and
/// `handoff`'s 3 (dead tickets, pop the head, `UPDATE` the row), 4 with the `NOTIFY`.
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
/// # `ms(e, t) -> bigint`
///
/// The ms from `t` to `e`, rounded up; `-1` for no expiry.
pub(super) const FUNCTIONS: &str = r#"
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
"#;
