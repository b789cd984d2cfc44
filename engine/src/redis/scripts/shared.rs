//! The Lua scripts of shared leases (permits), each with its contract: `KEYS`, `ARGV`, what it returns,
//! why it is atomic, and what it costs in commands.
//!
//! Every script that writes takes the three keys of one permit set, all with the key's
//! hash tag (one Cluster slot):
//!
//! - `KEYS[1]` the holders, a zset: member the holder's token, score the expiry of its
//!   lease (server clock, ms). Its TTL is the latest expiry, so it vanishes with the last
//!   holder even if no script runs.
//! - `KEYS[2]` the fence hash: field `fence` the last fence granted (the tombstone), and per
//!   holder a field `t:<token>` = `"<fence> <s|x>"` (its fence, shared or exclusive). Its
//!   TTL is the latest expiry plus the margin; once nobody holds, only `fence` is left, for
//!   the margin.
//! - `KEYS[3]` the queue, a zset of tickets scored by arrival like the lock's; each member
//!   is `"<id>|<deadline ms>|<lease TTL ms>|<claim ms>|<permits>|<s|x>|<token>"`: all a
//!   script needs to grant that waiter without asking anyone.
//!
//! Each script first drops the holders whose lease ran out and the dead tickets at the
//! queue's head, then grants the queue from its head as many as fit, stopping at the first
//! that does not (so once an exclusive request waits, later shared ones queue behind it),
//! making each the holder itself (for its claim period, as the lock's hand-off does) and
//! publishing `"<id>|<deadline> <fence> <px>"` on the wake-up channel, the lock's message
//! format: the same dispatcher routes it to the waiter holding that ticket. So after any
//! script, the queue's head does not fit, and a crashed holder's permit goes to the next
//! waiter at the first script after its expiry (at the latest a waiter's fallback retry,
//! at most 250 ms later).
//!
//! A shared request fits while nobody holds alone and fewer than its own `permits` hold;
//! an exclusive one while nobody holds. Fences are `max(last fence + 1, server time in
//! µs)` for every grant, so a grant needs the tombstone only to order grants within one
//! microsecond: it outlives the last expiry by the margin, as the lock's does.

use std::sync::LazyLock;

use redis::Script;

/// Shared by the permit scripts that write: the clock, dropping expired holders, the
/// holders' state, one grant, granting the queue, and the keys' expiry.
///
/// Expects `KEYS[1]` holders, `KEYS[2]` fence hash, `KEYS[3]` queue.
const PRELUDE: &str = r#"
local now_us, now_ms
local function clock()
  if not now_us then
    local t = redis.call('TIME')
    now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
    now_ms = math.floor(now_us / 1000)
  end
end
-- Whether the holders changed (then `settle` sets the keys' expiry).
local dirty = false
-- How many hold, and whether one holds alone (nil: not read yet, or changed).
local held, alone
-- A holder runs while its expiry is not before the clock's millisecond: `now_ms` is
-- rounded down, so a permit never ends before its TTL has fully run.
local function drop_expired()
  clock()
  local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. now_ms)
  if gone[1] then
    for _, t in ipairs(gone) do redis.call('HDEL', KEYS[2], 't:' .. t) end
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. now_ms)
    dirty = true
  end
end
local function state()
  if not held then
    held = redis.call('ZCARD', KEYS[1])
    alone = false
    if held == 1 then
      local info = redis.call('HGET', KEYS[2], 't:' .. redis.call('ZRANGE', KEYS[1], 0, 0)[1])
      alone = info and string.sub(info, -1) == 'x' or false
    end
  end
end
local function fits(mode, permits)
  state()
  if mode == 'x' then return held == 0 end
  return not alone and held < permits
end
-- Make `token` a holder for `px` ms; returns its fence and the fence's text.
local function grant(token, mode, px)
  state()
  local last = redis.call('HGET', KEYS[2], 'fence')
  if held == 0 then
    -- Nobody holds: drop the fields of holders whose zset lapsed by its TTL unseen.
    redis.call('DEL', KEYS[2])
  end
  local fence = math.max(tonumber(last or '0') + 1, now_us)
  local text = string.format('%.0f', fence)
  redis.call('HSET', KEYS[2], 'fence', text, 't:' .. token, text .. ' ' .. mode)
  redis.call('ZADD', KEYS[1], now_ms + px, token)
  held, alone, dirty = held + 1, mode == 'x', true
  return fence, text
