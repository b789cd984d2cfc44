//! Every Lua script of the Redis backend, in one place.
//!
//! Each script runs atomically on the server: no other command touches the lock's keys
//! between its first and last call, which is what makes compare-token-then-write safe.
//! Scripts read the server clock with `TIME`, so every deadline (lease TTLs, waiter
//! tickets, fences) is judged by one clock, never by the clients'.
//!
//! All keys a script touches are passed in `KEYS` (they share one hash tag, so the script
//! is valid in Redis Cluster too); the wake-up channel is an `ARGV`, because channels are
//! not keys. Fences and scores are microsecond timestamps (about 2^51), exact in Lua's
//! doubles; they are written with `%.0f` because `tostring` would print them in
//! exponent notation.
//!
//! Key kinds (see the module docs of `redis` for the full layout):
//! `lock` (hash: `t` = owner token, `f` = fence), `fence` (string: last fence granted, the
//! short-lived tombstone), `queue` (zset: FIFO tickets scored by arrival), `wait` (zset:
//! every waiter's ticket scored by its deadline in server milliseconds).

use std::sync::LazyLock;

use redis::Script;

/// Shared prelude: the server clock (read at most once, and only when needed), the sweep
/// of tickets whose waiters stopped refreshing them (crashed processes, lost connections),
/// and the wake-up.
///
/// Nothing here costs more than one command while nobody waits: `sweep` first reads the
/// earliest ticket deadline, and stops there when the wait zset does not exist or when no
/// deadline has passed. Every ticket in the queue is also in the wait zset, and the wait
/// zset never expires before the queue, so "no wait zset" means "nobody waits, FIFO or not".
///
/// Expects `KEYS[3]` = queue and `KEYS[4]` = wait.
const PRELUDE: &str = r#"
local now_us, now_ms
local function clock()
  if not now_us then
    local t = redis.call('TIME')
    now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
    now_ms = math.floor(now_us / 1000)
  end
end
local function sweep()
  local first = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
  if not first[1] then return false, false end
  clock()
  if tonumber(first[2]) > now_ms then return true, false end
  local dead = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now_ms, 'LIMIT', 0, 64)
  if #dead > 0 then
    redis.call('ZREM', KEYS[4], unpack(dead))
    redis.call('ZREM', KEYS[3], unpack(dead))
  end
  return redis.call('EXISTS', KEYS[4]) == 1, #dead > 0
end
local function wake(channel)
  if sweep() then
    local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
    redis.call('PUBLISH', channel, head or '')
  end
end
"#;

/// Acquire, or register / refresh a waiter.
///
/// - `KEYS[1]` lock, `KEYS[2]` fence tombstone, `KEYS[3]` queue, `KEYS[4]` wait.
/// - `ARGV[1]` token, `ARGV[2]` lease TTL (ms), `ARGV[3]` ticket (`''`: a plain try that
///   never registers), `ARGV[4]` `'1'` for FIFO, `ARGV[5]` max waiters (`-1`: no limit),
///   `ARGV[6]` ticket TTL (ms), `ARGV[7]` tombstone margin (ms), `ARGV[8]` `'1'` if an
///   earlier attempt may have registered the ticket (`'0'`: the server has never seen it,
///   so there is none to remove on a grant, and a registration is a new one).
/// - Returns `{1, fence}` granted; `{0, pttl}` not granted (the ticket is registered or
///   refreshed when one was given; `pttl` is `-2` when the key is free but the FIFO head
///   goes first); `{2, pttl}` refused because the waiter limit is reached.
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
/// fence. A non-FIFO caller also respects a FIFO queue: only its head may take a free key,
/// so FIFO waiters are never overtaken. Dead tickets are swept when they could be in the
/// way: a free key whose queue head is another ticket, or a waiter limit to check.
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{PRELUDE}{}",
        r#"
