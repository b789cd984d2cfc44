//! The lock pool scripts: change the members, list them, and read every member's holder at
//! once.

use std::sync::LazyLock;

use redis::Script;

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
/// - Returns a flat list `member, token ('' if free, or held by shared leases: a pool
///   reports holders alone), pttl (-2 free, -1 no expiry)` per member.
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
    out[#out + 1] = string.match(held, '^[^ ]* ([^\31]*)')
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
