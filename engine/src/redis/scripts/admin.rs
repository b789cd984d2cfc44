//! The admin scripts: make a value the holder, and force a release.

use std::sync::LazyLock;

use redis::Script;

use super::PRELUDE;

/// Admin: make a value the holder of a key, whoever holds it now.
///
/// - `KEYS[1]` lock, `KEYS[2]` fence tombstone, `KEYS[3]` holders (shared holders, dropped).
/// - `ARGV[1]` value (owner token), `ARGV[2]` TTL (ms; `-1`: no expiry).
/// - Returns the new fence.
///
/// Atomic so the new holding gets a fence above every earlier one, as an acquire would:
/// `max(last + 1, server time in µs)`, the last fence being the greater of the holder's
/// and the fence key's (a tombstone or a hand-off's fence, which it consumes, as a grant
/// does). The value is marked (see the
/// prelude): its release looks at the queue, and gives the tombstone a TTL even when this
/// holding had none. Waiters keep waiting: the next release hands them the key.
pub(crate) static ADMIN_SET: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local clock = redis.call('TIME')
local now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
-- The tombstone, or a hand-off's fence (which the holder's value may have outgrown), and
-- the holder's value: the greatest.
local last = 0
for _, v in ipairs({redis.call('GETDEL', KEYS[2]) or '0', redis.call('GET', KEYS[1]) or '0'}) do
  last = math.max(last, tonumber(string.match(v, '^%d+')))
end
local fence = string.format('%.0f', math.max(last + 1, now_us))
redis.call('DEL', KEYS[3])
local ttl = tonumber(ARGV[2])
if ttl > 0 then
  redis.call('SET', KEYS[1], fence .. '+ ' .. ARGV[1], 'PX', ttl)
else
  redis.call('SET', KEYS[1], fence .. '+ ' .. ARGV[1])
end
return fence
"#,
    )
});

/// Admin: release a key whoever holds it (or only `ARGV[3]`'s lease), handing it to the
/// next waiter.
///
/// - `KEYS` as the acquire script's (lock, fence, queue, tickets, holders).
/// - `ARGV[1]` wake-up channel, `ARGV[2]` tombstone margin (ms), `ARGV[3]` a token (`''`
///   or none: every holder).
/// - Returns `1` if the key was held (by that token), `0` if not.
///
/// Atomic for the same reason as [`RELEASE`](super::RELEASE): the key passes to the queue's head with no
/// moment in which it is free.
pub(crate) static FORCE_RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{PRELUDE}{}",
        r#"
if not load() then return 0 end
local only = ARGV[3] or ''
if only ~= '' then
  if holder == only then
    free_or_handoff(ARGV[1], tonumber(ARGV[2]), '')
    return 1
  end
  if holder == '' and redis.call('HDEL', KEYS[5], only) == 1 then
    shared_left(ARGV[1], tonumber(ARGV[2]), '')
    return 1
  end
  return 0
end
if holder == '' then redis.call('DEL', KEYS[5]) end
free_or_handoff(ARGV[1], tonumber(ARGV[2]), '')
return 1
"#
    ))
});

/// Admin: tell a key's holders that it is being force-released (see `revocation`):
/// publish each holder's token and the key on the revocation channel. Changes nothing.
///
/// - `KEYS[1]` lock, `KEYS[2]` holders.
/// - `ARGV[1]` the revocation channel, `ARGV[2]` the lock key (the engine's name for it).
/// - Returns `{receivers, token, …}`: how many subscribers the messages reached in all (as
///   text), and every holder's token (none: nobody holds the key).
///
/// One script so the holders are read at one instant. Commands: `GET`, \[`HGETALL`,
/// `TIME`\], one `PUBLISH` per holder (under `pcall`: an ACL without the channel tells
/// nobody, and the admin then releases at once).
pub(crate) static REVOKE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local held = redis.call('GET', KEYS[1])
if not held then return {'0'} end
local holder = string.match(held, '^[^ ]* ([^\31]*)')
local tokens = {}
if holder ~= '' then
  tokens[1] = holder
else
  local t = redis.call('TIME')
  local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local all = redis.call('HGETALL', KEYS[2])
  for i = 1, #all, 2 do
    if tonumber(string.match(all[i + 1], '^%d+')) >= now_ms then tokens[#tokens + 1] = all[i] end
  end
end
local told = 0
for _, token in ipairs(tokens) do
  local n = redis.pcall('PUBLISH', ARGV[1], token .. '\n' .. ARGV[2])
  if type(n) == 'number' then told = told + n end
end
local out = {tostring(told)}
for _, token in ipairs(tokens) do out[#out + 1] = token end
return out
"#,
    )
});
