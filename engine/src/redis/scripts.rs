//! Every Lua script of the Redis backend, one file per family (`lock`: acquire and leave;
//! `release`: release and complete; `lease`: extend, renew, holder, waiters; `shared`: the
//! shared leases' own; `admin`; `numeric`; `pools`), each with its contract: `KEYS`, `ARGV`, what it returns, why it is
//! atomic, and what it costs in commands.
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
//! - `lock`: a string `"<fence> <token>"` (`"<fence>+ <token>"` when the key may have
//!   waiters, and after the `+` what the key's other keys are known to hold:
//!   `"<fence>@<expiry ms>"` of the fence key, `q<ms>` the queue's expiry; see the
//!   prelude), with the lease's TTL. The fence is the first word, so a release learns the
//!   holder, its fence and whether to look at the queue in one `GET`.
//! - `fence`: the tombstone of a released key nobody waits for: the released lock's value
//!   (its fence first), for 10 s after the release (see the prelude). It exists only while
//!   the key is free and nobody waits, and the next grant takes it. While a hand-off's
//!   claim runs (and 10 s after), it holds that hand-off's fence instead,
//!   `"<fence>@<expiry ms>"`, which no acquire mistakes for a tombstone.
//! - `queue`: a list of waiter tickets in arrival order (`RPUSH`, then `LPOP` of the head:
//!   no clock decides the order, so no server clock step can change it); each member is
//!   `"<id>|<deadline ms>|<lease TTL ms>|<claim ms>|<token>"`: everything a release needs to
//!   grant the key to that waiter without asking anyone, the waiter's own claim period
//!   included (nodes with different settings may share a prefix: the releaser's settings
//!   never decide how long a hand-off lasts). A waiter refreshing its ticket renames its
//!   member in its place (`LSET`), so its place in line never changes.

use redis::Script;

mod admin;
mod lease;
mod lock;
mod numeric;
mod pools;
mod release;
pub(crate) mod shared;

pub(crate) use admin::{ADMIN_SET, FORCE_RELEASE};
pub(crate) use lease::{EXTEND, HOLDER, RENEW, WAITERS};
pub(crate) use lock::{ACQUIRE, ACQUIRE_OR_RECORD, LEAVE, LEAVE_SOURCE};
pub(crate) use numeric::{COMPARE_AND_SET, NUMERIC_GET};
pub(crate) use pools::{POOL_HOLDERS, POOL_MEMBERS, POOL_MODIFY};
pub(crate) use release::{COMPLETE, RELEASE};

/// Shared prelude: the server clock (read at most once, and only when needed), the lock
/// value's parts, the hand-off to the next waiter or the tombstone of a key nobody waits
/// for, and the removal of dead tickets at the queue's head (all but the caller's own:
/// `live_head(id)`, at most 100 per call to bound the script).
///
/// A lock value is `"<fence> <token>"`, or `"<fence>+ <token>"` when the key may have
/// waiters (the mark): a key whose value has no mark has none, so its release skips the
/// queue. A registration marks the holder's value; a hand-off and an admin `set` always
/// mark (a mark on a key with no waiters costs its release one `LPOP`, nothing more).
/// After the mark, a value may name what the key's other keys hold, so that the scripts of
/// a contended key need not read them: `"<fence>@<expiry ms>"`, the hand-off fence the
/// fence key holds (below; written by a hand-off), and `q<ms>`, an expiry the queue is
/// known to reach (written by a registration that set it; see [`ACQUIRE`]). Whatever
/// replaces the value without them (a fresh grant, an admin `set`) leaves the next script
/// to write and name them anew.
///
/// The tombstone is the released lock's value, renamed (`RENAME`) to the fence key: one
/// command deletes the lock and keeps its fence; it lives [`FENCE_MARGIN`](super::FENCE_MARGIN)
/// (10 s) after the release, whatever the lease had left (a holding made with no TTL, an
/// admin `set`, included). It exists only while the key is free with nobody waiting: every
/// grant consumes it (`GETDEL`), and no waiter can register while it exists (a free key
/// with an empty queue is granted).
///
/// A hand-off makes sure the fence key holds a *hand-off fence*, `"<fence>@<expiry ms>"`:
/// a fence at least the one it grants, expiring at most the margin after the claim it
/// granted and at least the margin less the slack (`COVER_SLACK`, 1 s) after it. A waiter that has
/// gone lets its claim lapse with no release, and the next grant must still see a fence
/// at least the lapsed one. The hand-off fence the holder's value names is kept when it
/// covers the grant so; else the hand-off writes the server clock (in µs: every fence
/// granted so far is at most it, and so are the next hand-offs' while they trail it) with
/// this claim's expiry, and names it in the new holder's value. So a key handed on every
/// millisecond writes its fence key about once a second, and the clock-step bound below
/// is unchanged: a lapsed claim's fence outlives its grant by at least the claim (3 s or
/// more) plus 9 s, or the lease TTL. It is not a tombstone: an acquire that meets it puts
/// it back (`PXAT` its expiry) and looks at the key as usual, and a fresh grant takes
/// `max(now, its fence + 1)` and deletes it; the holder's release overwrites it with the
/// tombstone.
///
/// A release or a hand-off skips the tickets of waiters that have gone (their deadline,
/// kept alive by the waiter's refreshes, is past by the server clock): a dead ticket never
/// costs the key a claim period. At most 100 are dropped per call, to bound the script
/// (the 100th is handed the key, as before).
///
/// The hand-off's `PUBLISH` is its last command and the only one that can be refused once
/// the hand-off is written (an ACL without the channel): it runs under `redis.pcall`, so a
/// script that applied a hand-off always reports it, never an error.
///
/// Expects `KEYS[1]` = lock, `KEYS[2]` = fence, `KEYS[3]` = queue.
const PRELUDE: &str = r#"
local COVER_SLACK = 1000
local now_us, now_ms
local function clock()
  if not now_us then
    local t = redis.call('TIME')
    now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
    now_ms = math.floor(now_us / 1000)
  end
