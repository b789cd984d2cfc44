//! The numeric scripts: compare-and-set, and a read.

use std::sync::LazyLock;

use redis::Script;

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