end
local function ticket(m)
  return string.match(m, '^([^|]*)|(%d+)|(%d+)|(%d+)|(%d+)|([sx])|(.*)$')
end
-- The queue's head after dropping dead tickets (all but the caller's own, `id`; at most
-- 100 per call to bound the script).
local function live_head(id)
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  for _ = 1, 100 do
    if not head then return nil end
    if id ~= '' and string.sub(head, 1, #id + 1) == id .. '|' then return head end
    if tonumber(string.match(head, '^[^|]*|(%d+)|')) > now_ms then return head end
    redis.call('ZREM', KEYS[3], head)
    head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  end
  return head
end
-- Grant the queue from its head, as many as fit, stopping at the first that does not.
-- Each is made the holder for its claim period and told on `channel` (sharded on a
-- Cluster: kind word 'pswake'), except the caller's own ticket `own`, which gets its full
-- TTL and learns of it from the script's reply. Returns the caller's fence if it was
-- granted, and the first ticket that does not fit (nil: nobody waits).
local function pump(own, channel)
  local mine
  local publish = string.find(channel, '^[^{]*{%x+}:pswake:') and 'SPUBLISH' or 'PUBLISH'
  while true do
    local head = live_head(own)
    if not head then return mine, nil end
    local id, deadline, ttl, claim, permits, mode, token = ticket(head)
    if not id then
      redis.call('ZREM', KEYS[3], head)
    elseif fits(mode, tonumber(permits)) then
      redis.call('ZREM', KEYS[3], head)
      if id == own then
        mine = grant(token, mode, tonumber(ttl))
      else
        local px = string.format('%.0f', math.min(tonumber(ttl), tonumber(claim)))
        local _, text = grant(token, mode, tonumber(px))
        -- `pcall`: the grant is applied by now; a refused publish (no channel rights)
        -- leaves the waiter to find it on its fallback retry (re-entry).
        redis.pcall(publish, channel, id .. '|' .. deadline .. ' ' .. text .. ' ' .. px)
      end
    else
      return mine, head
    end
  end
end
-- Expire the holders at the latest holder's expiry, the fence hash a margin later.
local function expire(holders, fences, margin)
  local top = redis.call('ZRANGE', holders, -1, -1, 'WITHSCORES')
  if top[2] then
    -- The latest holder runs through its expiry's millisecond (see `drop_expired`).
    local px = tonumber(top[2]) - now_ms + 1
    redis.call('PEXPIRE', holders, px)
    redis.call('PEXPIRE', fences, px + margin)
  else
    redis.call('PEXPIRE', fences, margin)
  end
end
local function settle(margin)
  if dirty then expire(KEYS[1], KEYS[2], margin) end
end
-- The remaining TTL of the first holder to expire (when to look again), -2 if none.
local function earliest()
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if not first[2] then return -2 end
  return math.max(tonumber(first[2]) - now_ms, 1)
end
"#;

/// Acquire a permit, or register / refresh a waiter.
///
/// - `KEYS[1]` holders, `KEYS[2]` fence hash, `KEYS[3]` queue.
/// - `ARGV[1]`–`ARGV[7]` as the lock's acquire script: token, lease TTL (ms), ticket id
///   (`''`: a plain try that never registers), flags (`r` the last refresh failed: the
///   ticket is then looked for by its id; others ignored), max waiters (`-1`:
///   no limit), ticket TTL (ms; also the claim period), the deadline of the registered
///   ticket as last reported (`''`: not registered); `ARGV[8]` tombstone margin (ms),
///   `ARGV[9]` permits (how many shared holders at most), `ARGV[10]` `'x'` exclusive or
///   `'s'` shared, `ARGV[11]` the wake-up channel (waiters this script grants are told).
/// - Returns `{1, fence, 0}` granted; `{0, pttl, deadline}` not granted (`pttl`: when the
///   first holder expires, `-2` if nobody holds; `deadline` names the registered ticket,
///   `0` if none); `{2, pttl, 0}` refused because the waiter limit is reached.
///
/// Re-entry (the token holds a permit) refreshes its TTL and returns its fence, keeping its
/// kind; it is also how a waiter whose grant message was lost finds its grant. A token
/// holding a shared permit that asks for an exclusive one is answered `{4, 0, 0}` (not
/// upgraded: others may share the key beside it), and its ticket, if any, removed. A request is granted on
/// arrival only if nobody waits and it fits; a waiter whose ticket the script itself
/// grants (it reached the head and fits) gets its full TTL.
///
/// Atomic because dropping expired holders, counting the holders, checking the queue and
/// writing the new holder must see one state.
///
/// Commands, besides `EVALSHA`: nobody holds or waits: 12 (`TIME`, `ZRANGEBYSCORE`,
/// `ZSCORE`, `ZRANGE` head, `ZCARD`, `HGET`, `DEL`, `HSET`, `ZADD`, `ZRANGE` tail,
/// `PEXPIRE` ×2); beside other shared holders 11 (no `DEL`), and `ZRANGE` + `HGET` more
/// when exactly one holds (is it alone?). A waiter's registration: `TIME`, `ZRANGEBYSCORE`, `ZSCORE`, `ZRANGE` head,
/// `ZCARD` (and `ZRANGE` + `HGET` with one holder), `ZRANGE` holders, `ZRANGE` tail,
/// `ZADD`, `PEXPIRE`.
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{PRELUDE}{}",
        r#"
local token, ttl, id, known = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[7]
local ticket_ttl, margin = tonumber(ARGV[6]), tonumber(ARGV[8])
local permits, mode, channel = tonumber(ARGV[9]), ARGV[10], ARGV[11]
local renamed = string.find(ARGV[4], 'r', 1, true)
local tail = '|' .. ARGV[2] .. '|' .. ARGV[6] .. '|' .. ARGV[9] .. '|' .. mode .. '|' .. token
local named = id ~= '' and known ~= '' and (id .. '|' .. known .. tail)
-- Our registered member when the one the last reply named is gone and a refresh whose
-- reply was lost may have renamed it: whichever member carries our ticket id.
local function search()
  if not renamed then return nil end
  local prefix = id .. '|'
  local all = redis.call('ZRANGE', KEYS[3], 0, -1, 'WITHSCORES')
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, #prefix) == prefix then return all[i], all[i + 1] end
  end
  return nil
end
local function forget_ticket()
  if named and redis.call('ZREM', KEYS[3], named) == 0 then
    local renamed = search()
    if renamed then redis.call('ZREM', KEYS[3], renamed) end
  end
end
drop_expired()
if redis.call('ZSCORE', KEYS[1], token) then
  local info = redis.call('HGET', KEYS[2], 't:' .. token) or '0'
  if mode == 'x' and string.sub(info, -1) ~= 'x' then
    -- Not upgraded: others may hold the key beside this shared permit.
    forget_ticket()
    pump(id, channel)
    settle(margin)
    return {4, 0, 0}
  end
  redis.call('ZADD', KEYS[1], now_ms + ttl, token)
  dirty = true
  forget_ticket()
  pump(id, channel)
  settle(margin)
  return {1, tonumber(string.match(info, '^(%d+)')), 0}
end
local mine, waiting = pump(id, channel)
if mine then
  settle(margin)
  return {1, mine, 0}
end
if not waiting and fits(mode, permits) then
  local fence = grant(token, mode, ttl)
  settle(margin)
  return {1, fence, 0}
end
settle(margin)
local pttl = earliest()
if id == '' then return {0, pttl, 0} end
local deadline = string.format('%.0f', now_ms + ticket_ttl)
local member, score = named, named and redis.call('ZSCORE', KEYS[3], named)
if named and not score then member, score = search() end
if score then
  redis.call('ZREM', KEYS[3], member)
else
  local max = tonumber(ARGV[5])
  if max >= 0 and redis.call('ZCARD', KEYS[3]) >= max then
    -- Dead tickets do not count: drop them, then count again.
    for _, m in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
      if tonumber(string.match(m, '^[^|]*|(%d+)|')) <= now_ms then
        redis.call('ZREM', KEYS[3], m)
      end
    end
    if redis.call('ZCARD', KEYS[3]) >= max then return {2, pttl, 0} end
  end
  -- Behind the last ticket whatever the clock says, FIFO or not: arrival order holds
  -- through a server clock step back for every ticket.
  score = now_us
  local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
  if last[2] then score = math.max(score, tonumber(last[2]) + 1) end
  score = string.format('%.0f', score)
end
redis.call('ZADD', KEYS[3], score, id .. '|' .. deadline .. tail)
redis.call('PEXPIRE', KEYS[3], ticket_ttl)
return {0, pttl, now_ms + ticket_ttl}
"#
    ))
});

