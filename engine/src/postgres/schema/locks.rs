//! The functions that get and give a key, in either mode: acquire (or queue as a waiter),
//! release, a waiter's leaving, and the pump that grants the queue's head as many as fit.

/// The key's functions, each with its contract.
///
/// # One space per key: its row, and its shared leases
///
/// A key's row (`locks`) holds its lone holder (`token`, `expires_at`: the lock, a request
/// with `lim = 0`), the last fence granted in either mode, `queued`, and `shared_until`: no
/// shared lease of the key (`shared_leases`, one row per holder, `alone` for a limit of 1)
/// lasts past it. A request fits when it asks to hold alone (the lock, or `lim = 1`) and
/// nobody holds, or shares (`lim >= 2`) and nobody holds alone and fewer than `lim` share.
///
/// # What serializes a key's calls: its row's lock
///
/// Every function that changes a key's holders or its queue holds the lock of the key's row
/// (a row lock until commit) before it reads what it decides on: a fast path's one
/// statement takes it itself (an `UPDATE`, or the conflict of an `INSERT … ON CONFLICT DO
/// UPDATE`, which locks the row even when its `WHERE` is false), a slow path by `SELECT … FOR
/// NO KEY UPDATE`. A statement that waited for the lock evaluates its `WHERE` on the row's
/// latest version (READ COMMITTED's re-check), and a slow path's later statements read with a
/// snapshot taken after it: each call sees the state the previous one committed. Tickets
/// and shared leases are written only under the row's lock, and a key with tickets always
/// has its row, with `queued` true (the registration sets it in the same transaction):
/// `queued` false means no ticket exists. A fast path therefore decides on the row alone.
///
/// The fast paths apply to the lock only, when `queued` is false and no shared lease can be
/// live (`shared_until` past):
///
/// - an acquire of a free key (no row, a tombstone, a lapsed lease): one upsert;
/// - a release by the holder: one `UPDATE` to the tombstone.
///
/// A newcomer so never overtakes a live ticket of either mode, and a release never frees a
/// key someone queues for without handing it over.
///
/// # `pump(c, t, dirty, own, tok, ttl_ms, lim, lbl) -> bigint` (with the key's row locked)
///
/// `c` is the key's row as the caller has it (`dirty`: changed, to be written). Deletes the
/// shared leases that ran out and the dead tickets (all but `own`'s), then grants the queue
/// from its head as many as fit, stopping at the first that does not (a lone waiter is so
/// never overtaken by later shared arrivals), then, when nobody waits and `lim >= 0`, the
/// arrival `tok` itself for `ttl_ms` with limit `lim`. Each waiter granted becomes a
/// holder for `min(its TTL, its claim)` with fence `max(c.fence + 1, the server's start in
/// µs)` and is told by `NOTIFY "<ticket id> <fence> <claim ms> <nonce>"` (its
/// registration's nonce, which its waiter checks) on its node's channel alone
/// (`<base>_<node>` for a ticket id `<node>:<random>`; the base channel for an id without
/// `:`, a version 4 node's), except the caller's own ticket `own` and the arrival: those
/// get their full TTL and a fence of `max(c.fence + 1, clock in µs)`, learnt from the
/// reply. Either floor is past every fence of before a crash and restart, whatever the
/// crash took back of the last commits. A waiter whose token
/// already shares re-enters (its fence). Writes the row back once (its holder, fence,
/// `queued`, `shared_until`), if anything changed. Returns the fence granted to `own` or
/// the arrival, `-1` when none. Statements: 2 when someone queues (dead tickets, the
/// head; 1 more per grant), 2 when someone may hold shared (the lapsed ones, the count),
/// 1 or 2 per grant (a shared holder, `NOTIFY`), the write-back.
///
/// # `acquire(k, tok, ttl_ms, tid, ticket_ms, max_waiters, lim, reg, lbl) -> (status, val)`
///
/// Acquire `k` for `tok` in mode `lim` (`0` the lock, else a shared lease of that limit),
/// or register / refresh the waiter's ticket `tid` (`''`: a plain try that never
/// registers), carrying the registration's nonce `reg`. `lbl` is the holder's label
/// (`''`: none), stored in the `label` column of the lease's row (the key's, a shared
/// lease's, the ticket's, from which a hand-off copies it); no statement more. Returns `(1, fence)` granted; `(0, ms)` not granted (the
/// ticket registered or refreshed when one was given; `ms` the lone holder's remaining ms,
/// the first shared holder's, or `-2` when another waiter goes first); `(2, ms)` refused,
/// `max_waiters` (`-1`: no limit) live tickets already wait; `(4, 0)`: `tok` shares the
/// key and asks to hold it alone (not upgraded; its ticket removed).
///
/// Re-entry (`tok` holds `k`) sets the TTL to `ttl_ms` and keeps the fence; it is also how
/// a waiter whose notification was lost (or refused for its nonce) finds its grant. A
/// refresh writes the attempt's nonce into the ticket: a grant names the latest.
///
/// Statements inside: the lock on a free key nobody queues for 1 (the fast upsert; the
/// synchronous commit and the clock are expressions, no statement), 2 for a try (`tid =
/// ''`), which first reads the row: a try on a key another holds alone is answered from
/// that read, without locking the row. Otherwise the lock's upsert (which locked the row),
/// the row's read and lock (and a tombstone row made first for a shared request on a key
/// without one), then: a re-entry 1 to 3 more (the shared lease looked up when one may be
/// live); a waiter's refresh behind a lone holder 1; else the pump's, and a registration
/// 2 to 4 (the count against `max_waiters`, the ticket, `queued`).
///
/// # `release(k, tok, lim, rid) -> integer`
///
/// Releases `tok`'s lease of `k` in mode `lim` (`0`: the lock, else shared) and grants the
/// waiters that now fit (`pump`). `1` released (also when the release `rid`, a random id
/// per call, already ran: the key's row keeps the last one's, so a release sent again
/// reports what the first did), `-1` another holds `k`, `-2` nobody does. Statements: the
/// lock's nobody queues for 1 (the fast `UPDATE`); else the row read and locked, the lease
/// deleted (shared), then the pump's.
///
/// # `leave(k, tid, tok) -> bigint`
///
/// A waiter leaves (timed out, cancelled, failed): deletes its ticket, gives back a grant
/// it may have received unseen (either mode), and grants the waiters that now fit (the
/// ticket may have been the head that did not). Returns the lone holder's remaining ms, or
/// the first shared holder's, `-2` when nobody holds.
///
/// # `ms(e, t) -> bigint`, `us(t) -> bigint`
///
/// The ms from `t` to `e`, rounded up (`-1` for no expiry); `t` in µs (a fence's floor).
/// Both are inlined into the statements that call them: their bodies are immutable, as
/// declared (`extract(epoch FROM <timestamptz>)` is only stable, which kept `us` from being
/// inlined, and a SQL function that is not is parsed again at every call from plpgsql).
pub(super) const FUNCTIONS: &str = r#"
CREATE OR REPLACE FUNCTION @ms@(e timestamptz, t timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $fn$
  SELECT CASE WHEN isfinite(e) THEN ceil(extract(epoch FROM e - t) * 1000)::bigint ELSE -1 END
$fn$;

CREATE OR REPLACE FUNCTION @us@(t timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $fn$
  SELECT floor(extract(epoch FROM t - timestamptz 'epoch') * 1000000)::bigint
$fn$;

CREATE OR REPLACE FUNCTION @pump@(
  c @locks@, t timestamptz, dirty boolean, own text, tok text, ttl_ms bigint, lim bigint,
  lbl text DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $fn$
DECLARE
  w @tickets@%ROWTYPE;
  held bigint := 0;
  lone boolean := c.token IS NOT NULL AND c.expires_at > t;
  was boolean := c.queued;
  g bigint;
  f bigint;
  mine bigint := -1;
  sent text;
BEGIN
  IF c.shared_until > t THEN
    DELETE FROM @shared@ WHERE key = c.key AND expires_at <= t;
    SELECT count(*), lone OR coalesce(bool_or(alone), false), coalesce(max(expires_at), t)
      INTO held, lone, c.shared_until FROM @shared@ WHERE key = c.key;
    dirty := true;
  END IF;
  LOOP
    -- (`queued` false: no ticket to look for.)
    IF c.queued THEN
      SELECT * INTO w FROM @tickets@ WHERE key = c.key ORDER BY seq LIMIT 1;
      c.queued := FOUND;
      -- A lapsed ticket (its waiter gone) is dropped when it comes to the head, not all of
      -- the key's at every grant: a statement less per hand-off. `waiters` counts live
      -- ones; the sweeper drops the rest.
      IF FOUND AND w.deadline <= t AND w.id <> own THEN
        DELETE FROM @tickets@ WHERE key = c.key AND id = w.id;
        CONTINUE;
      END IF;
    END IF;
    IF NOT c.queued THEN
      -- Nobody waits: the arrival, if one asks (once).
      EXIT WHEN lim < 0;
      w.id := own;
      w.token := tok;
      w.ttl_ms := ttl_ms;
      w.lim := lim;
      w.label := lbl;
      lim := -1;
    END IF;
    EXIT WHEN lone OR held >= greatest(w.lim, 1);
    IF w.id = own THEN
      g := w.ttl_ms;
      f := greatest(c.fence + 1, @us@(t));
    ELSE
      g := least(w.ttl_ms, w.claim_ms);
      -- At least the server's start in µs: a crash may take back the last grants'
      -- commits (asynchronous commit) and the row's fence with them, and a ticket it kept
      -- would be granted a fence handed out before. Every fence of before the crash is
      -- below the clock at the crash, so below this run's start; a row written in this
      -- run is above it already (a hand-off stays `+ 1`).
      f := greatest(c.fence + 1, @us@(pg_postmaster_start_time()));
    END IF;
    IF w.lim = 0 THEN
      c.token := w.token;
      c.expires_at := t + g * interval '1 millisecond';
      c.fence := f;
      c.label := w.label;
      lone := true;
    ELSE
      INSERT INTO @shared@ AS s (key, token, fence, alone, expires_at, label)
        VALUES (c.key, w.token, f, w.lim = 1, t + g * interval '1 millisecond', w.label)
        -- A token that shares already re-enters (its fence); a lapsed row is replaced.
        ON CONFLICT (key, token) DO UPDATE SET
          fence = CASE WHEN s.expires_at > t THEN s.fence ELSE excluded.fence END,
          alone = CASE WHEN s.expires_at > t THEN s.alone ELSE excluded.alone END,
          label = CASE WHEN s.expires_at > t THEN s.label ELSE excluded.label END,
          expires_at = greatest(s.expires_at, excluded.expires_at)
        RETURNING s.fence INTO f;
      IF f > c.fence THEN
        c.fence := f;
        held := held + 1;
        lone := w.lim = 1;
      END IF;
      c.shared_until := greatest(c.shared_until, t + g * interval '1 millisecond');
    END IF;
    dirty := true;
    IF w.id = own THEN
      mine := f;
    ELSE
      -- To the ticket's node alone: `<node>:<random>` ids (a version 4 node's have no `:`
      -- and it listens on the base channel).
      -- An expression, not a statement (`PERFORM` would run a query).
      sent := pg_notify(CASE WHEN strpos(w.id, ':') > 0
                          THEN @channel@ || '_' || split_part(w.id, ':', 1)
                          ELSE @channel@ END,
                        w.id || ' ' || f || ' ' || g || ' ' || w.nonce)::text;
    END IF;
    IF w.seq IS NOT NULL THEN
      DELETE FROM @tickets@ WHERE key = c.key AND id = w.id;
    END IF;
    -- Nothing fits beside a lone holder: others may wait (`queued` stays).
    EXIT WHEN lone OR w.seq IS NULL;
  END LOOP;
  IF dirty OR c.queued <> was THEN
    UPDATE @locks@ SET token = c.token, fence = c.fence, expires_at = c.expires_at,
        queued = c.queued, shared_until = c.shared_until, released = c.released,
        label = c.label
      WHERE key = c.key;
  END IF;
  RETURN mine;
END
$fn$;

CREATE OR REPLACE FUNCTION @acquire@(
  k text, tok text, ttl_ms bigint, tid text, ticket_ms bigint, max_waiters bigint,
  lim bigint DEFAULT 0, reg text DEFAULT '', lbl text DEFAULT '', OUT status integer,
  OUT val bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
  t timestamptz;
  c @locks@%ROWTYPE;
  s @shared@%ROWTYPE;
  e timestamptz;
  f bigint;
  ticketed boolean := false;
  marked boolean := false;
  sc text;
BEGIN
  -- An expression, not a statement (`PERFORM` would run a query).
  sc := set_config('synchronous_commit', 'off', true);
  IF tid = '' THEN
    -- A try on a key another holds alone is answered from the snapshot, the row left
    -- unlocked: a read, with no transaction id and no commit record to flush.
    SELECT * INTO c FROM @locks@ WHERE key = k;
    t := clock_timestamp();
    IF c.token <> tok AND c.expires_at > t THEN
      status := 0;
      val := @ms@(c.expires_at, t);
      RETURN;
    END IF;
  END IF;
  LOOP
    t := clock_timestamp();
    IF lim = 0 THEN
      -- The fast path: the lock of a key nobody holds or queues for. Its conflict locks
      -- the row either way.
      INSERT INTO @locks@ AS l (key, token, fence, expires_at, label)
        VALUES (k, tok, @us@(t), t + ttl_ms * interval '1 millisecond', nullif(lbl, ''))
        ON CONFLICT (key) DO UPDATE
          SET token = excluded.token, fence = greatest(l.fence + 1, excluded.fence),
              expires_at = excluded.expires_at, label = excluded.label
          WHERE NOT l.queued AND (l.token IS NULL OR l.expires_at <= t) AND l.shared_until <= t
        RETURNING l.fence INTO f;
      IF FOUND THEN
        status := 1;
        val := f;
        RETURN;
      END IF;
    END IF;
    -- The row is this transaction's now (locked by the conflict, or here): read it after
    -- the wait. A shared request on a key without a row makes one (a tombstone) first.
    SELECT * INTO c FROM @locks@ WHERE key = k FOR NO KEY UPDATE;
    EXIT WHEN FOUND;
    INSERT INTO @locks@ (key, token, fence, expires_at) VALUES (k, NULL, @us@(t), t)
      ON CONFLICT (key) DO NOTHING;
  END LOOP;
  t := clock_timestamp();
  e := t + ttl_ms * interval '1 millisecond';
  IF c.shared_until > t THEN
    SELECT * INTO s FROM @shared@ WHERE key = k AND token = tok AND expires_at > t;
  END IF;
  IF c.token = tok AND c.expires_at > t THEN
    UPDATE @locks@ SET expires_at = e WHERE key = k;
    status := 1;
    val := c.fence;
  ELSIF s.token IS NOT NULL AND lim <= 1 AND NOT s.alone THEN
    -- Not upgraded: others may hold the key beside this lease.
    status := 4;
    val := 0;
  ELSIF s.token IS NOT NULL THEN
    UPDATE @shared@ SET expires_at = e WHERE key = k AND token = tok;
    UPDATE @locks@ SET shared_until = greatest(shared_until, e) WHERE key = k;
    status := 1;
    val := s.fence;
  END IF;
  IF status IS NOT NULL THEN
    IF tid <> '' THEN
      DELETE FROM @tickets@ WHERE key = k AND id = tid;
    END IF;
    RETURN;
  END IF;
  IF tid <> '' THEN
    UPDATE @tickets@ SET deadline = t + ticket_ms * interval '1 millisecond', nonce = reg
      WHERE key = k AND id = tid;
    ticketed := FOUND;
  END IF;
  IF c.token IS NOT NULL AND c.expires_at > t THEN
    -- Held alone: nobody is granted, and the row (locked) is as read.
    val := @ms@(c.expires_at, t);
    marked := c.queued;
  ELSE
    f := @pump@(c, t, false, CASE WHEN ticketed THEN tid ELSE '' END, tok, ttl_ms,
                CASE WHEN ticketed THEN -1 ELSE lim END, nullif(lbl, ''));
    IF f >= 0 THEN
      status := 1;
      val := f;
      RETURN;
    END IF;
    val := coalesce((SELECT @ms@(min(expires_at), t) FROM @shared@
                       WHERE key = k AND expires_at > t), -2);
  END IF;
  status := 0;
  IF tid = '' OR ticketed THEN
    RETURN;
  END IF;
  IF max_waiters >= 0 THEN
    IF c.token IS NOT NULL AND c.expires_at > t THEN
      DELETE FROM @tickets@ WHERE key = k AND deadline <= t;
    END IF;
    IF (SELECT count(*) FROM @tickets@ WHERE key = k) >= max_waiters THEN
      status := 2;
      RETURN;
    END IF;
  END IF;
  INSERT INTO @tickets@ (key, id, token, deadline, ttl_ms, claim_ms, lim, nonce, label)
    VALUES (k, tid, tok, t + ticket_ms * interval '1 millisecond', ttl_ms, ticket_ms, lim, reg,
            nullif(lbl, ''));
  -- In the ticket's transaction: the fast paths see it from its commit on. (Not when the
  -- row, unchanged since it was locked, says so already: a statement less for each waiter
  -- behind a holder. After a pump, which may have written it, the row decides.)
  IF NOT marked THEN
    UPDATE @locks@ SET queued = true WHERE key = k AND NOT queued;
  END IF;
END
$fn$;

CREATE OR REPLACE FUNCTION @release@(k text, tok text, lim bigint DEFAULT 0, rid text DEFAULT '')
RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
  t timestamptz;
  c @locks@%ROWTYPE;
  gone boolean := false;
  sc text;
BEGIN
  sc := set_config('synchronous_commit', 'off', true);
  t := clock_timestamp();
  IF lim = 0 THEN
    -- The fast path: nobody queues, so the key is simply freed.
    UPDATE @locks@ SET token = NULL, expires_at = t, released = rid
      WHERE key = k AND token = tok AND expires_at > t AND NOT queued;
    IF FOUND THEN
      RETURN 1;
    END IF;
  END IF;
  SELECT * INTO c FROM @locks@ WHERE key = k FOR NO KEY UPDATE;
  -- After the lock's wait, if any.
  t := clock_timestamp();
  IF NOT FOUND THEN
    RETURN -2;
  ELSIF c.released = rid AND rid <> '' THEN
    RETURN 1;
  ELSIF lim = 0 AND c.token = tok AND c.expires_at > t THEN
    c.token := NULL;
    c.expires_at := t;
  ELSE
    IF lim > 0 AND c.shared_until > t THEN
      DELETE FROM @shared@ WHERE key = k AND token = tok AND expires_at > t;
      gone := FOUND;
    END IF;
    IF NOT gone THEN
      RETURN CASE WHEN (c.token IS NOT NULL AND c.expires_at > t)
        OR EXISTS (SELECT 1 FROM @shared@ WHERE key = k AND expires_at > t) THEN -1 ELSE -2 END;
    END IF;
  END IF;
  c.released := rid;
  PERFORM @pump@(c, t, true, '', '', 0, -1);
  RETURN 1;
END
$fn$;

CREATE OR REPLACE FUNCTION @leave@(k text, tid text, tok text) RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
  t timestamptz;
  c @locks@%ROWTYPE;
  sc text;
BEGIN
  sc := set_config('synchronous_commit', 'off', true);
  -- Locked before the ticket goes: a grant running now must not see it vanish midway.
  SELECT * INTO c FROM @locks@ WHERE key = k FOR NO KEY UPDATE;
  IF NOT FOUND THEN
    RETURN -2;
  END IF;
  t := clock_timestamp();
  IF tid <> '' THEN
    DELETE FROM @tickets@ WHERE key = k AND id = tid;
  END IF;
  IF c.token = tok THEN
    c.token := NULL;
    c.expires_at := least(c.expires_at, t);
  END IF;
  IF c.shared_until > t THEN
    DELETE FROM @shared@ WHERE key = k AND token = tok;
  END IF;
  PERFORM @pump@(c, t, true, '', '', 0, -1);
  SELECT * INTO c FROM @locks@ WHERE key = k;
  IF c.token IS NOT NULL AND c.expires_at > t THEN
    RETURN @ms@(c.expires_at, t);
  END IF;
  RETURN coalesce((SELECT @ms@(min(expires_at), t) FROM @shared@
                     WHERE key = k AND expires_at > t), -2);
END
$fn$;
"#;
