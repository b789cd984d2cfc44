//! The admin scripts: make a value the holder, and force a release.

use std::sync::LazyLock;

use redis::Script;

use super::PRELUDE;

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
