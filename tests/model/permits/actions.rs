//! The permits model's actions, each named after the permit script (or the event) it
//! abstracts, and what each does to the state.
//!
//! Where the model and the scripts (`engine/src/redis/permits/scripts.rs`) could drift
//! (read this when a script changes):
//! - The `PRELUDE`'s functions are written out in [`Prelude`] with the same order of steps;
//!   the 100-ticket bound of `live_head` never binds with three clients.
//! - `ACQUIRE` is modelled without the flag `r`, the waiter limit, and the refusal of an
//!   upgrade (`{4, 0, 0}`: a client's mode is fixed for its session). A client's request,
//!   the script and its reply are one atomic step: a reply lost on the way (the engine then
//!   leaves by token) is not modelled, so a retry always knows its member's deadline.
//! - Every client asks with the same limit, TTL and claim period (the scripts read each
//!   ticket's own); one acquisition per client.
//! - `RELEASE` is modelled whole; `RENEW` one permit per call; `EXTEND`, `LEAVE` (a waiter
//!   giving up; a crash stands for a waiter that vanishes) and `HOLDERS` are not modelled.
//! - A holder runs while its expiry is after the server clock's tick; the scripts keep it
//!   through its expiry's millisecond (`now_ms` rounded down), one millisecond the model
//!   gives away (towards less exclusion, so a safe simplification for the checks).
//! - Expired members stay in the holders' zset until a script drops them (a clock step
//!   back revives them, as in Redis), but expired keys vanish at once (see
//!   [`State::expire`]), as in the lock model.
//! - A hand-off's local deadline counts from the real time the waiter sent its last
//!   attempt (the engine counts from before it, `last_sent`); a waiter takes a grant only
//!   if it names its latest registration (`deadline >= known`), as
//!   `engine/src/redis/acquire.rs` does for both targets.

use crate::permits::model::{Break, PermitsModel};
use crate::permits::prelude::Prelude;
use crate::permits::state::{Mode, Phase, State, Ticket};

/// One step of the system.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub(crate) enum Action {
    /// `ACQUIRE` as a client's first attempt of a session, shared or exclusive: granted if
    /// nobody waits and it fits, registered otherwise.
    Acquire(u8, Mode),
    /// `ACQUIRE` as a registered waiter's fallback retry: grant what fits from the queue's
    /// head (its own ticket with its full TTL), find a grant whose message it missed
    /// (re-entry), or refresh its ticket.
    AcquireRetry(u8),
    /// The subscriber receives a `PUBLISH` of a grant for this message's ticket.
    GrantDelivered(u8),
    /// A grant message is lost.
    GrantLost(u8),
    /// `RENEW`: the watchdog renews the client's permit.
    Renew(u8),
    /// `RELEASE`: the client gives its permit back (also a late release of a lost lease),
    /// granting the waiters that now fit.
    Release(u8),
    /// The client crashes: its permit, its ticket and its claims stay until they expire.
    Crash(u8),
    /// One tick of real time, and of the server clock.
    Tick,
    /// The server clock steps back one tick (within the configured bound).
    ClockStepBack,
}

