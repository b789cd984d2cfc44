//! Every Lua script of the Redis backend, one file per family (`lock`: acquire and leave;
//! `release`: release and complete; `lease`: extend, renew, holders, waiters; `admin`;
//! `numeric`; `pools`), every one for both modes, each with its contract: `KEYS`, `ARGV`, what it returns, why it is
//! atomic, and what it costs in commands.
//!
//! Each script runs atomically on the server: no other command touches the lock's keys
//! between its first and last call, which is what makes compare-token-then-write safe.
//! Scripts read the server clock with `TIME`, so every deadline (lease TTLs, waiter
//! tickets, fences) is judged by one clock, never by the clients'; and only when they need
//! it: the common paths are counted in commands (see the module docs of `redis`).
//!
//! The uncontended paths (an acquire granted from the tombstone, a release of a holder
//! alone nobody queued behind) run at the start of their scripts, before the prelude
//! below, and return there: Lua makes every `local function` of a script anew on each
//! call, which cost those paths about a quarter of their time inside Redis.
//!
//! All keys a script touches are passed in `KEYS` (they share one hash tag, so the script
//! is valid in Redis Cluster too); the wake-up channel is an `ARGV`, because channels are
//! not keys. Fences and scores are microsecond timestamps (about 2^51), exact in Lua's
//! doubles; they are written with `%.0f` because `tostring` would print them in
//! exponent notation.
//!
//! Key kinds (see the module docs of `redis` for the full layout, and the prelude below):
//! `lock` (who holds the key: one token alone, or shared holders), `fence` (the tombstone,
//! or a hand-off's fence), `queue` (ticket ids in arrival order: `RPUSH`, then `LPOP` of the
//! head, so no server clock step can change the order), `tickets` (each ticket's content,
//! by id: a refresh rewrites it and the ticket keeps its place) and `holders` (the shared
//! holders). One queue and one wake-up channel serve both modes.

use redis::Script;

mod admin;
mod lease;
mod lock;
mod numeric;
mod pools;
mod release;

pub(crate) use admin::{ADMIN_SET, FORCE_RELEASE, REVOKE};
pub(crate) use lease::{EXTEND, HOLDERS, RENEW, WAITERS};
pub(crate) use lock::{ACQUIRE, ACQUIRE_OR_RECORD, LEAVE, LEAVE_SOURCE};
pub(crate) use numeric::{COMPARE_AND_SET, NUMERIC_GET};
pub(crate) use pools::{POOL_HOLDERS, POOL_MEMBERS, POOL_MODIFY};
pub(crate) use release::{COMPLETE, RELEASE};

