//! The functions of a key's shared leases (permits): up to each request's limit of holders,
//! or one alone (a limit of 1), in tables of their own, apart from the key's lock.
//!
//! Every function that changes a key's shared leases takes the advisory lock of
//! `hashtext('&' || key)` (the lock's is `hashtext(key)`): the two spaces never wait for
//! each other but on a hash collision, a moment.

/// The shared-lease functions, each with its contract.
///
/// # `shared_pump(k, t, own, lim) -> (mine, room)` (called with `k`'s shared lock held)
///
/// Deletes the holders whose lease ran out and the dead tickets (all but `own`'s), then
/// grants the queue from its head as many as fit, stopping at the first that does not (so
/// nobody is overtaken, and a waiter alone keeps later ones out): each becomes a holder for
/// `min(its TTL, its claim)` and is told by `NOTIFY "<ticket id> <fence> <claim ms>"`, the
/// lock's format, except the caller's own ticket `own`, which gets its full TTL and learns
/// of it from the reply. A request with limit 1 fits when nobody holds; another when nobody
/// holds alone and fewer than its limit hold. A head ticket whose token already holds
/// re-enters (its fence, its expiry the later of both). Returns `mine`, the fence granted
/// to `own` (`-1`: none), and `room`: whether nobody waits now and a request with limit
/// `lim` fits (what an arrival needs to be granted; `lim = 0`: not asked). Statements: 3
/// (holders, tickets, count) and 1 per head looked at, 3 or 4 more per grant (ticket,
/// fence, holder, `NOTIFY`).
///
/// # `shared_fence(k, t) -> bigint`
///
/// The next fence of `k`'s shared leases: `max(last + 1, t in µs)`, the last read from the
/// key's row in `shared_fences`, which it then holds (one upsert). The row is needed only
/// while a later grant could otherwise get a lower fence, that is until the clock has
/// passed it: the sweeper deletes it once its fence is more than the margin in the past.
///
/// # `shared_acquire(k, tok, ttl_ms, tid, ticket_ms, max_waiters, lim) -> (status, val)`
///
/// As the lock's `acquire`, with the request's limit `lim`: `(1, fence)` granted (on
/// arrival only when nobody waits and it fits, or as the queue's head); `(0, pttl)` not
/// granted, the ticket registered or refreshed when `tid <> ''` (`pttl` when the first
/// holder's lease runs out, `-2` if nobody holds); `(2, pttl)` refused, `max_waiters` live
/// tickets wait; `(4, 0)` `tok` holds a shared lease beside others and asks to hold alone
/// (not upgraded; its ticket removed). Re-entry (`tok` holds) refreshes the TTL and keeps
/// the fence. Statements: a grant of a free key 8 (lock, re-entry look, the pump's 4,
/// fence, holder; synchronous commit is an expression); a waiter's registration 8 or 9 (the
/// count against `max_waiters`).
///
/// # `shared_release(k, tok) -> integer`
///
/// `1` released, then the waiters that now fit granted (`shared_pump`); `-1` `tok` holds
/// no live lease but someone does; `-2` nobody holds. Statements: 2 (3 when refused) and
/// the pump's.
///
/// # `shared_leave(k, tid, tok) -> bigint`
///
/// A waiter leaves: deletes its ticket and any lease `tok` holds (a grant received unseen),
/// then grants the waiters that now fit (the ticket may have been the head that did not
/// fit). Returns the first holder's remaining ms, `-2` if nobody holds.
///
/// # `shared_extend(k, tok, ms, mode) -> bigint`, `shared_renew(ks, toks, ttls) -> text`
///
/// As the lock's `extend` and `renew`, on `tok`'s shared lease (`-1` another holds, `-2`
/// nobody does); the renewal takes its keys' shared locks in hash order.
pub(super) const FUNCTIONS: &str = r#"
CREATE OR REPLACE FUNCTION @shared_fence@(k text, t timestamptz) RETURNS bigint
LANGUAGE sql AS $fn$
  INSERT INTO @shared_fences@ AS f (key, fence)
    VALUES (k, floor(extract(epoch FROM t) * 1000000)::bigint)
    ON CONFLICT (key) DO UPDATE SET fence = greatest(f.fence + 1, excluded.fence)
    RETURNING fence
$fn$;

CREATE OR REPLACE FUNCTION @shared_pump@(
  k text, t timestamptz, own text, lim bigint, OUT mine bigint, OUT room boolean)