end
local function parse(held)
  local fence, mark, named, token = string.match(held, '^(%d+)(%+?)([%d@q]*) (.*)$')
  return tonumber(fence), mark, token, named
end
-- What a holder's value names after its mark: the queue's known expiry (`q<ms>`).
local function queue_until_of(named)
  return tonumber(string.match(named or '', 'q(%d+)$'))
end
local function handoff(fence, member, channel, margin, named)
  local id, deadline, ttl, claim, token = string.match(member, '^([^|]*)|(%d+)|(%d+)|(%d+)|(.*)$')
  if not id then
    -- A ticket of a version that did not carry its claim: the shortest claim period.
    id, deadline, ttl, token = string.match(member, '^([^|]*)|(%d+)|(%d+)|(.*)$')
    claim = 3000
  end
  -- The waiter's own claim period, from its ticket: the releaser's settings play no part.
  local grant = string.format('%.0f', math.min(tonumber(ttl), tonumber(claim)))
  local text = string.format('%.0f', fence + 1)
  -- The hand-off fence: should the claim lapse unreleased (the waiter gone), the next
  -- grant still sees a fence at least this one's for the margin after it (see above).
  -- The one the holder's value names is kept when it covers this grant: a fence at least
  -- ours, expiring within the slack before the margin after this claim (never later).
  clock()
  local need = now_ms + tonumber(grant) + margin
  local kept, expiry = string.match(named or '', '^(%d+)@(%d+)')
  if not (kept and tonumber(kept) >= fence + 1 and tonumber(expiry) <= need
      and tonumber(expiry) >= need - COVER_SLACK) then
    -- The clock: every fence granted so far is at most it, and so are the next hand-offs'
    -- while they trail it.
    kept = string.format('%.0f', math.max(fence + 1, now_us))
    expiry = string.format('%.0f', need)
    redis.call('SET', KEYS[2], kept .. '@' .. expiry, 'PXAT', expiry)
  end
  -- Marked: more waiters may follow; naming the hand-off fence, for the next hand-off, and
  -- the queue's known expiry, which popping its head did not change.
  local queue_until = queue_until_of(named)
  local queue = queue_until and string.format('q%.0f', queue_until) or ''
  redis.call('SET', KEYS[1], text .. '+' .. kept .. '@' .. expiry .. queue .. ' ' .. token, 'PX', grant)
  -- A cluster backend names its channels with the kind word 'swake': sharded pub/sub,
  -- delivered within the channel's slot (the lock's), not broadcast to every node.
  local publish = string.find(channel, '^[^{]*{%x+}:swake:') and 'SPUBLISH' or 'PUBLISH'
  -- The grant names the PX it set: the waiter's local deadline is the server's. `pcall`:
  -- the hand-off is applied by now, and a refused publish (a user without the channel's
  -- ACL rights) must not turn it into a reported failure; the waiter finds its grant on
  -- its fallback retry (re-entry).
  redis.pcall(publish, channel, id .. '|' .. deadline .. ' ' .. text .. ' ' .. grant)
end
-- Returns 2 when the key went to a waiter, 1 when it is free.
local function free_or_handoff(fence, mark, channel, margin, named)
  if mark ~= '' then
    for i = 1, 100 do
      local next = redis.call('LPOP', KEYS[3])
      if not next then break end
      clock()
      local deadline = tonumber(string.match(next, '^[^|]*|(%d+)|'))
      -- A ticket whose waiter has gone is dropped, not handed the key for a claim period.
      if i == 100 or not deadline or deadline > now_ms then
        handoff(fence, next, channel, margin, named)
        return 2
      end
    end
  end
  redis.call('RENAME', KEYS[1], KEYS[2])
  redis.call('PEXPIRE', KEYS[2], margin)
  return 1
end
local function live_head(id)
  local head = redis.call('LINDEX', KEYS[3], 0)
  for _ = 1, 100 do
    if not head then return nil end
    if id ~= '' and string.sub(head, 1, #id + 1) == id .. '|' then return head end
    clock()
    if tonumber(string.match(head, '^[^|]*|(%d+)|')) > now_ms then return head end
    redis.call('LPOP', KEYS[3])
    head = redis.call('LINDEX', KEYS[3], 0)
  end
  return head
end
"#;

/// Every script, the shared leases' included, for loading them all at start-up (and on `NOSCRIPT`).
pub(crate) fn all() -> Vec<&'static Script> {
    let mut all: Vec<&'static Script> = vec![
        &ACQUIRE,
        &ACQUIRE_OR_RECORD,
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
    ];
    all.extend(shared::all());
    all
}
