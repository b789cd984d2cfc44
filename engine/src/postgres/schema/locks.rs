//! The functions that get and give a key: acquire (or queue as a waiter), release, the
//! hand-off a release makes, and a waiter's leaving.

/// The lock functions, each with its contract.
///
/// # What serializes a key's calls: its row's lock
///
/// Every function that changes a key's lease or its queue holds the lock of the key's row
/// (`locks`, a row lock until commit) before it reads what it decides on: a fast path's one
/// statement takes it itself (an `UPDATE`, or the conflict of an `INSERT … ON CONFLICT DO
/// UPDATE`, which locks the row even when its `WHERE` is false), a slow path by `SELECT … FOR
/// NO KEY UPDATE`. A statement that waited for the lock evaluates its `WHERE` on the row's
/// latest version (READ COMMITTED's re-check), and a slow path's later statements read with a
/// snapshot taken after it: each call sees the state the previous one committed. Tickets
/// are written only under the row's lock, and a key with tickets always has its row, with
/// `queued` true (the registration sets it in the same transaction): `queued` false means
/// no ticket exists. It is cleared only under the row's lock, once no ticket is left (a
/// hand-off or a grant that finds none, the sweeper). A fast path therefore decides on the
/// row alone: it never reads the tickets table, whose statement snapshot could miss a ticket
/// committed while it waited.
///
/// The fast paths apply only when `queued` is false:
///
/// - an acquire of a free key (no row, a tombstone, a lapsed lease): one upsert;
/// - a release by the holder: one `UPDATE` to the tombstone.
///
/// A newcomer so never overtakes a live ticket (the row says someone queues, so it goes the
/// slow way, where only the queue's first live ticket takes a free key), and a release never
/// frees a key someone queues for without handing it over: a registration racing with the
/// release either commits first (the release's re-check then sees `queued` and takes the slow
/// way, which hands off) or waits for the row's lock and then finds the key free.
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
/// Statements inside: a grant of a free key nobody queues for 1 (the fast upsert; the
/// synchronous commit and the clock are expressions, no statement), 2 for a try (`tid =
/// ''`), which first reads the row: a try on a key another holds is answered from that read
/// alone, without locking the row (no write, nothing to flush at commit). Otherwise the
/// failed upsert (which locked the row), the row's read, then: a re-entry 2 or 3 more; a
/// grant as the queue's head 4 (dead tickets, queue head, the row, its ticket); a waiter's
/// registration 3 to 5 (4 to 6 when the queue was empty: `queued` set).
///
/// # `release(k, tok) -> integer`
///
/// `-2` nobody holds `k` (nothing done), `-1` another token holds it (nothing done), `1`
/// released (the row becomes the fence tombstone), `2` handed to the next waiter
/// (`handoff`). Statements inside: 1 when nobody queues (the fast `UPDATE`); else 2 (the
/// failed `UPDATE`, the row read and locked) and `handoff`'s 3, 4 with the `NOTIFY`.
///
/// # `handoff(k, f, t) -> integer` (called with `k`'s row locked)
///
/// Deletes `k`'s dead tickets, then pops its first live one: makes that ticket's token the
/// holder for `min(its TTL, its claim)` with fence `f + 1`, and `NOTIFY`s
/// `"<ticket id> <fence> <claim ms>"` on the backend's channel (delivered at commit);
/// returns 2 (`queued` stays: more may wait). No live ticket: the row becomes a tombstone
/// (token `NULL`, expiring now, `queued` false: none is left), nobody is notified; returns 1.
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
    UPDATE @locks@ SET token = NULL, expires_at = t, queued = false WHERE key = k;
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
  sc text;
BEGIN
  -- An expression, not a statement (`PERFORM` would run a query).
  sc := set_config('synchronous_commit', 'on', true);
  IF tid = '' THEN
    -- A try on a key another holds is answered from the snapshot, the row left unlocked: a
    -- read, with no transaction id and no commit record to flush.
    SELECT * INTO cur FROM @locks@ WHERE key = k;
    t := clock_timestamp();
    IF cur.token <> tok AND cur.expires_at > t THEN
      status := 0;
      val := @ms@(cur.expires_at, t);
      RETURN;
    END IF;
  END IF;
  LOOP
    t := clock_timestamp();
    -- The fast path: a free key nobody queues for. Its conflict locks the row either way.
    INSERT INTO @locks@ AS l (key, token, fence, expires_at, queued)
      VALUES (k, tok, floor(extract(epoch FROM t) * 1000000)::bigint,
              t + ttl_ms * interval '1 millisecond', false)
      ON CONFLICT (key) DO UPDATE
        SET token = excluded.token, fence = greatest(l.fence + 1, excluded.fence),
            expires_at = excluded.expires_at
        WHERE NOT l.queued AND (l.token IS NULL OR l.expires_at <= t)
      RETURNING l.fence INTO f;
    IF FOUND THEN
      status := 1;
      val := f;
      RETURN;
    END IF;
    -- The row is this transaction's now (locked by the conflict): read it after the wait.
    SELECT * INTO cur FROM @locks@ WHERE key = k FOR NO KEY UPDATE;
    -- (Never absent while locked; if it were, the upsert goes again.)
    EXIT WHEN FOUND;
  END LOOP;
  t := clock_timestamp();
  live := cur.token IS NOT NULL AND cur.expires_at > t;
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
      f := greatest(cur.fence + 1, floor(extract(epoch FROM t) * 1000000)::bigint);
      -- No live ticket left: nobody queues any more. Else others may still (conservative).
      UPDATE @locks@
        SET token = tok, fence = f, expires_at = t + ttl_ms * interval '1 millisecond',
            queued = head IS NOT NULL
        WHERE key = k;
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
  -- In the ticket's transaction: the fast paths see it from its commit on.
  IF NOT cur.queued THEN
    UPDATE @locks@ SET queued = true WHERE key = k;
  END IF;
  status := 0;
END
$fn$;

CREATE OR REPLACE FUNCTION @release@(k text, tok text) RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
  t timestamptz;
  cur @locks@%ROWTYPE;
  sc text;
BEGIN
  sc := set_config('synchronous_commit', 'on', true);
  t := clock_timestamp();
  -- The fast path: nobody queues, so the key is simply freed.
  UPDATE @locks@ SET token = NULL, expires_at = t
    WHERE key = k AND token = tok AND expires_at > t AND NOT queued;
  IF FOUND THEN
    RETURN 1;
  END IF;
  SELECT * INTO cur FROM @locks@ WHERE key = k FOR NO KEY UPDATE;
  -- After the lock's wait, if any.
  t := clock_timestamp();
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
  sc text;
BEGIN
  sc := set_config('synchronous_commit', 'on', true);
  -- Locked before the ticket goes: a hand-off running now must not see it vanish midway.
  SELECT * INTO cur FROM @locks@ WHERE key = k FOR NO KEY UPDATE;
  t := clock_timestamp();
  IF tid <> '' THEN
    DELETE FROM @tickets@ WHERE key = k AND id = tid;
  END IF;
  IF cur.key IS NULL OR cur.token IS NULL OR cur.expires_at <= t THEN
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
