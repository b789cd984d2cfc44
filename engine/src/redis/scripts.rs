//! Every Lua script of the Redis backend, in one place.
//!
//! Each script runs atomically on the server: no other command touches the lock's keys
//! between its first and last call, which is what makes compare-token-then-write safe.
//! Scripts read the server clock with `TIME`, so every deadline (lease TTLs, waiter
//! tickets, fences) is judged by one clock, never by the clients'; and only when they need
//! it: the common paths are counted in commands (see the module docs of `redis`).
//!
//! All keys a script touches are passed in `KEYS` (they share one hash tag, so the script
//! is valid in Redis Cluster too); the wake-up channel is an `ARGV`, because channels are
//! not keys. Fences and scores are microsecond timestamps (about 2^51), exact in Lua's
//! doubles; they are written with `%.0f` because `tostring` would print them in
//! exponent notation.
//!
//! Key kinds (see the module docs of `redis` for the full layout):
//! - `lock`: a string `"<fence> <token>"`, with the lease's TTL. The fence is the first
//!   word, so a release learns the holder and its fence in one `GET`.
//! - `fence`: a string, the last fence granted (the short-lived tombstone); it always
//!   outlives the lock by the margin, so it always exists while the key is held.
//! - `queue`: a zset of waiter tickets scored by arrival; each member is
//!   `"<id>|<deadline ms>|<lease TTL ms>|<claim ms>|<token>"`: everything a release needs to
//!   grant the key to that waiter without asking anyone, the waiter's own claim period
//!   included (nodes with different settings may share a prefix: the releaser's settings
//!   never decide how long a hand-off lasts). A waiter refreshing its ticket renames its
//!   member (new deadline, same score), so its place in line never changes.

use std::sync::LazyLock;

use redis::Script;

/// Shared prelude: the server clock (read at most once, and only when needed), the
/// hand-off to the next waiter, and the removal of dead tickets at the queue's head (all
/// but the caller's own: `live_head(id)`, at most 100 per call to bound the script).
///
/// The hand-off's `PUBLISH` is its last command and the only one that can be refused once
/// the hand-off is written (an ACL without the channel): it runs under `redis.pcall`, so a
/// script that applied a hand-off always reports it, never an error.
///
/// Expects `KEYS[1]` = lock, `KEYS[2]` = fence, `KEYS[3]` = queue.
const PRELUDE: &str = r#"
local now_us, now_ms
local function clock()
  if not now_us then
    local t = redis.call('TIME')
    now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
    now_ms = math.floor(now_us / 1000)
  end
end
local function handoff(fence, member, channel, margin)
  local id, deadline, ttl, claim, token = string.match(member, '^([^|]*)|(%d+)|(%d+)|(%d+)|(.*)$')
  if not id then
    -- A ticket of a version that did not carry its claim: the shortest claim period.
    id, deadline, ttl, token = string.match(member, '^([^|]*)|(%d+)|(%d+)|(.*)$')
    claim = 3000
  end
  -- The waiter's own claim period, from its ticket: the releaser's settings play no part.
  local grant = string.format('%.0f', math.min(tonumber(ttl), tonumber(claim)))
  local text = string.format('%.0f', fence + 1)
  redis.call('SET', KEYS[2], text, 'PX', tonumber(grant) + margin)
  redis.call('SET', KEYS[1], text .. ' ' .. token, 'PX', grant)
  -- A cluster backend names its channels with the kind word 'swake': sharded pub/sub,
  -- delivered within the channel's slot (the lock's), not broadcast to every node.
  local publish = string.find(channel, '^[^{]*{%x+}:swake:') and 'SPUBLISH' or 'PUBLISH'
  -- The grant names the PX it set: the waiter's local deadline is the server's. `pcall`:
  -- the hand-off is applied by now, and a refused publish (a user without the channel's
  -- ACL rights) must not turn it into a reported failure; the waiter finds its grant on
  -- its fallback retry (re-entry).
  redis.pcall(publish, channel, id .. '|' .. deadline .. ' ' .. text .. ' ' .. grant)