impl PermitsModel {
    /// `ACQUIRE` (both of its uses; `first` is the mode of a first attempt): the client
    /// ends up holding or waiting.
    pub(crate) fn acquire(&self, s: &mut State, client: u8, first: Option<Mode>) {
        let me = s.owner(client);
        let (mode, since, known) = match (first, s.clients[usize::from(client)].0) {
            (Some(mode), _) => (mode, s.real, None),
            (
                None,
                Phase::Waiting {
                    mode, since, known, ..
                },
            ) => (mode, since, known),
            (None, phase) => unreachable!("a retry while {phase:?}"),
        };
        let ttl = self.sizes.ttl;
        let mut p = Prelude::new(self, s);
        p.drop_expired();
        if let Some(i) = p.s.holders.iter().position(|h| h.owner == me) {
            // Re-entry: the grant whose message was missed; the full TTL from now.
            let mut held = p.s.holders.remove(i);
            held.expiry = p.s.server + ttl;
            p.insert(held);
            p.touched();
            if known.is_some() {
                p.s.queue.retain(|t| t.owner != me);
            }
            p.pump(Some(me));
            p.settle();
            return self.hold(s, client, mode, held.fence, s.real + ttl);
        }
        let (mine, waiting) = p.pump(Some(me));
        if let Some(fence) = mine {
            p.settle();
            return self.hold(s, client, mode, fence, s.real + ttl);
        }
        if (!waiting || self.broken == Break::ArrivalIgnoresQueue) && p.fits(mode) {
            // Granted on arrival: every other live ticket is ahead of this request.
            let own = p.s.queue.iter().find(|t| t.owner == me).map(|t| t.score);
            let ahead: Vec<Ticket> =
                p.s.queue
                    .iter()
                    .filter(|t| own.is_none_or(|o| t.score < o))
                    .copied()
                    .collect();
            p.s.queue.retain(|t| t.owner != me);
            let fence = p.grant(me, mode, ttl, &ahead);
            p.settle();
            return self.hold(s, client, mode, fence, s.real + ttl);
        }
        p.settle();
        // Register, or refresh: a refresh keeps its member's score (its place in line); a
        // member that is gone (dropped dead, or the queue expired) registers anew at the tail.
        let deadline = s.server + self.sizes.claim;
        let old = known.and_then(|k| {
            s.queue
                .iter()
                .position(|t| t.owner == me && t.deadline == k)
        });
        let score = match old {
            Some(i) => s.queue.remove(i).score,
            None => {
                let tail = s.queue.last().map_or(0, |t| t.score + 1);
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
                mode,
            },
        );
        s.queue_expiry = s.server + self.sizes.claim;
        s.clients[usize::from(client)].0 = Phase::Waiting {
            mode,
            since,
            sent: s.real,
            known: Some(deadline),
            retried: true,
        };
    }

    /// `RELEASE`: compare the token, remove the permit, then grant the waiters that fit.
    pub(crate) fn release(&self, s: &mut State, client: u8) {
        let me = s.owner(client);
        s.clients[usize::from(client)].0 = self.after_session(s, client);
        let mut p = Prelude::new(self, s);
        p.drop_expired();
        if let Some(i) = p.s.holders.iter().position(|h| h.owner == me) {
            p.s.holders.remove(i);
            p.touched();
        } else if self.broken == Break::NoClaimCheck && !p.s.holders.is_empty() {
            // The token compare dropped: a late release removes someone else's permit.
            p.s.holders.remove(0);
            p.touched();
        }
        p.pump(None);
        p.settle();
    }

    /// `RENEW`: compare the token and the expiry, then lengthen to now + TTL (never
    /// shorten); the lease is lost when the permit is not the client's any more.
    pub(crate) fn renew(&self, s: &mut State, client: u8) {
        let me = s.owner(client);
        let now = s.server;
        let ttl = self.sizes.ttl;
        let Some(i) = s
            .holders
            .iter()
            .position(|h| h.owner == me && h.expiry > now)
        else {
            // Lost: the handler is told, and the session ends (its release is a no-op).
            s.clients[usize::from(client)].0 = self.after_session(s, client);
            return;
        };
        let mut p = Prelude::new(self, s);
        if p.s.holders[i].expiry < now + ttl {
            let mut held = p.s.holders.remove(i);
            held.expiry = now + ttl;
            p.insert(held);
            p.touched();
            p.settle();
        }
        if let Phase::Holding {
            mode, fence, since, ..
        } = s.clients[usize::from(client)].0
        {
            s.clients[usize::from(client)].0 = Phase::Holding {
                mode,
                fence,
                since,
                deadline: s.real + ttl,
            };
        }
    }

    /// The subscriber hands the grant to its waiter, whose local deadline counts from the
    /// moment it sent its last attempt; a grant naming an earlier registration than the
    /// waiter's latest is stale and ignored.
    pub(crate) fn deliver(&self, s: &mut State, index: usize) {
        let grant = s.messages.remove(index);
        let client = grant.owner.client;
        if s.owner(client) != grant.owner {
            return;
        }
        if let Phase::Waiting {
            mode, sent, known, ..
        } = s.clients[usize::from(client)].0
            && (self.broken == Break::StaleGrantTaken || known.is_some_and(|k| grant.deadline >= k))
        {
            self.hold(s, client, mode, grant.fence, sent + grant.px);
        }
    }

    /// The client holds a permit, valid locally until `deadline`.
    fn hold(&self, s: &mut State, client: u8, mode: Mode, fence: u16, deadline: u8) {
        s.clients[usize::from(client)].0 = Phase::Holding {
            mode,
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
