//! The shared space of a key in memory ([`Shared`]): its holders (up to each request's
//! limit, or one alone) indexed by expiry, and its waiters in arrival order, granted from
//! the head of the queue as many as fit.
//!
//! Nobody polls. A release (or a dropped waiter) grants the waiters that now fit on the
//! spot, through their oneshot channels. A holder whose lease runs out is dropped by the
//! waiters themselves: each sleeps until the earliest holder expiry (and is told when that
//! moves earlier), then expires what ran out, which grants the head of the queue. With
//! nobody waiting, an expired holder is dropped at the next call on its key, or by a sweep.

use std::{
    collections::{BTreeMap, HashMap},
    time::Duration,
};

use tokio::time::Instant;

use super::{
    MemoryBackend,
    table::{Queue, Space},
};
use crate::{
    AcquireRequest, ExtendMode, Fence, Grant, Holder, LockError, Mode, Token, options::after,
};

/// One key's shared leases.
#[derive(Default)]
pub(super) struct Shared {
    holders: HashMap<Token, Holding>,
    /// The holders by expiry, then fence (unique per holding): the earliest is first.
    by_expiry: BTreeMap<(Instant, u64), Token>,
    /// Whether the one holder holds the key alone.
    alone: bool,
    queue: Queue,
}

#[derive(Clone, Copy)]
struct Holding {
    expires: Instant,
    alone: bool,
    fence: u64,
}

/// A request's limit (at least 1 once checked); 1 holds alone.
fn limit(mode: Mode) -> u32 {
    match mode {
        Mode::Shared { limit } => limit,
        _ => 1,
    }
}

impl Shared {
    /// Whether a request with `limit` fits beside the current holders (the queue aside):
    /// one alone (`limit == 1`) only when nobody holds, another when nobody holds alone
    /// and fewer than its own `limit` hold.
    fn fits(&self, limit: u32) -> bool {
        if limit == 1 {
            self.holders.is_empty()
        } else {
            !self.alone && (self.holders.len() as u64) < u64::from(limit)
        }
    }

    fn holding(&self, token: &Token) -> Option<Holding> {
        self.holders.get(token).copied()
    }

    /// Add `token` as a holder (it holds nothing yet).
    fn insert(&mut self, token: Token, holding: Holding) {
        debug_assert!(self.fits(if holding.alone { 1 } else { u32::MAX }));
        self.by_expiry
            .insert((holding.expires, holding.fence), token.clone());
        self.alone = holding.alone;
        self.holders.insert(token, holding);
        self.expiries_changed();
    }

    /// Remove `token`'s holding, if any; the caller then grants the waiters that fit.
    fn remove(&mut self, token: &Token) -> Option<Holding> {
        let holding = self.holders.remove(token)?;
        self.by_expiry.remove(&(holding.expires, holding.fence));
        if holding.alone {
            self.alone = false;
        }
        self.expiries_changed();
        Some(holding)
    }

    /// Move `token`'s expiry to `expires`; `false` if it holds nothing.
    fn set_expiry(&mut self, token: &Token, expires: Instant) -> bool {
        let Some(holding) = self.holders.get_mut(token) else {
            return false;
        };
        self.by_expiry.remove(&(holding.expires, holding.fence));
        holding.expires = expires;
        self.by_expiry
            .insert((expires, holding.fence), token.clone());
        self.expiries_changed();
        true
    }

    /// The earliest holder expiry changed, maybe: the waiters are told if it is earlier.
    fn expiries_changed(&mut self) {
        let earliest = self.earliest();
        self.queue.expiry_is(earliest);
    }

    /// [`LockError::NotOwned`] while someone holds, [`LockError::Expired`] once nobody does.
    fn not_held_by_caller(&self) -> LockError {
        if self.holders.is_empty() {
            LockError::Expired
        } else {
            LockError::NotOwned
        }
    }
}

impl Space for Shared {
    fn decide(
        &mut self,
        req: &AcquireRequest,
        now: Instant,
        backend: &MemoryBackend,
    ) -> Option<Result<Grant, LockError>> {
        let limit = limit(req.mode);
        if limit == 0 {
            return Some(Err(LockError::InvalidValue(
                "a shared limit must be at least 1",
            )));
        }
        self.expire(now, backend);
        // Re-entry: the token's holding, refreshed, with its fence.
        if let Some(held) = self.holding(&req.token) {
            if limit == 1 && !held.alone {
                return Some(Err(LockError::InvalidValue(
                    "a shared lease held beside others cannot be re-entered alone",
                )));
            }
            self.set_expiry(&req.token, after(now, req.ttl));
            return Some(Ok(Grant::new(Fence::new(held.fence), now)));
        }
        // Granted on arrival only when nobody waits: no newcomer overtakes the queue.
        if self.queue.waiters.is_empty() && self.fits(limit) {
            let fence = backend.next_fence();
            self.insert(
                req.token.clone(),
                Holding {
                    expires: after(now, req.ttl),
                    alone: limit == 1,
                    fence: fence.get(),
                },
            );
            return Some(Ok(Grant::new(fence, now)));
        }
        let retry_after = self.remaining(now);
        if req.wait == Some(Duration::ZERO) {
            return Some(Err(LockError::Busy { retry_after }));
        }
        if req
            .max_waiters
            .is_some_and(|max| self.queue.waiters.len() >= max)
        {
            return Some(Err(LockError::QueueFull { retry_after }));
        }
        None
    }