end
local function free_or_handoff(fence, channel, margin)
  local next = redis.call('ZPOPMIN', KEYS[3])
  if next[1] then
    handoff(fence, next[1], channel, margin)
  else
    redis.call('DEL', KEYS[1])
    redis.call('PEXPIRE', KEYS[2], margin)
  end
end
local function live_head(id)
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  for _ = 1, 100 do
    if not head then return nil end
    if id ~= '' and string.sub(head, 1, #id + 1) == id .. '|' then return head end
    clock()
    if tonumber(string.match(head, '^[^|]*|(%d+)|')) > now_ms then return head end
    redis.call('ZREM', KEYS[3], head)
    head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  end
  return head
end
"#;

/// Acquire, or register / refresh a waiter.
///
/// - `KEYS[1]` lock, `KEYS[2]` fence tombstone, `KEYS[3]` queue.
/// - `ARGV[1]` token, `ARGV[2]` lease TTL (ms), `ARGV[3]` ticket id (`''`: a plain try
///   that never registers), `ARGV[4]` `'1'` for FIFO, `ARGV[5]` max waiters (`-1`: no
///   limit), `ARGV[6]` ticket TTL (ms; also this waiter's claim period, which its ticket
///   carries), `ARGV[7]` tombstone margin (ms), `ARGV[8]` the deadline of this waiter's
///   registered member as the last reply gave it (`''`: not registered; a registration is
///   a new one).
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
/// [`ZRANGE` tail], `ZADD`, `PEXPIRE`).
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{PRELUDE}{}",
        r#"
local token, ttl, id, known = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[8]
local ticket_ttl, margin = tonumber(ARGV[6]), tonumber(ARGV[7])
local mine = id ~= '' and known ~= '' and (id .. '|' .. known .. '|' .. ARGV[2] .. '|' .. ARGV[6] .. '|' .. token)
local held = redis.call('GET', KEYS[1])
local pttl = -3
if held then
  local sp = string.find(held, ' ', 1, true)
  if string.sub(held, sp + 1) == token then
    redis.call('PEXPIRE', KEYS[1], ttl)
    redis.call('PEXPIRE', KEYS[2], ttl + margin)
    if mine then redis.call('ZREM', KEYS[3], mine) end
    return {1, tonumber(string.sub(held, 1, sp - 1)), 0}
  end
  if id == '' then return {0, redis.call('PTTL', KEYS[1]), 0} end
  if mine then
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
local score = mine and redis.call('ZSCORE', KEYS[3], mine)
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

/// Release, handing the key to the next waiter.
///
/// - `KEYS[1]` lock, `KEYS[2]` fence tombstone, `KEYS[3]` queue.
/// - `ARGV[1]` token, `ARGV[2]` wake-up channel, `ARGV[3]` tombstone margin (ms).
/// - Returns `1` released, `-1` held by another token (nothing changed), `0` nobody holds it.
///
/// Atomic so that the compare-token and the delete are one step (a late release can never
/// delete the next holder's lease), and so that the key passes to the queue's head with
/// no moment in which it is free: nobody can take it in between.
///
/// The hand-off: the head's ticket names its token, lease TTL and claim period, so the
/// script makes it the holder itself (fence = last fence + 1: the tombstone exists while
/// the key is held, and one grant per microsecond never outruns the clock) and publishes
/// `"<id>|<deadline> <fence> <px>"` on the wake-up channel. The woken waiter already holds
/// the lease and needs no round trip. Its lease first runs for `px = min(TTL, claim
/// period)`, both the waiter's own (from its ticket, whatever the releaser's settings),
/// and the waiter's local deadline is computed from that `px`: a waiter that has gone
/// (crashed, cancelled, its message lost while it was gone) holds the key for at most its
/// claim period, never a lease TTL; a live one renews to its full TTL in the background
/// before the claim runs out, and one whose message was lost finds the grant with its next
/// retry (re-entry).
///
/// Commands, besides `EVALSHA`: nobody waiting: 4 (`GET`, `ZPOPMIN`, `DEL`, `PEXPIRE`); a
/// hand-off: 5 (`GET`, `ZPOPMIN`, `SET` fence, `SET` lock, `PUBLISH`).
pub(crate) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{PRELUDE}{RELEASE_BODY}")));

/// The body of [`RELEASE`], shared with [`COMPLETE`] (which runs it as a function).
const RELEASE_BODY: &str = r#"
local held = redis.call('GET', KEYS[1])
if not held then return 0 end
local sp = string.find(held, ' ', 1, true)
if string.sub(held, sp + 1) ~= ARGV[1] then return -1 end
free_or_handoff(tonumber(string.sub(held, 1, sp - 1)), ARGV[2], tonumber(ARGV[3]))
return 1
"#;

/// Release with a record: [`RELEASE`], then, only if it released (the token held the key),
/// the record written in the same atomic step, so that whoever is granted the key next
/// finds it.
///
/// - `KEYS` as [`RELEASE`]'s, then the record (hash) last.
/// - `ARGV` as [`RELEASE`]'s, then five more last: fingerprint, metadata, body, completion
///   time (Unix ms), retention (ms).
/// - Returns what [`RELEASE`] returns; the record is written only on `1`.
///
/// The record's arguments are addressed from the end so that this wrapper stays valid
/// whatever [`RELEASE`] takes.
pub(crate) static COMPLETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{PRELUDE}local function release_lock(){RELEASE_BODY}end\n{}",
        r#"
local r = release_lock()
if r == 1 then
  local rec, n = KEYS[#KEYS], #ARGV
  redis.call('DEL', rec)
  redis.call('HSET', rec, 'fp', ARGV[n - 4], 'meta', ARGV[n - 3], 'body', ARGV[n - 2], 'at', ARGV[n - 1])
  redis.call('PEXPIRE', rec, tonumber(ARGV[n]))
end
return r
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

/// Admin: make a value the holder of a key, whoever holds it now.
///
/// - `KEYS[1]` lock, `KEYS[2]` fence tombstone.
/// - `ARGV[1]` value (owner token), `ARGV[2]` TTL (ms; `-1`: no expiry), `ARGV[3]`
///   tombstone margin (ms).
/// - Returns the new fence.
///
/// Atomic so the new holding gets a fence above every earlier one, as an acquire would.
/// Without a TTL the tombstone has none either (it must outlive the holding); a release
/// gives it its usual short life. Waiters keep waiting: the next release hands them the key.
pub(crate) static ADMIN_SET: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local clock = redis.call('TIME')
local now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
local fence = string.format('%.0f', math.max(last + 1, now_us))
local ttl = tonumber(ARGV[2])
if ttl > 0 then
  redis.call('SET', KEYS[1], fence .. ' ' .. ARGV[1], 'PX', ttl)
  redis.call('SET', KEYS[2], fence, 'PX', ttl + tonumber(ARGV[3]))
else
  redis.call('SET', KEYS[1], fence .. ' ' .. ARGV[1])
  redis.call('SET', KEYS[2], fence)
end
return fence
"#,
    )
});