local token, ticket = ARGV[1], ARGV[3]
local ttl, ticket_ttl, margin = tonumber(ARGV[2]), tonumber(ARGV[6]), tonumber(ARGV[7])
local fifo = ARGV[4] == '1'
local lock = redis.call('HMGET', KEYS[1], 't', 'f')
local holder = lock[1]
if holder == token then
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[2], ttl + margin)
  if ticket ~= '' then
    redis.call('ZREM', KEYS[3], ticket)
    redis.call('ZREM', KEYS[4], ticket)
  end
  return {1, tonumber(lock[2])}
end
local pttl = -2
local may_take = false
if holder then
  pttl = redis.call('PTTL', KEYS[1])
else
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if head and head ~= ticket then
    -- Someone else is first: unless their ticket is dead.
    local _, swept = sweep()
    if swept then
      head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
    end
  end
  may_take = (not head) or (head == ticket)
end
if may_take then
  clock()
  local fence = now_us
  local text = string.format('%.0f', fence)
  local last = redis.call('SET', KEYS[2], text, 'PX', ttl + margin, 'GET')
  if last and tonumber(last) >= fence then
    fence = tonumber(last) + 1
    text = string.format('%.0f', fence)
    redis.call('SET', KEYS[2], text, 'PX', ttl + margin)
  end
  redis.call('HSET', KEYS[1], 't', token, 'f', text)
  redis.call('PEXPIRE', KEYS[1], ttl)
  if ticket ~= '' and ARGV[8] == '1' and redis.call('ZREM', KEYS[4], ticket) == 1 and fifo then
    redis.call('ZREM', KEYS[3], ticket)
  end
  return {1, fence}
end
if ticket == '' then
  return {0, pttl}
end
clock()
if ARGV[8] ~= '1' or not redis.call('ZSCORE', KEYS[4], ticket) then
  local max = tonumber(ARGV[5])
  if max >= 0 then
    sweep()
    if redis.call('ZCARD', KEYS[4]) >= max then
      return {2, pttl}
    end
  end
  if fifo then
    local tail = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
    local seq = now_us
    if tail[2] then seq = math.max(seq, tonumber(tail[2]) + 1) end
    redis.call('ZADD', KEYS[3], string.format('%.0f', seq), ticket)
  end
end
redis.call('ZADD', KEYS[4], now_ms + ticket_ttl, ticket)
redis.call('PEXPIRE', KEYS[4], ticket_ttl)
if fifo then
  -- A no-op (0) when no FIFO waiter is queued.
  redis.call('PEXPIRE', KEYS[3], ticket_ttl)
end
return {0, pttl}
"#
    ))
});

/// Release.
///
/// - `KEYS[1]` lock, `KEYS[2]` fence tombstone, `KEYS[3]` queue, `KEYS[4]` wait.
/// - `ARGV[1]` token, `ARGV[2]` wake-up channel, `ARGV[3]` tombstone margin (ms).
/// - Returns `1` released, `-1` held by another token (nothing changed), `0` nobody holds it.
///
/// Atomic so that the compare-token and the delete are one step (a late release can never
/// delete the next holder's lease), and so that the wake-up names the queue head as it is
/// at the moment the key becomes free. It publishes only when someone waits: the FIFO
/// head's ticket (only that waiter is woken), or `''` (one waiter per node is woken). With
/// nobody waiting it costs four commands (`HGET`, `DEL`, `PEXPIRE`, one `ZRANGE`).
pub(crate) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{PRELUDE}{RELEASE_BODY}")));

/// The body of [`RELEASE`], shared with [`COMPLETE`] (which runs it as a function).
const RELEASE_BODY: &str = r#"
local holder = redis.call('HGET', KEYS[1], 't')
if not holder then return 0 end
if holder ~= ARGV[1] then return -1 end
redis.call('DEL', KEYS[1])
redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[3]))
wake(ARGV[2])
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

