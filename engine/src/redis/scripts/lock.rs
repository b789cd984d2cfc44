//! The scripts that get a key: acquire (or queue as a waiter), and a waiter's leaving.

use std::sync::LazyLock;

use redis::Script;

use super::PRELUDE;

/// Acquire, or register / refresh a waiter.
///
/// - `KEYS[1]` lock, `KEYS[2]` fence tombstone, `KEYS[3]` queue.
/// - `ARGV[1]` token, `ARGV[2]` lease TTL (ms), `ARGV[3]` ticket id (`''`: a plain try
///   that never registers), `ARGV[4]` flags: `h` the key was contended lately
///   (look at the lock before the tombstone), `r` the waiter's last refresh failed (it may
///   have landed unseen and renamed the member, so a member by the name `ARGV[7]` gives
///   that is gone is looked for by its ticket id, and keeps its place), `c` a registered
///   waiter only looks for a grant (re-entry) or a free key, and leaves its ticket as it
///   is when the key is held (its channel's subscription was just confirmed); `ARGV[5]` max
///   waiters (`-1`: no limit), `ARGV[6]` ticket TTL (ms; also this waiter's claim period,
///   which its ticket carries), `ARGV[7]` the deadline of this waiter's registered member
///   as the last reply gave it (`''`: not registered; a registration is a new one).
/// - Returns `{1, fence, 0}` granted; `{0, pttl, deadline}` not granted (the ticket is
///   registered or refreshed when one was given, and `deadline` names its member, else
///   `0`; `pttl` is `-2` when the key is free but another waiter goes first, `-3` when not
///   read); `{2, pttl, 0}` refused because the waiter limit is reached.
///
/// Atomic because "is it free / is it mine / am I the head", the fence computation and the
/// write of the new holder must see one state: two clients doing this in separate commands
/// could both see the key free.
///
/// The fence: a tombstone (the key was released and nobody waits) gives `last + 1`, and
/// the grant consumes it; a key with no tombstone (never held, or idle past it, or its
/// holder's lease ran out) gives the server time in µs, or the hand-off fence + 1 when a
/// hand-off's claim lapsed unreleased and its fence is higher (see the prelude). Fences so
/// strictly increase per key without a permanent key per lock name: every fence is at most
/// the server time at its grant (a grant takes more than a microsecond, and each `+ 1`
/// follows a clock reading), so the clock has moved past the last one whenever the fence
/// key does not carry it, unless the server clock stepped back (by more than the time
/// since that grant).
///
/// Re-entry (the token already holds the key) refreshes the TTL and returns the stored
/// fence; it is also how a waiter whose grant message was lost finds its grant. Only the
/// queue's head may take a free key, FIFO or not, so no waiter is ever overtaken by a
/// newcomer; dead tickets at the head are dropped first. A registration marks the
/// holder's value (see the prelude), so that its release looks at the queue.
///
/// A new ticket, FIFO or not, goes to the queue's tail (`RPUSH`): arrival order survives
/// any server clock step for every ticket.
///
/// The queue must outlive every ticket's deadline. A registration that sets its expiry
/// sets it to the whole second at or after its own ticket's deadline (or the one the
/// holder's value names, if later) and names it in the holder's value (`q<ms>`, see the
/// prelude); a registration whose deadline that named expiry covers leaves the queue as it
/// is. So a key contended for seconds extends its queue about once a second, and a queue
/// lives at most a second longer than its last ticket.
///
/// Commands, besides `EVALSHA`: a free key nobody waits for, released before (the
/// tombstone): 2 (`GETDEL`, `SET`); `GET` first when `h`: 3. A key with no tombstone: 5
/// (`GETDEL`, `GET`, `LINDEX`, `TIME`, `SET`); 2 more when the fence key holds a hand-off's
/// fence (`SET` it back, and `DEL` it with the grant). A waiter's first registration: 3
/// (`GET`, `TIME`, `RPUSH`), one more without `h` (`GETDEL`), and 2 when the queue's
/// expiry must be set (`PEXPIREAT`, and the `SET` naming it in the holder's value, which
/// also marks a value that had no mark). A refresh: 6 (`GET`, `PTTL`, `LINDEX` head,
/// `TIME`, `LPOS`, `LSET`), the same 2 when the expiry must be set, and an `LRANGE` of the
/// queue after a failed one when the named member is gone; with `c`, a held key: 1
/// (`GET`).
pub(crate) static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{PRELUDE}{ACQUIRE_BODY}")));