/// Admin: release a key whoever holds it, handing it to the next waiter.
///
/// - `KEYS[1]` lock, `KEYS[2]` fence tombstone, `KEYS[3]` queue.
/// - `ARGV[1]` wake-up channel, `ARGV[2]` tombstone margin (ms).
/// - Returns `1` if the key was held, `0` if not.
///
/// Atomic for the same reason as [`RELEASE`]: the key passes to the queue's head with no
/// moment in which it is free.
pub(crate) static FORCE_RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{PRELUDE}{}",
        r#"
local held = redis.call('GET', KEYS[1])
if not held then return 0 end
local sp = string.find(held, ' ', 1, true)
free_or_handoff(tonumber(string.sub(held, 1, sp - 1)), ARGV[1], tonumber(ARGV[2]))
return 1
"#
    ))
});

/// Numeric compare-and-set / compare-and-delete.
///
/// - `KEYS[1]` the numeric value.
/// - `ARGV[1]` comparison (`gt` `lt` `ge` `le` `eq` `ne`), `ARGV[2]` the given value,
///   `ARGV[3]` epsilon, `ARGV[4]` `set` or `del`, `ARGV[5]` TTL for `set` (ms; `-1`: none).
/// - Returns `1` if the comparison held (absent counts as held) and the action was applied,
///   `0` if not; an error reply if the stored value is not a number.
///
/// Atomic because the read, the comparison and the write must see one value: two clients
/// raising a high-water mark in separate commands could both win.
pub(crate) static COMPARE_AND_SET: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local stored = redis.call('GET', KEYS[1])
local given, eps = tonumber(ARGV[2]), tonumber(ARGV[3])
if stored then
  local s = tonumber(stored)
  if not s then return redis.error_reply('ERR stored value is not a number') end
  local c, ok = ARGV[1], false
  if c == 'gt' then ok = given > s
  elseif c == 'lt' then ok = given < s
  elseif c == 'ge' then ok = given >= s - eps
  elseif c == 'le' then ok = given <= s + eps
  elseif c == 'eq' then ok = math.abs(given - s) <= eps
  elseif c == 'ne' then ok = math.abs(given - s) > eps
  else return redis.error_reply('ERR unknown comparison') end
  if not ok then return 0 end
