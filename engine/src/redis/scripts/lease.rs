//! The scripts of a lease's life and of inspection: extend, the watchdog's batched renewal,
//! the holder, the waiters.

use std::sync::LazyLock;

use redis::Script;

/// Extend (add to, or replace, the remaining TTL).
///
/// - `KEYS[1]` lock.
/// - `ARGV[1]` token, `ARGV[2]` duration (ms), `ARGV[3]` `'add'` or `'replace'`.
/// - Returns the new remaining TTL in ms (≥ 1), `-1` held by another token, `-2` nobody
///   holds it.
///
/// Atomic so the compare-token and the new expiry are one step. (The fence lives in the
/// lock's value: there is no other key to keep alive.)
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
return ttl
"#,
    )
});

/// Renew a batch of leases (the watchdog's one call for many leases).
///
/// - `KEYS[i]` lock of lease `i`.
/// - `ARGV[2i-1]` token of lease `i`, `ARGV[2i]` its TTL (ms).
/// - Returns one `1` (renewed) or `0` (no longer held by that token) per lease.
///
/// A renewal never shortens a lease (the expiry becomes the later of the current one and
/// now + TTL): a renewal that lands after an `extend_to` must not undo it, or the holder's
/// local deadline would outlive the lease on the server. It is also what turns a handed-off
/// lease's short claim into its full TTL.
///
/// Atomic per lease (compare-token, then expire); one script so a batch costs one round
/// trip. Commands per lease: 1 (`GET`) when not held, else 2 or 3 (`GET`, `PTTL`,
/// \[`PEXPIRE`\]).
pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local out = {}
for i = 1, #KEYS do
  local lock = KEYS[i]
  local ttl = tonumber(ARGV[2 * i])
  local held = redis.call('GET', lock)
  if held and string.sub(held, string.find(held, ' ', 1, true) + 1) == ARGV[2 * i - 1] then
    local left = redis.call('PTTL', lock)
    if left >= 0 and left < ttl then
      redis.call('PEXPIRE', lock, ttl)
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
/// - `ARGV[1]` `'list'` (the lock's queue) or `'zset'` (the shared leases').
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
for _, m in ipairs(redis.call(ARGV[1] == 'zset' and 'ZRANGE' or 'LRANGE', KEYS[1], 0, -1)) do
  if tonumber(string.match(m, '^[^|]*|(%d+)|')) > now_ms then n = n + 1 end
end
return n
"#,
    )
});