    /// Drop the holders whose leases ran out, then grant the waiters that now fit.
    fn expire(&mut self, now: Instant, backend: &MemoryBackend) {
        let mut dropped = false;
        while let Some(entry) = self.by_expiry.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let token = entry.remove();
            if self.holders.remove(&token).is_some_and(|h| h.alone) {
                self.alone = false;
            }
            dropped = true;
        }
        if dropped {
            self.expiries_changed();
            self.grant_waiters(now, backend);
        }
    }

    /// Grant from the head of the queue as many as fit, stopping at the first that does
    /// not (so nobody is overtaken, and a waiter alone keeps later ones out). A waiter
    /// that is gone is skipped.
    fn grant_waiters(&mut self, now: Instant, backend: &MemoryBackend) {
        while let Some(head) = self.queue.waiters.front() {
            // A token queued twice (a caller's own token) re-enters what it already holds.
            if let Some(held) = self.holding(&head.token) {
                let w = self.queue.waiters.pop_front().expect("the head is there");
                if w.grant
                    .send(Grant::new(Fence::new(held.fence), now))
                    .is_ok()
                {
                    self.set_expiry(&w.token, held.expires.max(after(now, w.ttl)));
                }
                continue;
            }
            let limit = limit(head.mode);
            if !self.fits(limit) {
                return;
            }
            let w = self.queue.waiters.pop_front().expect("the head is there");
            let fence = backend.next_fence();
            let (grant, claim_ends) = super::handed_off(fence, now, w.ttl);
            if w.grant.send(grant).is_ok() {
                self.insert(
                    w.token,
                    Holding {
                        expires: claim_ends,
                        alone: limit == 1,
                        fence: fence.get(),
                    },
                );
            }
        }
    }

    /// When the first holder's lease runs out, if anyone holds.
    fn earliest(&self) -> Option<Instant> {
        self.by_expiry.keys().next().map(|(at, _)| *at)
    }

    fn give_back(&mut self, token: &Token, fence: u64, now: Instant, backend: &MemoryBackend) {
        if self.holding(token).is_some_and(|h| h.fence == fence) {
            self.remove(token);
            self.grant_waiters(now, backend);
        }
    }

    fn release(
        &mut self,
        token: &Token,
        now: Instant,
        backend: &MemoryBackend,
    ) -> Result<(), LockError> {
        if self.remove(token).is_none() {
            return Err(self.not_held_by_caller());
        }
        self.grant_waiters(now, backend);
        Ok(())
    }

    fn extend(
        &mut self,
        token: &Token,
        ttl: Duration,
        how: ExtendMode,
        now: Instant,
    ) -> Result<Duration, LockError> {
        let Some(held) = self.holding(token) else {
            return Err(self.not_held_by_caller());
        };
        let expires = match how {
            ExtendMode::Add => after(held.expires, ttl),
            ExtendMode::Replace => after(now, ttl),
        };
        self.set_expiry(token, expires);
        Ok(expires - now)
    }

    fn renew(&mut self, token: &Token, ttl: Duration, now: Instant) -> bool {
        // A renewal never shortens a lease: one that lands after an extend must not undo it.
        self.holding(token)
            .is_some_and(|held| self.set_expiry(token, held.expires.max(after(now, ttl))))
    }

    fn holders(&self, now: Instant) -> Vec<Holder> {
        self.by_expiry
            .iter()
            .map(|((expires, _), token)| {
                let alone = self.holders.get(token).is_some_and(|h| h.alone);
                Holder::shared(
                    token.clone(),
                    Some(expires.saturating_duration_since(now)),
                    alone,
                )
            })
            .collect()
    }

    fn is_held(&self) -> bool {
        !self.holders.is_empty()
    }

    fn queue(&mut self) -> &mut Queue {
        &mut self.queue
    }

    fn waiting(&self) -> usize {
        self.queue.waiters.len()
    }

    /// Nothing to keep: nobody waits, and nobody holds (or every lease ran out).
    fn idle(&self, now: Instant) -> bool {
        self.queue.waiters.is_empty()
            && self
                .by_expiry
                .keys()
                .next_back()
                .is_none_or(|(last, _)| *last <= now)
    }
}