end
if ARGV[4] == 'del' then
  redis.call('DEL', KEYS[1])
else
  local ttl = tonumber(ARGV[5])
  if ttl > 0 then
    redis.call('SET', KEYS[1], ARGV[2], 'PX', ttl)
  else
    redis.call('SET', KEYS[1], ARGV[2])
  end
end
return 1
"#,
    )
});

/// Read a numeric value.
///
/// - `KEYS[1]` the numeric value.
/// - Returns the stored text, or nil.
///
/// A script only so that every command of the backend goes through one path (timeouts,
/// retries on a broken connection).
pub(crate) static NUMERIC_GET: LazyLock<Script> =
    LazyLock::new(|| Script::new("return redis.call('GET', KEYS[1])"));

/// Change a pool's members.
///
/// - `KEYS[1]` the pool (hash: member key → the member's Redis lock key).
/// - `ARGV[1]` `add`, `rem`, `replace` or `clear`; then pairs `member, lock key` (`add`,
///   `replace`) or members (`rem`).
/// - Returns the new number of members.
///
/// Atomic so `replace` is never seen half done. An empty hash is deleted by Redis itself.
pub(crate) static POOL_MODIFY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local op = ARGV[1]
if op == 'replace' or op == 'clear' then redis.call('DEL', KEYS[1]) end
if op == 'add' or op == 'replace' then
  for i = 2, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
elseif op == 'rem' then
  for i = 2, #ARGV do redis.call('HDEL', KEYS[1], ARGV[i]) end
end
return redis.call('HLEN', KEYS[1])
"#,
    )
});

/// The members of a pool.
///
/// - `KEYS[1]` the pool.
/// - Returns the member keys, unordered.
///
/// A script only so that every command of the backend goes through one path.
pub(crate) static POOL_MEMBERS: LazyLock<Script> =
    LazyLock::new(|| Script::new("return redis.call('HKEYS', KEYS[1])"));

