//! The scripts that get a key: acquire (or queue as a waiter), and a waiter's leaving.

use std::sync::LazyLock;

use redis::Script;

use super::PRELUDE;

/// Acquire (alone, or shared up to a limit), or register / refresh a waiter.
///
/// - `KEYS[1]` lock, `KEYS[2]` fence tombstone, `KEYS[3]` queue, `KEYS[4]` tickets,
///   `KEYS[5]` holders.
/// - `ARGV[1]` token, `ARGV[2]` lease TTL (ms), `ARGV[3]` ticket id (`''`: a plain try
///   that never registers), `ARGV[4]` flags: `h` the key was contended lately (look at
///   the lock before the tombstone), `w` the waiter is registered, `c` a registered waiter
///   only looks for a grant and leaves its ticket as it is when another holds the key
///   alone (its channel's subscription was just confirmed); `ARGV[5]` max waiters (`-1`:
///   no limit), `ARGV[6]` ticket TTL (ms; also this waiter's claim period, which its
///   ticket carries), `ARGV[7]` a fresh random nonce (below), `ARGV[8]` the limit (0:
///   the lock; 1: a shared request alone; both hold alone), `ARGV[9]` the holder's label
///   (`''`: none), stored with the lease and the ticket; no command more.
/// - Returns `{1, fence, 0}` granted; `{0, pttl, nonce}` not granted (the ticket is
///   registered or refreshed when one was given, and `nonce` is its registration's, else
///   `0`; `pttl` is `-2` when the key is free but another waiter goes first, `-3` when not
///   read); `{2, pttl, 0}` refused because the waiter limit is reached; `{4, 0, 0}` a token
///   holding beside others asked to hold alone (not made alone; its ticket removed).
///
/// Atomic because "is it free / does it fit / is it mine / am I the head", the fence and
/// the write of the new holder must see one state.
///
/// The fence: a tombstone gives `last + 1`, and the grant consumes it; a held key (shared
/// holders) the value's `fence + 1`; a key with no tombstone the server time in µs, or the
/// hand-off fence + 1 when a hand-off's claim lapsed unreleased and its fence is higher.
/// Every fence is at most the server time at its grant, so fences rise per key across both
/// modes without a permanent key per lock name (unless the server clock steps back).
///
/// Re-entry (the token holds the key, alone or shared) refreshes the TTL and returns the
/// stored fence, whatever the limit asked (a holder alone stays alone); it is also how a
/// waiter whose grant message was lost finds its grant. Only the queue's head may take a
/// key that fits, so no waiter is ever overtaken by a newcomer, whatever the modes; dead
/// tickets at the head are dropped first.
///
/// Registration: a ticket id not in the tickets hash is pushed to the queue's tail with
/// the nonce `ARGV[7]`; one that is there (a refresh, or the same registration sent twice)
/// keeps its nonce and its place, and only its deadline moves: a registration is
/// idempotent. The queue and the tickets hash live at least a ticket TTL after it.
///
/// Commands, besides `EVALSHA`: a free key nobody waits for, released before (the
/// tombstone): 2 (`GETDEL`, `SET`); `GET` first when `h`: 3; shared, 3 more (`TIME`,
/// `HSET`, `PEXPIRE`). A key with no tombstone: 5 (`GETDEL`, `GET`, `LINDEX`, `TIME`,
/// `SET`). A shared grant beside shared holders: 9 (`GETDEL`, `GET`, `LINDEX`, `HLEN`,
/// `TIME`, `HSET`, `PTTL`, `SET`, `PEXPIRE`). A registration: `GET`, `LINDEX`, `PTTL`,
/// `TIME`, `HGET`, `RPUSH`, `HSET`, `PTTL` (and `PEXPIRE` ×2 when the tickets' expiry is
/// short or the queue new, a `SET` marking the holder's value when it had no mark).
pub(crate) static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{ACQUIRE_HEAD}{PRELUDE}{ACQUIRE_REST}")));