/// A waiter leaves (timed out, cancelled, or failed), giving back a grant it may have
/// received unseen.
///
/// - `KEYS` as [`ACQUIRE`]'s.
/// - `ARGV[1]` ticket id (`''`: none), `ARGV[2]` its deadline as last reported (`''`:
///   unknown: the queue is searched by id), `ARGV[3]` token, `ARGV[4]` lease TTL (ms),
///   `ARGV[5]` `'1'` to give back the permit `token` holds, `ARGV[6]` wake-up channel,
///   `ARGV[7]` tombstone margin (ms), `ARGV[8]` claim period (ms), `ARGV[9]` permits,
///   `ARGV[10]` `'x'` or `'s'` (`ARGV[1]`–`ARGV[8]` as the lock's leave script).
/// - Returns the remaining TTL of the first holder to expire (ms), `-2` if nobody holds.
///
/// Atomic so that removing the ticket, giving back a grant and granting the waiters that
/// now fit (the leaving ticket may have been the head that did not fit) are one step.
///
/// Also sent as a plain `EVAL` of [`LEAVE_SOURCE`], behind an unseen acquire on its
/// connection (see the lock's leave script).
pub(crate) static LEAVE: LazyLock<Script> = LazyLock::new(|| Script::new(&LEAVE_SOURCE));

