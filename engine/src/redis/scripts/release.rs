//! The scripts that give a key back: release, and release with a record (`COMPLETE`).

use std::sync::LazyLock;

use redis::Script;

use super::PRELUDE;

/// Release, handing the key to the next waiter.
///
/// - `KEYS[1]` lock, `KEYS[2]` fence tombstone, `KEYS[3]` queue.
/// - `ARGV[1]` token, `ARGV[2]` wake-up channel, `ARGV[3]` tombstone margin (ms).
/// - Returns `1` released (the key is free), `2` released and handed to the next waiter,
///   `-1` held by another token (nothing changed), `0` nobody holds it.
///
/// Atomic so that the compare-token and the delete are one step (a late release can never
/// delete the next holder's lease), and so that the key passes to the queue's head with
/// no moment in which it is free: nobody can take it in between.
///
/// The hand-off: the head's ticket names its token, lease TTL and claim period, so the
/// script makes it the holder itself (fence = last fence + 1, the holder's fence being in
/// the lock's value, and one grant per microsecond never outruns the clock) and publishes
/// `"<id>|<deadline> <fence> <px>"` on the wake-up channel. The woken waiter already holds
/// the lease and needs no round trip. Its lease first runs for `px = min(TTL, claim
/// period)`, both the waiter's own (from its ticket, whatever the releaser's settings),
/// and the waiter's local deadline is computed from that `px`: a waiter that has gone
/// (crashed, cancelled, its message lost while it was gone) holds the key for at most its
/// claim period, never a lease TTL; a live one renews to its full TTL in the background
/// before the claim runs out, and one whose message was lost finds the grant with its next
/// retry (re-entry).
///
/// The hand-off skips the tickets of waiters that have gone (deadline past), and leaves a
/// hand-off fence in the fence key (see the prelude), so that a claim that lapses
/// unreleased still leaves its fence for 9 to 10 s. Whatever the key's path, the tombstone
/// lives 10 s after the release.
///
/// Commands, besides `EVALSHA`: a key with no mark (nobody registered while it was held):
/// 3 (`GET`, `RENAME` to the tombstone, `PEXPIRE`); marked, nobody waiting: 4 (`GET`,
/// `LPOP`, `RENAME`, `PEXPIRE`); a hand-off: 5 (`GET`, `LPOP`, `TIME`, `SET` lock,
/// `PUBLISH`), a `SET` of the hand-off fence more when the one the holder's value names no
/// longer covers the grant (about once a second on a key handed on without a pause), and
/// an `LPOP` more per dead ticket skipped.
pub(crate) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{PRELUDE}{RELEASE_BODY}")));

/// The body of [`RELEASE`], shared with [`COMPLETE`] (which runs it as a function).
const RELEASE_BODY: &str = r#"
local held = redis.call('GET', KEYS[1])
if not held then return 0 end
local fence, mark, holder, after_mark = parse(held)
if holder ~= ARGV[1] then return -1 end
return free_or_handoff(fence, mark, ARGV[2], tonumber(ARGV[3]), after_mark)
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
        "{PRELUDE}local function release_lock(){RELEASE_BODY}end\n{}",
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
