//! The scripts that get a key: acquire (or queue as a waiter), and a waiter's leaving.

use std::sync::LazyLock;

use redis::Script;

use super::PRELUDE;

/// Acquire, or register / refresh a waiter.
///
/// - `KEYS[1]` lock, `KEYS[2]` fence tombstone, `KEYS[3]` queue.
/// - `ARGV[1]` token, `ARGV[2]` lease TTL (ms), `ARGV[3]` ticket id (`''`: a plain try
///   that never registers), `ARGV[4]` `'1'` for FIFO, `ARGV[5]` max waiters (`-1`: no
///   limit), `ARGV[6]` ticket TTL (ms; also this waiter's claim period, which its ticket
///   carries), `ARGV[7]` tombstone margin (ms), `ARGV[8]` the deadline of this waiter's
///   registered member as the last reply gave it (`''`: not registered; a registration is
///   a new one), `ARGV[9]` `'1'` (absent otherwise) when the waiter's last refresh failed: it may have landed
///   unseen and renamed the member, so a member by that name that is gone is looked for by
///   its ticket id (and keeps its place).
/// - Returns `{1, fence, 0}` granted; `{0, pttl, deadline}` not granted (the ticket is
///   registered or refreshed when one was given, and `deadline` names its member, else
///   `0`; `pttl` is `-2` when the key is free but another waiter goes first, `-3` when not
///   read); `{2, pttl, 0}` refused because the waiter limit is reached.
///
/// Atomic because "is it free / is it mine / am I the head", the fence computation and the
/// write of the new holder must see one state: two clients doing this in separate commands
/// could both see the key free.
///
/// The fence is `max(last fence + 1, server time in µs)`: the tombstone keeps the last
/// fence for the lease TTL plus a margin, so fences strictly increase per key without a
/// permanent key per lock name; after the tombstone is gone, the clock has moved past the
/// last fence unless the server clock stepped back by more than the margin. The tombstone
/// is written with `SET … GET` (Redis ≥ 6.2), which returns the last fence: only when that
/// is not below the clock (same microsecond, or a clock step back) is it written twice.
///
/// Re-entry (the token already holds the key) refreshes the TTL and returns the stored
/// fence; it is also how a waiter whose grant message was lost finds its grant. Only the
/// queue's head may take a free key, FIFO or not, so no waiter is ever overtaken by a
/// newcomer; dead tickets at the head are dropped first.
///
/// A new FIFO ticket is scored `max(now, last score + 1)`, so arrival order survives a
/// server clock step back; a non-FIFO one is scored `now` (one command less).
///
/// Commands, besides `EVALSHA`: free key, nobody waiting: 5 (`GET`, `ZRANGE`, `TIME`,
/// `SET … GET`, `SET`). A waiter's first registration: 5 FIFO, 4 non-FIFO (`GET`, `TIME`,
/// [`ZRANGE` tail], `ZADD`, `PEXPIRE`). A refresh: 8 (`GET`, `PTTL`, `ZRANGE` head, `TIME`,
/// `ZSCORE`, `ZREM`, `ZADD`, `PEXPIRE`), and a `ZRANGE` of the queue after a failed one
/// when the named member is gone.
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{PRELUDE}{}",
        r#"
local token, ttl, id, known = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[8]
local ticket_ttl, margin = tonumber(ARGV[6]), tonumber(ARGV[7])
local named = id ~= '' and known ~= '' and (id .. '|' .. known .. '|' .. ARGV[2] .. '|' .. ARGV[6] .. '|' .. token)
-- Our registered member when the one the last reply named is gone and a refresh whose
-- reply was lost may have renamed it: whichever member carries our ticket id, with its
-- score.
local function search()
  if ARGV[9] ~= '1' then return nil end
  local prefix = id .. '|'
  local all = redis.call('ZRANGE', KEYS[3], 0, -1, 'WITHSCORES')
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, #prefix) == prefix then return all[i], all[i + 1] end
  end
  return nil
