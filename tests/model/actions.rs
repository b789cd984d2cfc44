//! The model's actions, each named after the script (or the event) it abstracts, and what
//! each does to the state.
//!
//! Where the model and the scripts could drift (read this when a script changes):
//! - The shared steps are written out in [`Script`] in the same order; the 100-ticket
//!   bound of `live_head` never binds with three clients.
//! - `ACQUIRE` is modelled without the flag `r`, the waiter limit, the refusal of an
//!   upgrade (a client's mode is fixed for its session), and the uncontended fast path's
//!   keys (the model's key is one set of holders, whichever the mode). A client's request,
//!   the script and its reply are one atomic step, except the copy of a registration that
//!   the connection sends again ([`Action::Resent`]), whose reply nobody reads: one in a
//!   run, the first registration's, while its waiter waits (a copy after that is a
//!   re-entry or a ghost ticket, which the token and the nonce keep apart as well); not
//!   under fairness (the bounded wait), where it multiplies the states six times.
//! - Every attempt of a waiter carries a fresh nonce, which the script stores in its
//!   ticket (a new one, or the one of the same id, which keeps its place in line): a copy
//!   of a request is idempotent, one ticket per id. A grant names the ticket's nonce; a
//!   waiter takes only a grant naming its latest attempt's.
//! - Every shared client asks with the same limit, TTL and claim period (the scripts read
//!   each ticket's own); one acquisition per client.
//! - `RELEASE` is modelled whole; `RENEW` one lease per call; `EXTEND`, `LEAVE` (a waiter
//!   giving up; a crash stands for a waiter that vanishes) and `HOLDERS` are not modelled,
//!   nor a re-sent release (the token compare makes it a no-op, as a late release is).
//! - A holder runs while its expiry is after the server clock's tick; the scripts keep it
//!   through its expiry's millisecond, which the model gives away (less exclusion: a safe
//!   simplification for the checks).
//! - A duplicated grant message is not modelled: the first delivery either moves its
//!   waiter on, or is refused for a nonce that stays refused, so a copy changes nothing.
//! - A grant's local deadline counts from the real time the waiter sent its last attempt
//!   (the engine counts from before it).

use crate::model::{Break, Protocol};
use crate::script::Script;
use crate::state::{Mode, Owner, Phase, Resend, State, Ticket};

/// One step of the system.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub(crate) enum Action {
    /// `ACQUIRE` as a client's first attempt, alone or shared: granted if nobody waits and
    /// it fits, registered otherwise.
    Acquire(u8, Mode),
    /// `ACQUIRE` as a registered waiter's fallback retry, with a fresh nonce: grant what
    /// fits from the queue's head (its own ticket with its full TTL), find a grant whose
    /// message it missed (re-entry), or refresh its ticket.
    AcquireRetry(u8),
    /// The connection's copy of a registration arrives (now or much later).
    Resent,
    /// The subscriber receives a grant message. A message may arrive at any later point or
    /// never (lost: the subscriber was reconnecting, the network dropped it).
    GrantDelivered(u8),
    /// `RENEW`: the watchdog renews the client's lease.
    Renew(u8),
    /// `RELEASE`: the client gives its lease back (also a late release of a lost lease),
    /// granting the waiters that now fit.
    Release(u8),
    /// The client crashes: its lease, its ticket and its claims stay until they expire.
    /// Only under fairness, which would otherwise hold it to retrying, renewing and
    /// releasing in time.
    Crash(u8),
    /// One tick of real time, and of the server clock.
    Tick,
    /// The server clock steps back this many ticks (once in a run, up to `step_back`).
    ClockStepBack(u8),
}

impl Protocol {
    /// The `ACQUIRE` script for `me` in `mode`, its nonce the latest or not: the fence of
    /// the lease it holds, or `None` when its ticket is queued.
    pub(crate) fn acquire_script(
        &self,
        s: &mut State,
        me: Owner,
        mode: Mode,
        latest: bool,
    ) -> Option<u16> {
        let ttl = self.sizes.ttl;
        let mut p = Script::new(self, s);
        if let Some(i) = p.s.holders.iter().position(|h| h.owner == me) {
            // Re-entry: the grant whose message was missed; the full TTL from now.
            let mut held = p.s.holders.remove(i);
            held.expiry = p.s.server + ttl;
            p.insert(held);
            p.touched();
            p.s.queue.retain(|t| t.owner != me);
            p.pump(Some(me));
            p.settle();
            return Some(held.fence);
        }
        let (mine, waiting) = p.pump(Some(me));
        p.check_woken(Some(me));
        if mine.is_some() {
            p.settle();
            return mine;
        }
        if (!waiting || self.broken == Break::ArrivalIgnoresQueue) && p.fits(mode) {
            // Granted on arrival: every other live ticket is ahead of this request.
            let own = p.s.queue.iter().find(|t| t.owner == me).map(|t| t.score);
            let ahead: Vec<Ticket> = (p.s.queue.iter())
                .filter(|t| own.is_none_or(|o| t.score < o))
                .copied()
                .collect();
            p.s.queue.retain(|t| t.owner != me);
            let fence = p.grant(me, mode, ttl, &ahead);
            p.settle();
            return Some(fence);
        }
        p.settle();
        // Register, or refresh by id: a refresh keeps its place in line; a ticket that is
        // gone (dropped dead, or the queue expired) registers anew at the tail.
        let score = match s.queue.iter().position(|t| t.owner == me) {
            Some(i) => s.queue.remove(i).score,
            None => (s.queue.last().map_or(0, |t| t.score + 1)).max(s.now_us(&self.sizes)),
        };
        let at = s.queue.partition_point(|t| t.score < score);
        let deadline = s.server + self.sizes.claim;
        let ticket = Ticket {
            owner: me,
            deadline,
            score,
            mode,
            latest,
        };
        s.queue.insert(at, ticket);
        s.queue_expiry = s.server + self.sizes.claim;
        None
    }