/// The body of [`ACQUIRE`], shared with [`ACQUIRE_OR_RECORD`] (which runs it as a
/// function).
const ACQUIRE_BODY: &str = r#"
local token, ttl, id, flags, known = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[7]
local ticket_ttl = tonumber(ARGV[6])
local named = id ~= '' and known ~= '' and (id .. '|' .. known .. '|' .. ARGV[2] .. '|' .. ARGV[6] .. '|' .. token)
-- A hand-off fence (see the prelude) met on the way: the fence a fresh grant must exceed.
local floor
-- A tombstone: the key is free and nobody waits. Granted at once, the tombstone taken.
local function from_tombstone()
  local last = redis.call('GETDEL', KEYS[2])
  if not last then return nil end
  local handed, expiry = string.match(last, '^(%d+)@(%d+)$')
  if handed then
    -- Not a tombstone: a hand-off's fence, kept until its expiry. The key is looked at as
    -- usual.
    redis.call('SET', KEYS[2], last, 'PXAT', expiry)
    floor = tonumber(handed)
    return nil
  end
  local fence = tonumber(string.match(last, '^%d+')) + 1
  -- `NX`: a lock key beside a tombstone is not this version's layout (a node of an
  -- earlier one shares the prefix): then the key is looked at as usual.
  if not redis.call('SET', KEYS[1], string.format('%.0f', fence) .. ' ' .. token, 'NX', 'PX', ttl) then
    return nil
  end
  return {1, fence, 0}
end
-- Our registered member when the one the last reply named is gone and a refresh whose
-- reply was lost may have renamed it: whichever member carries our ticket id, with its
-- place (from 0).
local function search()
  if not string.find(flags, 'r', 1, true) then return nil end
  local prefix = id .. '|'
  local all = redis.call('LRANGE', KEYS[3], 0, -1)
  for i = 1, #all do
    if string.sub(all[i], 1, #prefix) == prefix then return all[i], i - 1 end
  end
  return nil
end
-- A waiter already registered saw the key held: the lock first. So does a caller whose
-- key was contended lately.
local lock_first = named or string.find(flags, 'h', 1, true)
if not lock_first then
  local granted = from_tombstone()
  if granted then return granted end
end
local held = redis.call('GET', KEYS[1])
local pttl = -3
local fence, mark, holder, after_mark
if held then
  fence, mark, holder, after_mark = parse(held)
  if holder == token then
    redis.call('PEXPIRE', KEYS[1], ttl)
    if named and redis.call('LREM', KEYS[3], 1, named) == 0 then
      local renamed = search()
      if renamed then redis.call('LREM', KEYS[3], 1, renamed) end
    end
    return {1, fence, 0}
  end
  if id == '' then return {0, redis.call('PTTL', KEYS[1]), 0} end
  if named and string.find(flags, 'c', 1, true) then
    -- Only a look for a grant made before our channel was subscribed: the ticket was just
    -- registered, and stays as it is.
    return {0, -3, tonumber(known)}
  end
  if named then
    -- A refresh (every fallback period at most): also drop a dead head, so that no
    -- release hands the key to a waiter that has been gone for longer than a ticket TTL.
    pttl = redis.call('PTTL', KEYS[1])
    live_head(id)
  end
else
  if lock_first then
    local granted = from_tombstone()
    if granted then return granted end
  end
  -- Free, and no tombstone: the queue may have a head.
  local head = live_head(id)
  if not head or (id ~= '' and string.sub(head, 1, #id + 1) == id .. '|') then
    clock()
    local mark = ''
    if head then
      -- Ours, at the head.
      redis.call('LPOP', KEYS[3])
      mark = '+'
    end
    local fence = now_us
    if floor then
      -- A hand-off whose claim lapsed unreleased: its fence, not the clock, is the last.
      fence = math.max(fence, floor + 1)
      redis.call('DEL', KEYS[2])
    end
    redis.call('SET', KEYS[1], string.format('%.0f', fence) .. mark .. ' ' .. token, 'PX', ttl)
    return {1, fence, 0}
  end
  if id == '' then return {0, -2, 0} end
  pttl = -2
end
clock()
local deadline = string.format('%.0f', now_ms + ticket_ttl)
local member = id .. '|' .. deadline .. '|' .. ARGV[2] .. '|' .. ARGV[6] .. '|' .. token
local at = named and redis.call('LPOS', KEYS[3], named)
if named and not at then
  local _
  _, at = search()
end
local created = false
if at then
  -- A refresh: the member renamed in its place, which never changes.
  redis.call('LSET', KEYS[3], at, member)
else
  local max = tonumber(ARGV[5])
  if max >= 0 and redis.call('LLEN', KEYS[3]) >= max then
    -- Dead tickets do not count: drop them, then count again.
    for _, m in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
      if tonumber(string.match(m, '^[^|]*|(%d+)|')) <= now_ms then
        redis.call('LREM', KEYS[3], 1, m)
      end
    end
    if redis.call('LLEN', KEYS[3]) >= max then
      return {2, held and redis.call('PTTL', KEYS[1]) or -2, 0}
    end
  end
  -- Behind the last ticket whatever the clock says, FIFO or not: the queue is a list, in
  -- arrival order through any server clock step.
  created = redis.call('RPUSH', KEYS[3], member) == 1
end
-- The queue must outlive our ticket's deadline. The holder's value may name an expiry the
-- queue is known to reach (see the prelude); else, or when that falls short, or on a
-- queue just created, it is set to the whole second at or after our deadline (or to the
-- named one, if later), and named in the holder's value.
local known = held and queue_until_of(after_mark)
local rewrite = held and mark == ''
if created or not known or known < now_ms + ticket_ttl then
  local queue_until = math.max(math.ceil((now_ms + ticket_ttl) / 1000) * 1000, known or 0)
  redis.call('PEXPIREAT', KEYS[3], string.format('%.0f', queue_until))
  if held and queue_until ~= known then
    known = queue_until
    rewrite = true
  end
end
if rewrite then
  -- Marked: the holder's release must look at the queue from now on; and naming the
  -- queue's expiry.
  local cover = string.match(after_mark or '', '^(%d+@%d+)') or ''
  redis.call('SET', KEYS[1], string.format('%.0f', fence) .. '+' .. cover .. string.format('q%.0f', known) .. ' ' .. holder, 'KEEPTTL')
end
return {0, pttl, now_ms + ticket_ttl}
"#;

/// Acquire unless an idempotency record is stored: the record check of a first idempotent
/// request folded into its acquire.
///
/// - `KEYS` as [`ACQUIRE`]'s, then the record (hash) last.
/// - `ARGV` as [`ACQUIRE`]'s.
/// - Returns `{3, fingerprint, metadata, body, at}` when a record is stored (nothing else
///   is done; a field the hash lacks is nil), else what [`ACQUIRE`] returns.
///
/// Atomic so that "no record" and the grant are one step: a record is written only with
/// the release of the key, so a grant made when none was stored stays valid while held.
///
/// Commands, besides [`ACQUIRE`]'s: 1 (`HMGET`); a stored record: that one alone.
pub(crate) static ACQUIRE_OR_RECORD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{PRELUDE}local function acquire(){ACQUIRE_BODY}end\n{}",
        r#"
local rec = redis.call('HMGET', KEYS[4], 'fp', 'meta', 'body', 'at')
if rec[1] or rec[2] or rec[3] or rec[4] then
  return {3, rec[1] or false, rec[2] or false, rec[3] or false, rec[4] or false}
end
return acquire()
"#
    ))
});