end
local held = redis.call('GET', KEYS[1])
local pttl = -3
if held then
  local sp = string.find(held, ' ', 1, true)
  if string.sub(held, sp + 1) == token then
    redis.call('PEXPIRE', KEYS[1], ttl)
    redis.call('PEXPIRE', KEYS[2], ttl + margin)
    if named and redis.call('ZREM', KEYS[3], named) == 0 then
      local renamed = search()
      if renamed then redis.call('ZREM', KEYS[3], renamed) end
    end
    return {1, tonumber(string.sub(held, 1, sp - 1)), 0}
  end
  if id == '' then return {0, redis.call('PTTL', KEYS[1]), 0} end
  if named then
    -- A refresh (every fallback period at most): also drop a dead head, so that no
    -- release hands the key to a waiter that has been gone for longer than a ticket TTL.
    pttl = redis.call('PTTL', KEYS[1])
    live_head(id)
  end
else
  local head = live_head(id)
  if not head or (id ~= '' and string.sub(head, 1, #id + 1) == id .. '|') then
    clock()
    local fence = now_us
    local text = string.format('%.0f', fence)
    local last = redis.call('SET', KEYS[2], text, 'PX', ttl + margin, 'GET')
    if last and tonumber(last) >= fence then
      fence = tonumber(last) + 1
      text = string.format('%.0f', fence)
      redis.call('SET', KEYS[2], text, 'PX', ttl + margin)
    end
    redis.call('SET', KEYS[1], text .. ' ' .. token, 'PX', ttl)
    if head then redis.call('ZREM', KEYS[3], head) end
    return {1, fence, 0}
  end
  if id == '' then return {0, -2, 0} end
  pttl = -2
end
clock()
local deadline = string.format('%.0f', now_ms + ticket_ttl)
local mine, score = named, named and redis.call('ZSCORE', KEYS[3], named)
if named and not score then mine, score = search() end
if score then
  redis.call('ZREM', KEYS[3], mine)
else
  local max = tonumber(ARGV[5])
  if max >= 0 and redis.call('ZCARD', KEYS[3]) >= max then
    -- Dead tickets do not count: drop them, then count again.
    for _, m in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
      if tonumber(string.match(m, '^[^|]*|(%d+)|')) <= now_ms then
        redis.call('ZREM', KEYS[3], m)
      end
    end
    if redis.call('ZCARD', KEYS[3]) >= max then
      return {2, held and redis.call('PTTL', KEYS[1]) or -2, 0}
    end
  end
  score = now_us
  if ARGV[4] == '1' then
    local tail = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
    if tail[2] then score = math.max(score, tonumber(tail[2]) + 1) end
  end
  score = string.format('%.0f', score)
end
redis.call('ZADD', KEYS[3], score, id .. '|' .. deadline .. '|' .. ARGV[2] .. '|' .. ARGV[6] .. '|' .. token)
redis.call('PEXPIRE', KEYS[3], ticket_ttl)
return {0, pttl, now_ms + ticket_ttl}
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
    removed = redis.call('ZREM', KEYS[3], id .. '|' .. ARGV[2] .. '|' .. ARGV[4] .. '|' .. ARGV[8] .. '|' .. token)
  else
    local prefix = id .. '|'
    for _, m in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
      if string.sub(m, 1, #prefix) == prefix then redis.call('ZREM', KEYS[3], m) end
    end
  end
end
local held = redis.call('GET', KEYS[1])
if not held then return -2 end
local sp = string.find(held, ' ', 1, true)
if ARGV[5] == '1' and string.sub(held, sp + 1) == token then
  free_or_handoff(tonumber(string.sub(held, 1, sp - 1)), ARGV[6], tonumber(ARGV[7]))
  return -2
end
return redis.call('PTTL', KEYS[1])
"#
    )
});