    /// A client's attempt (`first` is the mode of a first one), with a fresh nonce: the
    /// client ends up holding or waiting.
    pub(crate) fn acquire(&self, s: &mut State, client: u8, first: Option<Mode>) {
        let me = Owner(client);
        let (mode, since) = match (first, s.clients[usize::from(client)]) {
            (Some(mode), _) => (mode, s.real),
            (None, Phase::Waiting { mode, since, .. }) => (mode, since),
            (None, phase) => unreachable!("a retry while {phase:?}"),
        };
        // Its earlier nonces are no longer its latest.
        s.queue
            .iter_mut()
            .filter(|t| t.owner == me)
            .for_each(|t| t.latest = false);
        s.messages
            .iter_mut()
            .filter(|m| m.owner == me)
            .for_each(|m| m.latest = false);
        if let Resend::Pending(owner, mode, _) = s.resend
            && owner == me
        {
            s.resend = Resend::Pending(owner, mode, false);
        }
        let phase = match self.acquire_script(s, me, mode, true) {
            Some(fence) => Phase::Holding {
                mode,
                fence,
                deadline: s.real + self.sizes.ttl,
                since: s.real,
            },
            None => {
                if s.resend == Resend::Unused && self.fair.is_none() {
                    s.resend = Resend::Pending(me, mode, true);
                }
                Phase::Waiting {
                    mode,
                    since,
                    sent: s.real,
                    known: s.server + self.sizes.claim,
                    retried: true,
                }
            }
        };
        s.clients[usize::from(client)] = phase;
    }

    /// The copy of a registration runs: the same script, nobody reads its reply.
    pub(crate) fn resent(&self, s: &mut State) {
        let Resend::Pending(owner, mode, latest) = s.resend else {
            unreachable!("no copy in flight")
        };
        s.resend = Resend::Spent;
        self.acquire_script(s, owner, mode, latest);
    }

    /// `RELEASE`: compare the token, remove the lease, then grant the waiters that fit.
    pub(crate) fn release(&self, s: &mut State, client: u8) {
        let me = Owner(client);
        s.clients[usize::from(client)] = Phase::Done;
        let mut p = Script::new(self, s);
        if let Some(i) = p.s.holders.iter().position(|h| h.owner == me) {
            p.s.holders.remove(i);
            p.touched();
        } else if self.broken == Break::NoClaimCheck && !p.s.holders.is_empty() {
            // The token compare dropped: a late release removes another's lease.
            p.s.holders.remove(0);
            p.touched();
        }
        if self.broken != Break::ReleaseSkipsQueue {
            p.pump(None);
        }
        p.check_woken(None);
        p.settle();
    }

    /// `RENEW`: compare the token and the expiry, then lengthen to now + TTL (never
    /// shorten); the lease is lost when it is not the client's any more.
    pub(crate) fn renew(&self, s: &mut State, client: u8) {
        let me = Owner(client);
        let (now, ttl) = (s.server, self.sizes.ttl);
        let Some(i) = (s.holders.iter()).position(|h| h.owner == me && h.expiry > now) else {
            // Lost: the handler is told, and the session ends (its release is a no-op).
            s.clients[usize::from(client)] = Phase::Done;
            return;
        };
        if s.holders[i].expiry < now + ttl {
            let mut p = Script::new(self, s);
            let i =
                p.s.holders
                    .iter()
                    .position(|h| h.owner == me)
                    .expect("live");
            let mut held = p.s.holders.remove(i);
            held.expiry = now + ttl;
            p.insert(held);
            p.touched();
            p.settle();
        }
        if let Phase::Holding { deadline, .. } = &mut s.clients[usize::from(client)] {
            *deadline = s.real + ttl;
        }
    }

    /// The subscriber hands the grant to its waiter, which takes it only if it names its
    /// latest attempt's nonce; its local deadline counts from that attempt.
    pub(crate) fn deliver(&self, s: &mut State, index: usize) {
        let grant = s.messages.remove(index);
        let client = usize::from(grant.owner.0);
        if let Phase::Waiting {
            mode, sent, known, ..
        } = s.clients[client]
        {
            let taken = match self.broken {
                Break::NonceUnchecked => true,
                Break::DeadlineRule => grant.deadline >= known,
                _ => grant.latest,
            };
            if taken {
                s.clients[client] = Phase::Holding {
                    mode,
                    fence: grant.fence,
                    deadline: sent + self.px(),
                    since: s.real,
                };
            }
        }
    }
}