/// Shared prelude: the server clock (read at most once, and only when needed), the key's
/// state, what fits, a grant (alone or shared), the hand-off to the queue's head (as many
/// as fit) or the tombstone of a key nobody waits for, and the removal of dead tickets at
/// the queue's head (all but the caller's own: `live_head(id)`, at most 100 per call).
///
/// One key, one space: the lock value exists while anybody holds the key. It is
/// `"<fence> <token>"` for a holder alone (followed by `"\x1f<label>"`, the unit separator
/// and the holder's label, when it has one; so are a shared holder's and a ticket's) (`lock(k)`; `"<fence>a <token>"` for a shared
/// request with a limit of 1, also alone), or `"<fence> "` (no token: tokens are never empty) while shared holders hold it,
/// each a field of the holders hash (`token` → `"<expiry ms> <fence>"`); its TTL is then
/// at least the latest holder's expiry, and so is the hash's. The fence in the value is
/// the last fence granted, in either mode. After the fence, `+` (the mark) says the key
/// may have waiters, so that its release looks at the queue (a value with no mark has
/// none); after the mark, `"<fence>@<expiry ms>"` names the hand-off fence the fence key
/// holds (below).
///
/// The tombstone is `"<fence> <id>"`, the last fence and the random id of the release that
/// freed the key (so a release sent twice knows it ran), written to the fence key as the lock key is
/// deleted; it lives [`FENCE_MARGIN`](super::FENCE_MARGIN) (10
/// s) after the release. It exists only while the key is free with nobody waiting: every
/// grant consumes it (`GETDEL`), and no waiter can register while it exists (a free key
/// with an empty queue is granted).
///
/// A hand-off makes sure the fence key holds a *hand-off fence*, `"<fence>@<expiry ms>"`:
/// a fence at least the one it grants, expiring at most the margin after the claim it
/// granted and at least the margin less the slack (`COVER_SLACK`, 1 s) after it, so a
/// claim that lapses unreleased (its waiter gone) still leaves its fence for the next
/// grant. The one the holder's value names is kept when it covers the grant; else the
/// hand-off writes the server clock (in µs) with this claim's expiry. An acquire that
/// meets it puts it back and looks at the key as usual, and a fresh grant takes
/// `max(now, its fence + 1)` and deletes it; the holder's release overwrites it with the
/// tombstone.
///
/// The queue is a list of ticket ids in arrival order; each ticket's content is a field of
/// the tickets hash, `id` → `"<nonce>|<deadline ms>|<lease TTL ms>|<claim ms>|<limit>|<token>"`
/// (0: the lock, 1: a shared request alone; both hold alone): everything a release needs to grant it without asking anyone. The
/// grant names the ticket's nonce, which its registration chose. A ticket whose deadline
/// is past (its waiter gone) is dropped, never granted.
///
/// The hand-off's `PUBLISH` runs under `redis.pcall`, so a script that applied a hand-off
/// always reports it, never an error (an ACL without the channel).
///
/// Expects `KEYS[1]` lock, `KEYS[2]` fence, `KEYS[3]` queue, `KEYS[4]` tickets,
/// `KEYS[5]` holders.
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
local function fmt(n) return string.format('%.0f', n) end
-- A holder's label, stored after what names it (its token, a shared holder's fence, a
-- ticket's token) behind the unit separator (byte 31: no token or label holds a control
-- character). No label, nothing stored.
local function tag(l) if l and l ~= '' then return '\31' .. l end return '' end
local function untag(s)
  local t, l = string.match(s, '^([^\31]*)\31(.*)$')
  if t then return t, l end
  return s, ''
end
-- The key's state: the last fence, the mark, what the value names, and the holder (nil:
-- nobody; '': shared holders, in KEYS[5]; else the token holding alone) with its label.
local fence, kind, mark, named, holder, label = 0, '', '', '', nil, ''
-- `held`: the lock's value, read already (a script whose fast path read it).
local function parse(held)
  if held then
    local f
    f, kind, mark, named, holder = string.match(held, '^(%d+)(a?)(%+?)([%d@q]*) (.*)$')
    fence, named = tonumber(f), string.match(named, '^%d+@%d+') or ''
    holder, label = untag(holder)
  end
  return held
end
local function load() return parse(redis.call('GET', KEYS[1])) end
-- How many shared holders run; when at least `upto`, the expired ones are dropped first.
local function sharers(upto)
  local n = redis.call('HLEN', KEYS[5])
  if n >= upto and n > 0 then
    clock()
    local all = redis.call('HGETALL', KEYS[5])
    for i = 1, #all, 2 do
      if tonumber(string.match(all[i + 1], '^%d+')) < now_ms then
        redis.call('HDEL', KEYS[5], all[i])
        n = n - 1
      end
    end
  end
  return n
end
-- Alone (limit 1): nobody holds; shared: nobody holds alone and fewer than `limit` share.
local function fits(limit)
  if holder == nil then return true end
  if holder ~= '' then return false end
  if limit <= 1 then return sharers(1) == 0 end
  return sharers(limit) < limit
end
-- Make `token` (labelled `lbl`) a holder for `px` ms at fence `f`: alone when `limit` is 0
-- (the lock) or 1 (a shared request alone: `a` after the fence says so), else shared.
local function take(token, limit, px, f, lbl)
  local text = fmt(f)
  if limit <= 1 then
    if holder == '' then redis.call('DEL', KEYS[5]) end
    kind = limit == 1 and 'a' or ''
    redis.call('SET', KEYS[1], text .. kind .. mark .. named .. ' ' .. token .. tag(lbl), 'PX', px)
    holder, label = token, lbl or ''
  else
    clock()
    redis.call('HSET', KEYS[5], token, fmt(now_ms + px) .. ' ' .. text .. tag(lbl))
    local left = holder == '' and redis.call('PTTL', KEYS[1]) or 0
    px = math.max(px, left)
    kind = ''
    redis.call('SET', KEYS[1], text .. mark .. named .. ' ', 'PX', px)
    redis.call('PEXPIRE', KEYS[5], px)
    holder = ''
  end
  fence = f
