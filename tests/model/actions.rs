//! The model's actions, each named after the Lua script (or the event) it abstracts, and
//! what each does to the state.
//!
//! Where the model and the scripts could drift (read this when a script changes):
//! - `ACQUIRE` (`engine/src/redis/scripts/lock.rs`) is modelled without the flags `h` and
//!   `r`, the waiter limit, and `ACQUIRE_OR_RECORD`'s record: a first attempt looks at the
//!   tombstone first, a retry (a registered waiter) at the lock first, as the script does.
//!   The model's retry always knows its member's deadline (the engine's reply was not lost).
//! - The prelude's `free_or_handoff`, `handoff` and `live_head` are written out below with
//!   the same order of steps; the 100-ticket bounds never bind with three clients.
//! - The queue is a list in the scripts (`RPUSH`, `LPOP`); the model keeps it in score
//!   order, a new ticket scored behind the tail, which is the same order.
//! - Every hand-off here writes its own fence to the fence key, the margin after its claim;
//!   the script keeps the hand-off fence the holder's value names while it covers the grant
//!   (a fence at least the granted one, expiring at most 1 s before that).
//! - `RENEW` (`scripts/lease.rs`) is one lease per call; `EXTEND` and `LEAVE` (a waiter
//!   giving up) are not modelled. The permits' scripts (`permits/scripts.rs`) have their
//!   own model (`crate::permits`).
//! - Each script is one atomic step, and a client's request, the script and its reply are one
//!   step too: a reply lost on the way (the engine then releases by token) is not modelled.
//! - Expired keys vanish at once (see [`State::expire`]).
//! - A hand-off's local deadline counts from the real time the waiter sent its last attempt
//!   (the engine counts from before its last registration).

use crate::model::{Break, HandoffModel};
use crate::state::{FenceKey, Grant, LockKey, Owner, Phase, State, Ticket};

/// One step of the system.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub(crate) enum Action {
    /// `ACQUIRE` as a client's first attempt of a session: a try that registers its ticket
    /// when the key is not granted.
    Acquire(u8),
    /// `ACQUIRE` as a registered waiter's fallback retry: refresh its ticket, take a free
    /// key at the queue's head, or find a grant whose message it missed (re-entry).
    AcquireRetry(u8),
    /// The subscriber receives the hand-off's `PUBLISH` for this client's ticket.
    GrantDelivered(u8),
    /// A grant message is lost (the subscriber was reconnecting, the network dropped it).
    GrantLost(u8),
    /// `RENEW`: the watchdog renews the client's lease.
    Renew(u8),
    /// `RELEASE`: the client gives the key back (also a late release of a lost lease).
    Release(u8),
    /// The client crashes: its lock, its ticket and its claims stay until they expire.
    Crash(u8),
    /// One tick of real time, and of the server clock.
    Tick,
    /// The server clock steps back one tick (within the configured bound).
    ClockStepBack,
}

impl HandoffModel {
    /// `ACQUIRE` (both of its uses): the client ends up holding or waiting.
    pub(crate) fn acquire(&self, s: &mut State, client: u8, retry: bool) {
        let me = s.owner(client);
        let (since, known) = match s.clients[usize::from(client)].0 {
            Phase::Waiting { since, known, .. } => (since, known),
            _ => (s.real, None),
        };
        // A registered waiter looks at the lock first; a first attempt at the tombstone.
        let named = retry && known.is_some();
        let mut floor = None;
        if !named && let Some(granted) = self.take_tombstone(s, me, &mut floor) {
            return self.hold(s, client, granted, s.real + self.sizes.ttl);
        }
        if let Some(held) = s.lock {
            if held.holder == me {
                // Re-entry: the grant whose message was missed; the full TTL from now.
                s.lock = Some(LockKey {
                    expiry: s.server + self.sizes.ttl,
                    ..held
                });
                s.queue.retain(|t| t.owner != me);
                return self.hold(s, client, held.fence, s.real + self.sizes.ttl);
            }
            if named {
                self.live_head(s, Some(me));
            }
            if !held.marked {
                // The holder's release must look at the queue from now on.
                s.lock = Some(LockKey {
                    marked: true,
                    ..held
                });
            }
        } else {
            if named && let Some(granted) = self.take_tombstone(s, me, &mut floor) {
                return self.hold(s, client, granted, s.real + self.sizes.ttl);
            }
            let head = self.live_head(s, Some(me));
            let mine = head.is_some_and(|t| t.owner == me);
            if head.is_none() || mine || self.broken == Break::NoHeadCheck {
                let ahead: Vec<Ticket> = s.queue.clone();
                let mut fence = s.now_us(&self.sizes);
                if let Some(f) = floor {
                    // A hand-off whose claim lapsed unreleased: its fence is the last.
                    fence = fence.max(f + 1);
                    s.fence = None;
                }
                s.queue.retain(|t| t.owner != me);
                s.lock = Some(LockKey {
                    fence,
                    marked: head.is_some(),
                    holder: me,
                    expiry: s.server + self.sizes.ttl,
                });
                let mine_score = ahead.iter().find(|t| t.owner == me).map(|t| t.score);
                let before: Vec<Ticket> = ahead
                    .into_iter()
                    .filter(|t| mine_score.is_none_or(|m| t.score < m))
                    .collect();
                s.granted(me, fence, &before);
                return self.hold(s, client, fence, s.real + self.sizes.ttl);
            }
        }
        // Register, or refresh: a refresh keeps its member's score (its place in line).
        let deadline = s.server + self.sizes.claim;
        let old = known.and_then(|_| s.queue.iter().position(|t| t.owner == me));
        let score = match old {
            Some(i) => s.queue.remove(i).score,
            None => {
                let tail = s.queue.last().map(|t| t.score + 1).unwrap_or(0);
                s.now_us(&self.sizes).max(tail)
            }
        };
        let at = s.queue.partition_point(|t| t.score < score);
        s.queue.insert(
            at,
            Ticket {
                owner: me,
                deadline,
                score,
            },
        );
        s.queue_expiry = s.server + self.sizes.claim;
        s.clients[usize::from(client)].0 = Phase::Waiting {
            since,
            sent: s.real,
            known: Some(deadline),
            retried: true,
        };
    }

