//! The scripts that give a key back: release, and release with a record (`COMPLETE`).

use std::sync::LazyLock;

use redis::Script;

use super::PRELUDE;

/// Release, in either mode, handing the key to the queue's head (as many as fit).
///
/// - `KEYS[1]` lock, `KEYS[2]` fence tombstone, `KEYS[3]` queue, `KEYS[4]` tickets,
///   `KEYS[5]` holders.
/// - `ARGV[1]` token, `ARGV[2]` wake-up channel, `ARGV[3]` tombstone margin (ms),
///   `ARGV[4]` this release's random id.
/// - Returns `1` released (the key is free, or others still share it), `2` released and
///   handed to the next waiters, `-1` held by others (nothing changed), `0` nobody holds
///   it. A release sent twice (redis-rs's Cluster client re-sends a request whose
///   connection dropped) answers `1` again while the tombstone it left names its id.
///
/// Atomic so that the compare-token and the delete are one step (a late release can never
/// delete the next holder's lease), and so that the key passes to the queue's head with
/// no moment in which it is free: nobody can take it in between.
///
/// The hand-off: each granted ticket names its token, limit, lease TTL and claim period,
/// so the script makes it a holder itself (fence = last fence + 1, one grant per
/// microsecond never outrunning the clock) for `px = min(TTL, claim period)`, both the
/// waiter's own, and publishes `"<id>|<nonce> <fence> <px>"` on the wake-up channel. The
/// woken waiter already holds the lease; a live one renews to its full TTL before the
/// claim runs out, and one whose message was lost finds the grant with its next retry
/// (re-entry).
///
/// Commands, besides `EVALSHA`: alone, a key with no mark (nobody registered while it was
/// held): 3 (`GET`, `SET` of the tombstone, `DEL`); marked, nobody waiting: 4 (`LINDEX`
/// more); a hand-off to one waiter alone: `GET`, `LINDEX`, `HGET`, `TIME`, `LPOP`, `HDEL`,
/// `SET` lock, `PUBLISH`, `LINDEX` (a `SET` of the hand-off fence about once a second).
/// Shared, others still holding: 3 (`GET`, `HDEL`, `HLEN`); the last: 5 (and the
/// tombstone's 2).
pub(crate) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{RELEASE_HEAD}{PRELUDE}{RELEASE_REST}")));

/// The start of [`RELEASE`]: the lock's value read, and the release of a holder alone
/// that nobody queued behind (no mark), which is the whole of an uncontended release: the
/// tombstone written, the lock deleted, as the prelude's `free_or_handoff` does. It comes
/// before the prelude and needs none of it, so that such a release returns before the
/// prelude's functions are made (Lua makes every `local function` anew on each call).
/// Shared with [`COMPLETE`], which runs it (and [`RELEASE_REST`]) as a function after the
/// prelude.
const RELEASE_HEAD: &str = r#"
local token, id = ARGV[1], ARGV[4]
local held = redis.call('GET', KEYS[1])
if held then
  -- A holder alone (`a`: a shared request alone), with no mark and nothing named after
  -- its fence; its token up to the label's separator. (The fence is the value's own
  -- text, written by `fmt`.)
  local f, who = string.match(held, '^(%d+)a? ([^\31]*)')
  if who == token then
    redis.call('SET', KEYS[2], f .. ' ' .. id, 'PX', ARGV[3])
    redis.call('DEL', KEYS[1])
    return 1
  end
end
"#;

/// The rest of [`RELEASE`], after the prelude: the lock's value (`held`, read by
/// [`RELEASE_HEAD`]) looked at in full.
const RELEASE_REST: &str = r#"
local channel, margin = ARGV[2], tonumber(ARGV[3])
if not parse(held) then
  local last = redis.call('GET', KEYS[2])
  return (last and string.match(last, '^%d+ (.*)$') == id) and 1 or 0
end
if holder == token then return free_or_handoff(channel, margin, id) end
if holder ~= '' or redis.call('HDEL', KEYS[5], token) == 0 then return -1 end
return shared_left(channel, margin, id)
"#;

/// Release with a record: [`RELEASE`], then, only if it released (the token held the key),
/// the record written in the same atomic step, so that whoever is granted the key next
/// finds it.
///
/// - `KEYS` as [`RELEASE`]'s, then the record (hash) last.
/// - `ARGV` as [`RELEASE`]'s, then five more last: fingerprint, metadata, body, completion
///   time (Unix ms), retention (ms).
/// - Returns what [`RELEASE`] returns; the record is written only when it released (`1`
///   or `2`).
///
/// Commands, besides [`RELEASE`]'s: 2 (`HSET` of every field, which replaces the whole
/// record, and `PEXPIRE`).
///
/// The record's arguments are addressed from the end so that this wrapper stays valid
/// whatever [`RELEASE`] takes.
pub(crate) static COMPLETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{PRELUDE}local function release_lock(){RELEASE_HEAD}{RELEASE_REST}end\n{}",
        r#"
local r = release_lock()
if r > 0 then
  local rec, n = KEYS[#KEYS], #ARGV
  -- Every field a record has: the hash is replaced whole.
  redis.call('HSET', rec, 'fp', ARGV[n - 4], 'meta', ARGV[n - 3], 'body', ARGV[n - 2], 'at', ARGV[n - 1])
  redis.call('PEXPIRE', rec, tonumber(ARGV[n]))
end
return r
"#
    ))
});