/// The start of [`ACQUIRE`]: its arguments and the grant from a tombstone, which is the
/// whole of an uncontended acquire. It comes before the prelude and needs none of it, so
/// that an acquire granted there returns before the prelude's functions are made: Lua
/// makes every `local function` anew on each call, and the prelude's (with the rest of
/// the script's) were about a quarter of an uncontended cycle's server time. Shared with [`ACQUIRE_OR_RECORD`], which runs
/// it (and [`ACQUIRE_REST`]) as a function after the prelude.
const ACQUIRE_HEAD: &str = r#"
local token, ttl, id, flags = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local limit, lbl = tonumber(ARGV[8]), ARGV[9] or ''
-- A hand-off fence met on the way: the fence a fresh grant must exceed.
local floor
-- A tombstone: the key is free and nobody waits. Granted at once, the tombstone taken.
-- (The prelude's `fmt`, `tag` and `clock`, written out: it is not made yet.)
local function from_tombstone()
  local last = redis.call('GETDEL', KEYS[2])
  if not last then return nil end
  local handed, expiry = string.match(last, '^(%d+)@(%d+)$')
  if handed then
    -- Not a tombstone: a hand-off's fence, kept until its expiry.
    redis.call('SET', KEYS[2], last, 'PXAT', expiry)
    floor = tonumber(handed)
    return nil
  end
  local f = tonumber(string.match(last, '^%d+')) + 1
  local tagged = lbl ~= '' and '\31' .. lbl or ''
  local value = limit == 0 and ' ' .. token .. tagged or limit == 1 and 'a ' .. token .. tagged or ' '
  -- `NX`: a lock key beside a tombstone is not this layout's: looked at as usual.
  if not redis.call('SET', KEYS[1], string.format('%.0f', f) .. value, 'NX', 'PX', ARGV[2]) then
    return nil
  end
  if limit > 1 then
    local t = redis.call('TIME')
    local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    redis.call('HSET', KEYS[5], token, string.format('%.0f', now_ms + ttl) .. ' ' .. string.format('%.0f', f) .. tagged)
    redis.call('PEXPIRE', KEYS[5], ttl)
  end
  return {1, f, 0}
end
local registered = string.find(flags, 'w', 1, true)
local lock_first = registered or string.find(flags, 'h', 1, true)
if not lock_first then
  local granted = from_tombstone()
  if granted then return granted end
end
"#;

/// The rest of [`ACQUIRE`], after the prelude: the key held, or free with no tombstone,
/// or a waiter's registration.
const ACQUIRE_REST: &str = r#"
local ticket_ttl = tonumber(ARGV[6])
-- We hold the key: our ticket, if any, leaves the queue.
local function forget()
  if id ~= '' and redis.call('HDEL', KEYS[4], id) == 1 then redis.call('LREM', KEYS[3], 1, id) end
end
local held = load()
if held then
  if holder == token then
    redis.call('PEXPIRE', KEYS[1], ttl)
    forget()
    return {1, fence, 0}
  end
  if holder == '' then
    local mine = redis.call('HGET', KEYS[5], token)
    clock()
    if mine and tonumber(string.match(mine, '^%d+')) >= now_ms then
      forget()
      -- Not made alone: others may share the key beside it.
      if limit <= 1 then return {4, 0, 0} end
      local f, kept = string.match(mine, '^%d+ (%d+)(.*)$')
      redis.call('HSET', KEYS[5], token, fmt(now_ms + ttl) .. ' ' .. f .. kept)
      if redis.call('PTTL', KEYS[1]) < ttl then
        redis.call('PEXPIRE', KEYS[1], ttl)
        redis.call('PEXPIRE', KEYS[5], ttl)
      end
      return {1, tonumber(f), 0}
    end
  elseif registered and string.find(flags, 'c', 1, true) then
    -- Only a look for a grant made before our channel was subscribed.
    return {0, -3, 0}
  end
elseif lock_first then
  local granted = from_tombstone()
  if granted then return granted end
end
local head = live_head(id)
if (not head or head == id) and fits(limit) then
  local f
  if held then
    f = fence + 1
  else
    clock()
    f = now_us
    if floor then
      -- A hand-off whose claim lapsed unreleased: its fence, not the clock, is the last.
      f = math.max(f, floor + 1)
      redis.call('DEL', KEYS[2])
    end
  end
  if head then
    -- Ours, at the head: more waiters may follow.
    pop(id, true)
    mark = '+'
  end
  take(token, limit, ttl, f, lbl)
  return {1, f, 0}
end
local pttl = held and redis.call('PTTL', KEYS[1]) or -2
if id == '' then return {0, pttl, 0} end
clock()
local info = redis.call('HGET', KEYS[4], id)
local nonce = info and string.match(info, '^(%d+)|') or ARGV[7]
local created = false
if not info then
  local max = tonumber(ARGV[5])
  if max >= 0 and redis.call('LLEN', KEYS[3]) >= max then
    -- Dead tickets do not count: drop them, then count again.
    for _, other in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
      local i = redis.call('HGET', KEYS[4], other)
      if not i or deadline_of(i) <= now_ms then
        redis.call('LREM', KEYS[3], 1, other)
        if i then redis.call('HDEL', KEYS[4], other) end
      end
    end
    if redis.call('LLEN', KEYS[3]) >= max then return {2, pttl, 0} end
  end
  -- Behind the last ticket whatever the clock says: arrival order, across both modes.
  created = redis.call('RPUSH', KEYS[3], id) == 1
end
redis.call('HSET', KEYS[4], id, nonce .. '|' .. fmt(now_ms + ticket_ttl) .. '|' .. ARGV[2] .. '|' .. ARGV[6] .. '|' .. ARGV[8] .. '|' .. token .. tag(lbl))
-- The queue and the tickets live at least a ticket TTL more (the hash is written every
-- time, so its expiry tells; a queue just created has none).
if created or redis.call('PTTL', KEYS[4]) < ticket_ttl then
  redis.call('PEXPIRE', KEYS[3], ticket_ttl)
  redis.call('PEXPIRE', KEYS[4], ticket_ttl)
end
if held and mark == '' then
  -- Marked: the holder's release must look at the queue from now on.
  redis.call('SET', KEYS[1], fmt(fence) .. kind .. '+' .. named .. ' ' .. holder .. tag(label), 'KEEPTTL')
end
return {0, pttl, tonumber(nonce)}
"#;

/// Acquire unless an idempotency record is stored: the record check of a first idempotent
/// request folded into its acquire.
///
/// - `KEYS` as [`ACQUIRE`]'s, then the record (hash) last (`KEYS[6]`).
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
        "{PRELUDE}local function acquire(){ACQUIRE_HEAD}{ACQUIRE_REST}end\n{}",
        r#"
local rec = redis.call('HMGET', KEYS[6], 'fp', 'meta', 'body', 'at')
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
/// - `KEYS` as [`ACQUIRE`]'s.
/// - `ARGV[1]` ticket id (`''`: none), `ARGV[2]` token, `ARGV[3]` `'1'` to give back what
///   `token` holds, `ARGV[4]` wake-up channel, `ARGV[5]` tombstone margin (ms).
/// - Returns the lock's remaining TTL in ms, `-2` when the key is free (or was given
///   back).
///
/// Atomic so that removing the ticket, giving back a grant and granting the waiters that
/// now fit (the leaving ticket may have been the head that did not) are one step.
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
local id, token, channel, margin = ARGV[1], ARGV[2], ARGV[4], tonumber(ARGV[5])
if id ~= '' and redis.call('HDEL', KEYS[4], id) == 1 then redis.call('LREM', KEYS[3], 1, id) end
if not load() then return -2 end
if ARGV[3] == '1' and holder == token then
  free_or_handoff(channel, margin, '')
  return -2
end
if holder == '' then
  if ARGV[3] == '1' and redis.call('HDEL', KEYS[5], token) == 1 then
    shared_left(channel, margin, '')
  elseif mark ~= '' then
    pump(channel, margin)
  end
end
return redis.call('PTTL', KEYS[1])
"#
    )
});