/// A waiter leaves (timed out, cancelled, or failed), giving back a grant it may have
/// received unseen.
///
/// - `KEYS[1]` lock, `KEYS[2]` fence tombstone, `KEYS[3]` queue.
/// - `ARGV[1]` ticket id (`''`: none), `ARGV[2]` its member's deadline as last reported
///   (`''`: unknown, an attempt's reply was lost: the queue is searched), `ARGV[3]` token,
///   `ARGV[4]` lease TTL (ms), `ARGV[5]` `'1'` to release the key if `token` holds it,
///   `ARGV[6]` wake-up channel, `ARGV[7]` tombstone margin (ms), `ARGV[8]` the waiter's
///   claim period (ms), as its ticket carries it.
/// - Returns the holder's remaining TTL in ms, `-2` when the key is free (or was given
///   back).
///
/// Atomic so that removing the ticket and giving back a grant are one step: the grant
/// goes on to the next waiter, as a release would.
///
/// Also sent as a plain `EVAL` of [`LEAVE_SOURCE`] when it must follow an unseen acquire
/// on that acquire's connection: `EVALSHA` could meet `NOSCRIPT` after a restart, and the
/// reload round trip would come too late for a spawned cleanup that has given up.
pub(crate) static LEAVE: LazyLock<Script> = LazyLock::new(|| Script::new(&LEAVE_SOURCE));

/// The source of [`LEAVE`].
pub(crate) static LEAVE_SOURCE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{PRELUDE}{}",
        r#"
local id, token = ARGV[1], ARGV[3]
if id ~= '' then
  local removed = 0
  if ARGV[2] ~= '' then
    removed = redis.call('LREM', KEYS[3], 1, id .. '|' .. ARGV[2] .. '|' .. ARGV[4] .. '|' .. ARGV[8] .. '|' .. token)
  else
    local prefix = id .. '|'
    for _, m in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
      if string.sub(m, 1, #prefix) == prefix then redis.call('LREM', KEYS[3], 1, m) end
    end
  end
end
local held = redis.call('GET', KEYS[1])
if not held then return -2 end
local fence, mark, holder, after_mark = parse(held)
if ARGV[5] == '1' and holder == token then
  free_or_handoff(fence, mark, ARGV[6], tonumber(ARGV[7]), after_mark)
  return -2
end
return redis.call('PTTL', KEYS[1])
"#
    )
});