end
local function deadline_of(info)
  return tonumber(string.match(info, '^%d+|(%d+)|'))
end
-- Grant ticket `id` for its claim period, and publish it naming the ticket's nonce.
local function handoff(id, info, channel, margin)
  local nonce, ttl, claim, limit, token = string.match(info, '^(%d+)|%d+|(%d+)|(%d+)|(%d+)|(.*)$')
  local px = math.min(tonumber(ttl), tonumber(claim))
  local f = fence + 1
  clock()
  local need = now_ms + px + margin
  local kept, expiry = string.match(named, '^(%d+)@(%d+)')
  if not (kept and tonumber(kept) >= f and tonumber(expiry) <= need
      and tonumber(expiry) >= need - COVER_SLACK) then
    kept, expiry = fmt(math.max(f, now_us)), fmt(need)
    redis.call('SET', KEYS[2], kept .. '@' .. expiry, 'PXAT', expiry)
  end
  mark, named = '+', kept .. '@' .. expiry
  local who, lbl = untag(token)
  take(who, tonumber(limit), px, f, lbl)
  -- A cluster backend names its channels with the kind word 'swake': sharded pub/sub.
  local publish = string.find(channel, '^[^{]*{%x+}:swake:') and 'SPUBLISH' or 'PUBLISH'
  redis.pcall(publish, channel, id .. '|' .. nonce .. ' ' .. fmt(f) .. ' ' .. fmt(px))
end
-- Drop the ticket at the queue's head.
local function pop(id, info)
  redis.call('LPOP', KEYS[3])
  if info then redis.call('HDEL', KEYS[4], id) end
end
-- Grant the queue from its head, as many as fit, stopping at the first that does not.
-- Returns how many were granted.
local function pump(channel, margin)
  local granted = 0
  for _ = 1, 100 do
    local id = redis.call('LINDEX', KEYS[3], 0)
    if not id then break end
    local info = redis.call('HGET', KEYS[4], id)
    clock()
    local live = info and deadline_of(info) > now_ms
    if live and not fits(tonumber(string.match(info, '^%d+|%d+|%d+|%d+|(%d+)|'))) then break end
    pop(id, info)
    if live then
      handoff(id, info, channel, margin)
      granted = granted + 1
    end
  end
  return granted
end
-- The holder alone, or the last shared holder, is gone: the queue's head (as many as fit)
-- gets the key; nobody waiting, it is left to the tombstone. Returns 2 handed, 1 free.
-- The tombstone names the release that freed the key (`by`: its id).
local function free_or_handoff(channel, margin, by)
  holder = nil
  if mark ~= '' and pump(channel, margin) > 0 then return 2 end
  redis.call('SET', KEYS[2], fmt(fence) .. ' ' .. by, 'PX', margin)
  redis.call('DEL', KEYS[1])
  return 1
end
-- A shared holder left: the key is free once none is left, else the queue may now fit.
local function shared_left(channel, margin, by)
  if redis.call('HLEN', KEYS[5]) == 0 then return free_or_handoff(channel, margin, by) end
  if mark ~= '' then pump(channel, margin) end
  return 1
end
local function live_head(id)
  for _ = 1, 100 do
    local head = redis.call('LINDEX', KEYS[3], 0)
    if not head or head == id then return head end
    local info = redis.call('HGET', KEYS[4], head)
    clock()
    if info and deadline_of(info) > now_ms then return head end
    pop(head, info)
  end
  return redis.call('LINDEX', KEYS[3], 0)
end
"#;

/// Every script, for loading them all at start-up (and on `NOSCRIPT`).
pub(crate) fn all() -> Vec<&'static Script> {
    vec![
        &ACQUIRE,
        &ACQUIRE_OR_RECORD,
        &RELEASE,
        &COMPLETE,
        &LEAVE,
        &EXTEND,
        &RENEW,
        &HOLDERS,
        &WAITERS,
        &ADMIN_SET,
        &FORCE_RELEASE,
        &REVOKE,
        &COMPARE_AND_SET,
        &NUMERIC_GET,
        &POOL_MODIFY,
        &POOL_MEMBERS,
        &POOL_HOLDERS,
    ]
}