LANGUAGE plpgsql AS $fn$
DECLARE
  w @shared_tickets@%ROWTYPE;
  h @shared@%ROWTYPE;
  held bigint;
  lone boolean;
  f bigint;
  g bigint;
BEGIN
  mine := -1;
  room := false;
  DELETE FROM @shared@ WHERE key = k AND expires_at <= t;
  DELETE FROM @shared_tickets@ WHERE key = k AND deadline <= t AND id <> own;
  SELECT count(*), coalesce(bool_or(s.alone), false) INTO held, lone
    FROM @shared@ s WHERE s.key = k;
  LOOP
    SELECT * INTO w FROM @shared_tickets@ WHERE key = k ORDER BY seq LIMIT 1;
    IF NOT FOUND THEN
      room := (lim = 1 AND held = 0) OR (lim > 1 AND NOT lone AND held < lim);
      RETURN;
    END IF;
    g := CASE WHEN w.id = own THEN w.ttl_ms ELSE least(w.ttl_ms, w.claim_ms) END;
    SELECT * INTO h FROM @shared@ WHERE key = k AND token = w.token;
    IF FOUND THEN
      -- A token queued while it holds (a caller's own token, twice) re-enters.
      f := h.fence;
      UPDATE @shared@ SET expires_at = greatest(expires_at, t + g * interval '1 millisecond')
        WHERE key = k AND token = w.token;
    ELSIF (w.lim = 1 AND held = 0) OR (w.lim <> 1 AND NOT lone AND held < w.lim) THEN
      f := @shared_fence@(k, t);
      INSERT INTO @shared@ (key, token, fence, alone, expires_at)
        VALUES (k, w.token, f, w.lim = 1, t + g * interval '1 millisecond');
      held := held + 1;
      lone := w.lim = 1;
    ELSE
      EXIT;
    END IF;
    DELETE FROM @shared_tickets@ WHERE key = k AND id = w.id;
    IF w.id = own THEN
      mine := f;
    ELSE
      PERFORM pg_notify(@channel@, w.id || ' ' || f || ' ' || g);
    END IF;
  END LOOP;
END
$fn$;

CREATE OR REPLACE FUNCTION @shared_earliest@(k text, t timestamptz) RETURNS bigint
LANGUAGE sql AS $fn$
  SELECT coalesce(max(@ms@(e, t)), -2)
    FROM (SELECT min(expires_at) AS e FROM @shared@ WHERE key = k AND expires_at > t) m
    WHERE e IS NOT NULL
$fn$;

CREATE OR REPLACE FUNCTION @shared_acquire@(
  k text, tok text, ttl_ms bigint, tid text, ticket_ms bigint, max_waiters bigint, lim bigint,
  OUT status integer, OUT val bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
  t timestamptz;
  cur @shared@%ROWTYPE;
  f bigint;
  room boolean;
  sc text;
BEGIN
  PERFORM pg_advisory_xact_lock(@class@, hashtext('&' || k));
  sc := set_config('synchronous_commit', 'on', true);
  t := clock_timestamp();
  SELECT * INTO cur FROM @shared@ WHERE key = k AND token = tok AND expires_at > t;
  IF FOUND THEN
    IF tid <> '' THEN
      DELETE FROM @shared_tickets@ WHERE key = k AND id = tid;
    END IF;
    IF lim = 1 AND NOT cur.alone THEN
      -- Not upgraded: others may hold the key beside this lease.
      status := 4;
      val := 0;
    ELSE
      UPDATE @shared@ SET expires_at = t + ttl_ms * interval '1 millisecond'
        WHERE key = k AND token = tok;
      status := 1;
      val := cur.fence;
    END IF;
    PERFORM @shared_pump@(k, t, '', 0);
    RETURN;
  END IF;
  SELECT p.mine, p.room INTO f, room FROM @shared_pump@(k, t, tid, lim) p;
  IF f >= 0 THEN
    status := 1;
    val := f;
    RETURN;
  END IF;
  -- Granted on arrival only when nobody waits: no newcomer overtakes the queue.
  IF room THEN
    f := @shared_fence@(k, t);
    INSERT INTO @shared@ (key, token, fence, alone, expires_at)
      VALUES (k, tok, f, lim = 1, t + ttl_ms * interval '1 millisecond');
    status := 1;
    val := f;
    RETURN;
  END IF;
  val := @shared_earliest@(k, t);
  IF tid = '' THEN
    status := 0;
    RETURN;
  END IF;
  UPDATE @shared_tickets@ SET deadline = t + ticket_ms * interval '1 millisecond'
    WHERE key = k AND id = tid;
  IF NOT FOUND THEN
    -- The pump deleted the dead tickets: every one counted lives.
    IF max_waiters >= 0
       AND (SELECT count(*) FROM @shared_tickets@ WHERE key = k) >= max_waiters THEN
      status := 2;
      RETURN;
    END IF;
    INSERT INTO @shared_tickets@ (key, id, token, deadline, ttl_ms, claim_ms, lim)
      VALUES (k, tid, tok, t + ticket_ms * interval '1 millisecond', ttl_ms, ticket_ms, lim);
  END IF;
  status := 0;
END
$fn$;

CREATE OR REPLACE FUNCTION @shared_release@(k text, tok text) RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
  t timestamptz;
  r integer;
  sc text;
BEGIN
  PERFORM pg_advisory_xact_lock(@class@, hashtext('&' || k));
  sc := set_config('synchronous_commit', 'on', true);
  t := clock_timestamp();
  DELETE FROM @shared@ WHERE key = k AND token = tok AND expires_at > t;
  IF FOUND THEN
    r := 1;
  ELSIF EXISTS (SELECT 1 FROM @shared@ WHERE key = k AND expires_at > t) THEN
    r := -1;
  ELSE
    r := -2;
  END IF;
  PERFORM @shared_pump@(k, t, '', 0);
  RETURN r;
END
$fn$;

CREATE OR REPLACE FUNCTION @shared_leave@(k text, tid text, tok text) RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
  t timestamptz;
  sc text;
BEGIN
  PERFORM pg_advisory_xact_lock(@class@, hashtext('&' || k));
  sc := set_config('synchronous_commit', 'on', true);
  t := clock_timestamp();
  IF tid <> '' THEN
    DELETE FROM @shared_tickets@ WHERE key = k AND id = tid;
  END IF;
  DELETE FROM @shared@ WHERE key = k AND token = tok;
  PERFORM @shared_pump@(k, t, '', 0);
  RETURN @shared_earliest@(k, t);
END
$fn$;

CREATE OR REPLACE FUNCTION @shared_extend@(k text, tok text, ms bigint, mode text)
RETURNS bigint LANGUAGE plpgsql AS $fn$
DECLARE
  t timestamptz;
  cur @shared@%ROWTYPE;
  e timestamptz;
  sc text;
BEGIN
  PERFORM pg_advisory_xact_lock(@class@, hashtext('&' || k));
  sc := set_config('synchronous_commit', 'on', true);
  t := clock_timestamp();
  SELECT * INTO cur FROM @shared@ WHERE key = k AND token = tok AND expires_at > t;
  IF NOT FOUND THEN
    IF EXISTS (SELECT 1 FROM @shared@ WHERE key = k AND expires_at > t) THEN
      RETURN -1;
    END IF;
    RETURN -2;
  END IF;
  IF mode = 'add' AND isfinite(cur.expires_at) THEN
    e := cur.expires_at + ms * interval '1 millisecond';
  ELSE
    e := t + ms * interval '1 millisecond';
  END IF;
  e := greatest(e, t + interval '1 millisecond');
  UPDATE @shared@ SET expires_at = e WHERE key = k AND token = tok;
  RETURN @ms@(e, t);
END
$fn$;

CREATE OR REPLACE FUNCTION @shared_renew@(ks text[], toks text[], ttls bigint[]) RETURNS text
LANGUAGE plpgsql AS $fn$
DECLARE
  t timestamptz;
  i integer;
  renewed text := '';
  sc text;
BEGIN
  FOR i IN SELECT o FROM generate_subscripts(ks, 1) AS o ORDER BY hashtext('&' || ks[o]) LOOP
    PERFORM pg_advisory_xact_lock(@class@, hashtext('&' || ks[i]));
  END LOOP;
  sc := set_config('synchronous_commit', 'on', true);
  t := clock_timestamp();
  FOR i IN 1 .. coalesce(array_length(ks, 1), 0) LOOP
    UPDATE @shared@ SET expires_at = greatest(expires_at, t + ttls[i] * interval '1 millisecond')
      WHERE key = ks[i] AND token = toks[i] AND expires_at > t;
    renewed := renewed || CASE WHEN FOUND THEN '1' ELSE '0' END;
  END LOOP;
  RETURN renewed;
END
$fn$;
"#;
