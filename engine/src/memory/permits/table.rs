//! The in-process permits table: per key, its holders (up to N shared, or one exclusive)
//! indexed by expiry, and its waiters in arrival order, granted from the head of the queue
//! as many as fit; sharded like the locks' table, each shard behind its lock.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::Arc,
    time::Duration,
};

use tokio::{
    sync::{Notify, oneshot},
    time::Instant,
};

use crate::{Fence, Grant, LockKey, PermitHolder, Token, memory::MemoryBackend, options::after};

#[derive(Default)]
pub(in crate::memory) struct PermitShard {
    pub(in crate::memory) map: HashMap<LockKey, PermitEntry>,
    /// Sweep idle entries whose holders all ran out when the map grows past this size.
    sweep_at: usize,
}

/// One key's permits.
#[derive(Default)]
pub(in crate::memory) struct PermitEntry {
    holders: HashMap<Token, Holding>,
    /// The holders by expiry, then fence (unique per holding): the earliest is first.
    by_expiry: BTreeMap<(Instant, u64), Token>,
    /// Whether the one holder holds the key alone.
    exclusive: bool,
    pub(super) waiters: VecDeque<PermitWaiter>,
    /// Wakes the waiters when the earliest holder expiry moves earlier than they may have
    /// seen (a grant with a shorter lease, a shortening extend), so that each re-reads it:
    /// a waiter must never sleep past the moment a permit frees up.
    pub(super) changed: Option<Arc<Notify>>,
    /// The earliest holder expiry as of the last change (`None`: no holder); a waiter that
    /// read it sleeps no later than that.
    told: Option<Instant>,
}

#[derive(Clone, Copy)]
pub(super) struct Holding {
    pub(super) expires: Instant,
    pub(super) exclusive: bool,
    pub(super) fence: u64,
}

pub(super) struct PermitWaiter {
    pub(super) id: u64,
    pub(super) token: Token,
    pub(super) ttl: Duration,
    pub(super) permits: u32,
    pub(super) exclusive: bool,
    pub(super) grant: oneshot::Sender<Grant>,
}

impl PermitEntry {
    /// Whether a request fits beside the current holders (the queue aside): an exclusive
    /// one only when nobody holds, a shared one when nobody holds alone and fewer than its
    /// own `permits` hold.
    pub(super) fn fits(&self, permits: u32, exclusive: bool) -> bool {
        if exclusive {
            self.holders.is_empty()
        } else {
            !self.exclusive && (self.holders.len() as u64) < u64::from(permits)
        }
    }

    pub(super) fn holding(&self, token: &Token) -> Option<Holding> {
        self.holders.get(token).copied()
    }

    pub(super) fn is_held(&self) -> bool {
        !self.holders.is_empty()
    }

    /// Add `token` as a holder (it holds nothing yet).
    pub(super) fn insert(&mut self, token: Token, holding: Holding) {
        debug_assert!(self.fits(u32::MAX, holding.exclusive));
        self.by_expiry
            .insert((holding.expires, holding.fence), token.clone());
        self.exclusive = holding.exclusive;
        self.holders.insert(token, holding);
        self.expiries_changed();
    }

    /// Remove `token`'s holding, if any; the caller then grants the waiters that fit.
    pub(super) fn remove(&mut self, token: &Token) -> Option<Holding> {
        let holding = self.holders.remove(token)?;
        self.by_expiry.remove(&(holding.expires, holding.fence));
        if holding.exclusive {
            self.exclusive = false;
        }
        self.expiries_changed();
        Some(holding)
    }