    /// The acquire's `from_tombstone`: a tombstone grants `last + 1` and is consumed; a
    /// hand-off fence is put back and becomes the floor of a fresh grant.
    fn take_tombstone(&self, s: &mut State, me: Owner, floor: &mut Option<u16>) -> Option<u16> {
        let last = s.fence.take()?;
        if last.handoff {
            s.fence = Some(last);
            *floor = Some(last.fence);
            return None;
        }
        if s.lock.is_some() {
            // `SET NX` refused: looked at as usual (the tombstone stays consumed).
            return None;
        }
        let fence = last.fence + 1;
        s.lock = Some(LockKey {
            fence,
            marked: false,
            holder: me,
            expiry: s.server + self.sizes.ttl,
        });
        let ahead = s.queue.clone();
        s.granted(me, fence, &ahead);
        Some(fence)
    }

    /// The prelude's `live_head`: drops dead tickets at the head (never the caller's own).
    fn live_head(&self, s: &mut State, me: Option<Owner>) -> Option<Ticket> {
        while let Some(&head) = s.queue.first() {
            if Some(head.owner) == me || head.deadline > s.server {
                return Some(head);
            }
            s.queue.remove(0);
        }
        None
    }

    /// `RELEASE`: compare the token, then hand the key to the first live ticket or leave
    /// the tombstone.
    pub(crate) fn release(&self, s: &mut State, client: u8) {
        let me = s.owner(client);
        s.clients[usize::from(client)].0 = self.after_session(s, client);
        let Some(held) = s.lock else { return };
        if held.holder != me && self.broken != Break::NoClaimCheck {
            return;
        }
        if held.marked && self.broken != Break::ReleaseSkipsQueue {
            while !s.queue.is_empty() {
                let next = s.queue.remove(0);
                if next.deadline > s.server {
                    return self.handoff(s, held.fence, next);
                }
            }
        }
        s.lock = None;
        s.fence = Some(FenceKey {
            fence: held.fence,
            handoff: false,
            expiry: s.server + self.sizes.margin,
        });
    }

    /// The prelude's `handoff`: the ticket's owner holds the key for its claim period, the
    /// hand-off fence outlives the claim by the margin, and the grant is published.
    fn handoff(&self, s: &mut State, fence: u16, next: Ticket) {
        let px = self.sizes.ttl.min(self.sizes.claim);
        let fence = fence + 1;
        s.lock = Some(LockKey {
            fence,
            marked: true,
            holder: next.owner,
            expiry: s.server + px,
        });
        s.fence = Some(FenceKey {
            fence,
            handoff: true,
            expiry: s.server + px + self.sizes.margin,
        });
        // The popped tickets were all dead, and `next` was the head.
        s.granted(next.owner, fence, &[]);
        s.messages.push(Grant {
            owner: next.owner,
            deadline: next.deadline,
            fence,
            px,
        });
    }

    /// `RENEW`: compare the token, then extend to at least now + TTL; the lease is lost
    /// when the key is not the client's any more.
    pub(crate) fn renew(&self, s: &mut State, client: u8) {
        let me = s.owner(client);
        match s.lock {
            Some(held) if held.holder == me => {
                s.lock = Some(LockKey {
                    expiry: held.expiry.max(s.server + self.sizes.ttl),
                    ..held
                });
                if let Phase::Holding { fence, since, .. } = s.clients[usize::from(client)].0 {
                    s.clients[usize::from(client)].0 = Phase::Holding {
                        fence,
                        since,
                        deadline: s.real + self.sizes.ttl,
                    };
                }
            }
            // Lost: the handler is told, and the session ends (its release is a no-op).
            _ => s.clients[usize::from(client)].0 = self.after_session(s, client),
        }
    }

    /// The subscriber hands the grant to its waiter, whose local deadline counts from the
    /// moment it sent its last attempt; a grant naming an earlier registration than the
    /// waiter's latest is stale and ignored (`engine/src/redis/acquire.rs`, `deadline >=
    /// known`).
    pub(crate) fn deliver(&self, s: &mut State, index: usize) {
        let grant = s.messages.remove(index);
        let client = grant.owner.client;
        if s.owner(client) != grant.owner {
            return;
        }
        if let Phase::Waiting { sent, known, .. } = s.clients[usize::from(client)].0
            && (self.broken == Break::StaleGrantTaken || known.is_some_and(|k| grant.deadline >= k))
        {
            self.hold(s, client, grant.fence, sent + grant.px);
        }
    }

    /// The client holds the key, valid locally until `deadline`.
    fn hold(&self, s: &mut State, client: u8, fence: u16, deadline: u8) {
        s.clients[usize::from(client)].0 = Phase::Holding {
            fence,
            deadline,
            since: s.real,
        };
    }

    /// The phase a client goes to when its session ends.
    pub(crate) fn after_session(&self, s: &State, client: u8) -> Phase {
        if s.clients[usize::from(client)].1 >= self.sizes.sessions {
            Phase::Done
        } else {
            Phase::Idle
        }
    }
}