/// The source of [`LEAVE`].
pub(crate) static LEAVE_SOURCE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{PRELUDE}{}",
        r#"
local id, token = ARGV[1], ARGV[3]
drop_expired()
if id ~= '' then
  if ARGV[2] ~= '' then
    redis.call('ZREM', KEYS[3], id .. '|' .. ARGV[2] .. '|' .. ARGV[4] .. '|' .. ARGV[8] .. '|' .. ARGV[9] .. '|' .. ARGV[10] .. '|' .. token)
  else
    local prefix = id .. '|'
    for _, m in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
      if string.sub(m, 1, #prefix) == prefix then redis.call('ZREM', KEYS[3], m) end
    end
  end
end
if ARGV[5] == '1' and redis.call('ZREM', KEYS[1], token) == 1 then
  redis.call('HDEL', KEYS[2], 't:' .. token)
  held, dirty = nil, true
end
pump('', ARGV[6])
settle(tonumber(ARGV[7]))
return earliest()
"#
    )
});

/// Release a permit, granting the waiters that now fit.
///
/// - `KEYS` as [`ACQUIRE`]'s.
/// - `ARGV[1]` token, `ARGV[2]` wake-up channel, `ARGV[3]` tombstone margin (ms).
/// - Returns `1` released, `-1` the token holds no permit but someone does, `0` nobody
///   holds one.
///
/// Atomic so that the compare-token and the removal are one step (a late release never
/// removes another's permit), and so that the freed permit passes to the queue's head
/// with no moment in which a newcomer could take it.
///
/// Commands, besides `EVALSHA`: nobody waiting: 7 (`TIME`, `ZRANGEBYSCORE`, `ZREM`,
/// `HDEL`, `ZRANGE` head, `ZRANGE` tail, `PEXPIRE`; one more `PEXPIRE` while others
/// hold). Each grant to a waiter: `ZCARD` (once; `ZRANGE` + `HGET` when one holds),
/// `ZREM` ticket, `HGET` fence, `HSET`, `ZADD`, `PUBLISH`, `ZRANGE` next head (`DEL` of the
/// fence hash's stale fields when nobody held).
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{PRELUDE}{}",
        r#"
drop_expired()
local r
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  redis.call('HDEL', KEYS[2], 't:' .. ARGV[1])
  held, dirty, r = nil, true, 1