/// Every member of a pool with its holder, in one round trip.
///
/// - `KEYS[1]` the pool.
/// - Returns a flat list `member, token ('' if free), pttl (-2 free, -1 no expiry)` per
///   member.
///
/// One script so every member is read at the same instant. It reads the members' lock
/// keys, which it learns from the pool itself: valid on a single Redis (and a Sentinel
/// primary), not on Redis Cluster, where members live in other slots.
pub(crate) static POOL_HOLDERS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local members = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #members, 2 do
  local lock = members[i + 1]
  local held = redis.call('GET', lock)
  out[#out + 1] = members[i]
  if held then
    out[#out + 1] = string.sub(held, string.find(held, ' ', 1, true) + 1)
    out[#out + 1] = redis.call('PTTL', lock)
  else
    out[#out + 1] = ''
    out[#out + 1] = -2
  end
end
return out
"#,
    )
});

/// Every script, for loading them all at start-up.
pub(crate) fn all() -> [&'static Script; 15] {
    [
        &ACQUIRE,
        &RELEASE,
        &COMPLETE,
        &LEAVE,
        &EXTEND,
        &RENEW,
        &HOLDER,
        &WAITERS,
        &ADMIN_SET,
        &FORCE_RELEASE,
        &COMPARE_AND_SET,
        &NUMERIC_GET,
        &POOL_MODIFY,
        &POOL_MEMBERS,
        &POOL_HOLDERS,
    ]
}

/// Extend (add to, or replace, the remaining TTL).
///
/// - `KEYS[1]` lock, `KEYS[2]` fence tombstone.
/// - `ARGV[1]` token, `ARGV[2]` duration (ms), `ARGV[3]` `'add'` or `'replace'`,
///   `ARGV[4]` tombstone margin (ms).
/// - Returns the new remaining TTL in ms (≥ 1), `-1` held by another token, `-2` nobody
///   holds it.
///
/// Atomic so the compare-token and the new expiry are one step; the tombstone is kept at
/// least a margin longer than the lease.
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local held = redis.call('GET', KEYS[1])
if not held then return -2 end
if string.sub(held, string.find(held, ' ', 1, true) + 1) ~= ARGV[1] then return -1 end
local ttl = tonumber(ARGV[2])
if ARGV[3] == 'add' then
  local left = redis.call('PTTL', KEYS[1])
  if left > 0 then ttl = left + ttl end
end
if ttl < 1 then ttl = 1 end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl + tonumber(ARGV[4]))
return ttl
"#,
    )
});

/// Renew a batch of leases (the watchdog's one call for many leases).
///
/// - `KEYS[2i-1]` lock of lease `i`, `KEYS[2i]` its fence tombstone.
/// - `ARGV[1]` tombstone margin (ms); `ARGV[2i]` token of lease `i`, `ARGV[2i+1]` its TTL
///   (ms).
/// - Returns one `1` (renewed) or `0` (no longer held by that token) per lease.
///
/// A renewal never shortens a lease (the expiry becomes the later of the current one and
/// now + TTL): a renewal that lands after an `extend_to` must not undo it, or the holder's
/// local deadline would outlive the lease on the server. It is also what turns a handed-off
/// lease's short claim into its full TTL.
///
/// Atomic per lease (compare-token, then expire); one script so a batch costs one round
/// trip.
pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local margin = tonumber(ARGV[1])
local out = {}
for i = 1, #KEYS / 2 do
  local lock, fence = KEYS[2 * i - 1], KEYS[2 * i]
  local ttl = tonumber(ARGV[2 * i + 1])
  local held = redis.call('GET', lock)
  if held and string.sub(held, string.find(held, ' ', 1, true) + 1) == ARGV[2 * i] then
    local left = redis.call('PTTL', lock)
    if left >= 0 and left < ttl then
      redis.call('PEXPIRE', lock, ttl)
      redis.call('PEXPIRE', fence, ttl + margin)
    end
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
"#,
    )
});

/// Who holds a key.
///
/// - `KEYS[1]` lock.
/// - Returns `{token, pttl}`, or `{'', -2}` when nobody holds it.
///
/// One script so that token and TTL come from the same instant.
pub(crate) static HOLDER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local held = redis.call('GET', KEYS[1])
if not held then return {'', -2} end
return {string.sub(held, string.find(held, ' ', 1, true) + 1), redis.call('PTTL', KEYS[1])}
"#,
    )
});

/// How many live waiters a key has, on every node.
///
/// - `KEYS[1]` queue.
/// - Returns the number of tickets whose deadline is still ahead by the server clock.
///
/// Read-only: stale tickets are not counted, and are dropped by later writes. Reads every
/// ticket (the deadline is in the member), which an inspection can afford.
pub(crate) static WAITERS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local clock = redis.call('TIME')
local now_ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local n = 0
for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if tonumber(string.match(m, '^[^|]*|(%d+)|')) > now_ms then n = n + 1 end
end
return n
"#,
    )
});