/// Read a record: fingerprint, metadata, body, completion time (all nil when absent).
///
/// - `KEYS[1]` the record.
///
/// A script rather than a plain `HMGET` only so that it runs on the same pooled path
/// (timeouts, reconnection) as every other call.
pub(crate) static RECORD: LazyLock<Script> = LazyLock::new(|| {
    Script::new("return redis.call('HMGET', KEYS[1], 'fp', 'meta', 'body', 'at')")
});

/// A waiter leaves (timed out, cancelled, or failed); optionally gives back a grant it may
/// have received unseen.
///
/// - `KEYS[1]` lock, `KEYS[2]` fence tombstone, `KEYS[3]` queue, `KEYS[4]` wait.
/// - `ARGV[1]` ticket (`''`: none), `ARGV[2]` token, `ARGV[3]` `'1'` to release the key if
///   `token` holds it, `ARGV[4]` wake-up channel, `ARGV[5]` tombstone margin (ms).
/// - Returns the holder's remaining TTL in ms, `-2` when the key is free.
///
/// Atomic so that removing the ticket and passing on the wake-up see one state: if the key
/// is free and others still wait, the leaving waiter may have swallowed the wake-up meant
/// for them, so it publishes a new one.
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
if ARGV[1] ~= '' then
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('ZREM', KEYS[4], ARGV[1])
end
local holder = redis.call('HGET', KEYS[1], 't')
if holder and ARGV[3] == '1' and holder == ARGV[2] then
  redis.call('DEL', KEYS[1])
  redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[5]))
  holder = false
end
if holder then
  return redis.call('PTTL', KEYS[1])
end
wake(ARGV[4])
return -2
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
/// gives it its usual short life.
pub(crate) static ADMIN_SET: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local clock = redis.call('TIME')
local now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
local fence = string.format('%.0f', math.max(last + 1, now_us))
local ttl = tonumber(ARGV[2])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 't', ARGV[1], 'f', fence)
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('SET', KEYS[2], fence, 'PX', ttl + tonumber(ARGV[3]))
else
  redis.call('SET', KEYS[2], fence)
end
return fence
"#,
    )
});

/// Admin: release a key whoever holds it.
///
/// - `KEYS[1]` lock, `KEYS[2]` fence tombstone, `KEYS[3]` queue, `KEYS[4]` wait.
/// - `ARGV[1]` wake-up channel, `ARGV[2]` tombstone margin (ms).
/// - Returns `1` if the key was held, `0` if not.
///
/// Atomic for the same reason as [`RELEASE`]: the wake-up names the queue head as it is
/// when the key becomes free.
pub(crate) static FORCE_RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{PRELUDE}{}",
        r#"
if redis.call('DEL', KEYS[1]) == 0 then return 0 end
redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[2]))
wake(ARGV[1])
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
  local holder = redis.call('HGET', lock, 't')
  out[#out + 1] = members[i]
  if holder then
    out[#out + 1] = holder
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
pub(crate) fn all() -> [&'static Script; 16] {
    [
        &ACQUIRE,
        &RELEASE,
        &COMPLETE,
        &RECORD,
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
local holder = redis.call('HGET', KEYS[1], 't')
if not holder then return -2 end
if holder ~= ARGV[1] then return -1 end
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
/// local deadline would outlive the lease on the server.
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
  if redis.call('HGET', lock, 't') == ARGV[2 * i] then
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
local holder = redis.call('HGET', KEYS[1], 't')
if not holder then return {'', -2} end
return {holder, redis.call('PTTL', KEYS[1])}
"#,
    )
});

/// How many live waiters a key has, on every node.
///
/// - `KEYS[1]` wait.
/// - Returns the number of tickets whose deadline is still ahead by the server clock.
///
/// Read-only: stale tickets are not counted, and are swept by the next write.
pub(crate) static WAITERS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local clock = redis.call('TIME')
local now_ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
return redis.call('ZCOUNT', KEYS[1], '(' .. now_ms, '+inf')
"#,
    )
});
