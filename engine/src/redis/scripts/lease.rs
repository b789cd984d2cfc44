//! The scripts of a lease's life and of inspection, in both modes: extend, the watchdog's
//! batched renewal, the holders, the waiters.

use std::sync::LazyLock;

use redis::Script;

/// A lease's prelude: who holds a key (alone: the lock value's token; shared: `''`, the
/// holders hash), and a shared holder's expiry, read and set. The lock key outlives every
/// shared holder's expiry, and so does the holders hash.
const LEASE: &str = r#"
local now_ms
local function clock()
  if not now_ms then
    local t = redis.call('TIME')
    now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
end
local function holder_of(lock)
  local held = redis.call('GET', lock)
  -- The token alone: a label follows it behind byte 31.
  return held and string.match(held, '^[^ ]* ([^\31]*)')
end
-- A shared holder's expiry and fence (with its label, as stored); nil when `token` holds
-- no running shared lease.
local function shared_of(holders, token)
  local mine = redis.call('HGET', holders, token)
  if not mine then return nil end
  clock()
  local expiry, f = string.match(mine, '^(%d+) (%d+.*)$')
  if tonumber(expiry) < now_ms then return nil end
  return tonumber(expiry), f
end
-- A shared holder's lease runs `ttl` from now; the keys at least as long.
local function set_shared(lock, holders, token, ttl, f)
  redis.call('HSET', holders, token, string.format('%.0f', now_ms + ttl) .. ' ' .. f)
  if redis.call('PTTL', lock) < ttl then
    redis.call('PEXPIRE', lock, ttl)
    redis.call('PEXPIRE', holders, ttl)
  end
end
"#;

/// Extend (add to, or replace, the remaining TTL).
///
/// - `KEYS[1]` lock, `KEYS[2]` holders.
/// - `ARGV[1]` token, `ARGV[2]` duration (ms), `ARGV[3]` `'add'` or `'replace'`.
/// - Returns the new remaining TTL in ms (≥ 1), `-1` held by others, `-2` nobody holds it.
///
/// Atomic so the compare-token and the new expiry are one step. Commands: alone 2 or 3
/// (`GET`, \[`PTTL`\], `PEXPIRE`); shared 5 to 7 (`GET`, `HGET`, `TIME`, `HSET`, `PTTL`,
/// \[`PEXPIRE` ×2\]).
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LEASE}{}",
        r#"
local holder = holder_of(KEYS[1])
if not holder then return -2 end
local ttl = tonumber(ARGV[2])
if holder == ARGV[1] then
  if ARGV[3] == 'add' then
    local left = redis.call('PTTL', KEYS[1])
    if left > 0 then ttl = left + ttl end
  end
  ttl = math.max(ttl, 1)
  redis.call('PEXPIRE', KEYS[1], ttl)
  return ttl
end
local expiry, f = holder == '' and shared_of(KEYS[2], ARGV[1])
if not expiry then return -1 end
if ARGV[3] == 'add' then ttl = expiry - now_ms + ttl end
ttl = math.max(ttl, 1)
set_shared(KEYS[1], KEYS[2], ARGV[1], ttl, f)
return ttl
"#
    ))
});

/// Renew a batch of leases of either mode (the watchdog's one call for many leases).
///
/// - `KEYS[2i-1]` lock of lease `i`, `KEYS[2i]` its holders.
/// - `ARGV[2i-1]` token of lease `i`, `ARGV[2i]` its TTL (ms).
/// - Returns one `1` (renewed) or `0` (no longer held by that token) per lease.
///
/// A renewal never shortens a lease (the expiry becomes the later of the current one and
/// now + TTL): a renewal that lands after an `extend_to` must not undo it, or the holder's
/// local deadline would outlive the lease on the server. It is also what turns a handed-off
/// lease's short claim into its full TTL.
///
/// Atomic per lease; one script so a batch costs one round trip. Commands per lease
/// alone: 1 (`GET`) when not held, else 2 or 3 (`GET`, `PTTL`, \[`PEXPIRE`\]); shared:
/// `GET`, `HGET`, and when it lengthens `HSET`, `PTTL` (\[`PEXPIRE` ×2\]), plus one `TIME`.
pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LEASE}{}",
        r#"
local out = {}
for i = 1, #KEYS / 2 do
  local lock, holders = KEYS[2 * i - 1], KEYS[2 * i]
  local token, ttl = ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  local holder = holder_of(lock)
  out[i] = 0
  if holder == token then
    local left = redis.call('PTTL', lock)
    if left >= 0 and left < ttl then redis.call('PEXPIRE', lock, ttl) end
    out[i] = 1
  elseif holder == '' then
    local expiry, f = shared_of(holders, token)
    if expiry then
      if expiry < now_ms + ttl then set_shared(lock, holders, token, ttl, f) end
      out[i] = 1
    end
  end
end
return out
"#
    ))
});

/// Who holds a key.
///
/// - `KEYS[1]` lock, `KEYS[2]` holders.
/// - Returns `{token, pttl, mode, fence, label, …}`: the holder alone (`'x'` the lock,
///   `'a'` a shared request alone), or every shared holder whose lease runs (`'s'`), each
///   with its grant's fence and its label (`''`: none); nothing when nobody holds it.
///
/// Read-only, one script so that every holder is read at the same instant.
pub(crate) static HOLDERS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LEASE}{}",
        r#"
local held = redis.call('GET', KEYS[1])
if not held then return {} end
local f, a, holder = string.match(held, '^(%d+)(a?)[^ ]* (.*)$')
if holder ~= '' then
  local token, label = string.match(holder, '^([^\31]*)\31?(.*)$')
  return {token, redis.call('PTTL', KEYS[1]), a == 'a' and 'a' or 'x', f, label}
end
clock()
local out = {}
local all = redis.call('HGETALL', KEYS[2])
for i = 1, #all, 2 do
  local expiry, sf, label = string.match(all[i + 1], '^(%d+) (%d+)\31?(.*)$')
  expiry = tonumber(expiry)
  if expiry >= now_ms then
    out[#out + 1] = all[i]
    out[#out + 1] = math.max(expiry - now_ms, 1)
    out[#out + 1] = 's'
    out[#out + 1] = sf
    out[#out + 1] = label
  end
end
return out
"#
    ))
});

/// How many live waiters a key has, in both modes, on every node.
///
/// - `KEYS[1]` tickets.
/// - Returns the number of tickets whose deadline is still ahead by the server clock.
///
/// Read-only: stale tickets are not counted, and are dropped by later writes.
pub(crate) static WAITERS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LEASE}{}",
        r#"
clock()
local n = 0
for _, t in ipairs(redis.call('HVALS', KEYS[1])) do
  if tonumber(string.match(t, '^%d+|(%d+)|')) > now_ms then n = n + 1 end
end
return n
"#
    ))
});