    /// Move `token`'s expiry to `expires`; `false` if it holds nothing.
    pub(super) fn set_expiry(&mut self, token: &Token, expires: Instant) -> bool {
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

    /// The earliest holder expiry changed, maybe: wake the waiters if it is now earlier
    /// than what they were told.
    fn expiries_changed(&mut self) {
        let earliest = self.earliest();
        let earlier = match (earliest, self.told) {
            (Some(new), Some(told)) => new < told,
            (Some(_), None) => true,
            (None, _) => false,
        };
        self.told = earliest;
        if earlier && let Some(changed) = &self.changed {
            changed.notify_waiters();
        }
    }

    /// When the first holder's lease runs out, if anyone holds.
    pub(super) fn earliest(&self) -> Option<Instant> {
        self.by_expiry.keys().next().map(|(at, _)| *at)
    }

    /// How long until the first holder's lease runs out (a retry hint).
    pub(super) fn remaining(&self, now: Instant) -> Option<Duration> {
        self.earliest().map(|e| e.saturating_duration_since(now))
    }

    /// Drop the holders whose leases ran out, then grant the waiters that now fit.
    pub(super) fn expire(&mut self, now: Instant, backend: &MemoryBackend) {
        let mut dropped = false;
        while let Some(entry) = self.by_expiry.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let token = entry.remove();
            if self.holders.remove(&token).is_some_and(|h| h.exclusive) {
                self.exclusive = false;
            }
            dropped = true;
        }
        if dropped {
            self.expiries_changed();
            self.grant_waiters(now, backend);
        }
    }

    /// Grant from the head of the queue as many as fit, stopping at the first that does
    /// not (so nobody is overtaken, and an exclusive waiter keeps later shared ones out).
    /// A waiter that is gone is skipped.
    pub(super) fn grant_waiters(&mut self, now: Instant, backend: &MemoryBackend) {
        while let Some(head) = self.waiters.front() {
            // A token queued twice (a caller's own token) re-enters what it already holds.
            if let Some(held) = self.holding(&head.token) {
                let w = self.waiters.pop_front().expect("the head is there");
                if w.grant
                    .send(Grant::new(Fence::new(held.fence), now))
                    .is_ok()
                {
                    self.set_expiry(&w.token, held.expires.max(after(now, w.ttl)));
                }
                continue;
            }
            if !self.fits(head.permits, head.exclusive) {
                return;
            }
            let w = self.waiters.pop_front().expect("the head is there");
            let fence = backend.next_fence();
            if w.grant.send(Grant::new(fence, now)).is_ok() {
                self.insert(
                    w.token,
                    Holding {
                        expires: after(now, w.ttl),
                        exclusive: w.exclusive,
                        fence: fence.get(),
                    },
                );
            }
        }
    }

    /// The holders now, with their remaining TTLs.
    pub(super) fn holders(&self, now: Instant) -> Vec<PermitHolder> {
        self.by_expiry
            .iter()
            .map(|((expires, _), token)| {
                let exclusive = self.holders.get(token).is_some_and(|h| h.exclusive);
                PermitHolder::new(
                    token.clone(),
                    Some(expires.saturating_duration_since(now)),
                    exclusive,
                )
            })
            .collect()
    }

    /// Nothing to keep: nobody waits, and nobody holds (or every lease ran out).
    fn idle(&self, now: Instant) -> bool {
        self.waiters.is_empty()
            && self
                .by_expiry
                .keys()
                .next_back()
                .is_none_or(|(last, _)| *last <= now)
    }
}

impl PermitShard {
    pub(in crate::memory) fn remove_if_empty(&mut self, key: &LockKey) {
        if self
            .map
            .get(key)
            .is_some_and(|e| e.waiters.is_empty() && e.holders.is_empty())
        {
            self.map.remove(key);
            // Give memory back after a burst of distinct keys.
            if self.map.capacity() > 64 && self.map.len() < self.map.capacity() / 8 {
                self.map.shrink_to(self.map.len() * 2);
            }
        }
    }

    /// Drop the idle entries when the map has grown past its last size twice over.
    pub(in crate::memory) fn sweep(&mut self, now: Instant) {
        if self.map.len() < self.sweep_at {
            return;
        }
        self.map.retain(|_, e| !e.idle(now));
        self.sweep_at = (self.map.len() * 2).max(64);
    }
}