elseif redis.call('EXISTS', KEYS[1]) == 1 then
  r = -1
else
  r = 0
end
pump('', ARGV[2])
settle(tonumber(ARGV[3]))
return r
"#
    ))
});

/// Extend a permit (add to, or replace, its remaining TTL).
///
/// - `KEYS[1]` holders, `KEYS[2]` fence hash.
/// - `ARGV[1]` token, `ARGV[2]` duration (ms), `ARGV[3]` `'add'` or `'replace'`, `ARGV[4]`
///   tombstone margin (ms).
/// - Returns the new remaining TTL in ms (≥ 1), `-1` the token holds no live permit but
///   someone does, `-2` nobody holds one.
///
/// Atomic so the compare-token and the new expiry are one step. It changes no other
/// holder (an expired one is left for the next writing script to drop), so it grants
/// nobody and needs no queue.
///
/// Commands, besides `EVALSHA`: 6 (`TIME`, `ZSCORE`, `ZADD`, `ZRANGE` tail, `PEXPIRE` ×2).
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{PRELUDE}{}",
        r#"
clock()
local score = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]) or '0')
if score < now_ms then
  if redis.call('ZRANGEBYSCORE', KEYS[1], now_ms, '+inf', 'LIMIT', 0, 1)[1] then return -1 end
  return -2
end
local ttl = tonumber(ARGV[2])
if ARGV[3] == 'add' then ttl = score - now_ms + ttl end
if ttl < 1 then ttl = 1 end
redis.call('ZADD', KEYS[1], now_ms + ttl, ARGV[1])
expire(KEYS[1], KEYS[2], tonumber(ARGV[4]))
return ttl
"#
    ))
});

/// Renew a batch of permits (the watchdog's one call for many).
///
/// - `KEYS[2i-1]` holders of permit `i`, `KEYS[2i]` its fence hash.
/// - `ARGV[1]` tombstone margin (ms); `ARGV[2i]` token of permit `i`, `ARGV[2i+1]` its TTL
///   (ms).
/// - Returns one `1` (renewed) or `0` (no longer held by that token) per permit.
///
/// A renewal never shortens a permit (as the lock's); it is what turns a hand-off's short
/// claim into the full TTL. Atomic per permit; one script so a batch is one round trip.
///
/// Commands, besides `EVALSHA`: `TIME`, then per permit `ZSCORE`, and when it lengthens
/// it `ZADD`, `ZRANGE` tail, `PEXPIRE` ×2.
pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{PRELUDE}{}",
        r#"
clock()
local margin = tonumber(ARGV[1])
local out = {}
for i = 1, #KEYS / 2 do
  local holders, fences = KEYS[2 * i - 1], KEYS[2 * i]
  local token, ttl = ARGV[2 * i], tonumber(ARGV[2 * i + 1])
  local score = tonumber(redis.call('ZSCORE', holders, token) or '0')
  if score >= now_ms then
    if score < now_ms + ttl then
      redis.call('ZADD', holders, now_ms + ttl, token)
      expire(holders, fences, margin)
    end
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
"#
    ))
});

/// Who holds permits.
///
/// - `KEYS[1]` holders, `KEYS[2]` fence hash.
/// - Returns `{token, pttl, mode, …}` for every holder whose lease runs (mode `'x'` or
///   `'s'`).
///
/// Read-only, one script so that every holder is read at the same instant.
pub(crate) static HOLDERS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
local live = redis.call('ZRANGEBYSCORE', KEYS[1], now_ms, '+inf', 'WITHSCORES')
for i = 1, #live, 2 do
  local info = redis.call('HGET', KEYS[2], 't:' .. live[i]) or ''
  out[#out + 1] = live[i]
  out[#out + 1] = math.max(tonumber(live[i + 1]) - now_ms, 1)
  out[#out + 1] = string.sub(info, -1) == 'x' and 'x' or 's'
end
return out
"#,
    )
});

/// Every permit script, for loading them with the lock's.
pub(crate) fn all() -> [&'static Script; 6] {
    [&ACQUIRE, &LEAVE, &RELEASE, &EXTEND, &RENEW, &HOLDERS]
}
