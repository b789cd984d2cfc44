//! The one space of a key in memory ([`Space`]): its holders, either one alone (the key's
//! lock, or a shared lease with a limit of 1) or several sharing up to each one's limit,
//! indexed by expiry; and its waiters of both modes in one arrival order, granted from the
//! head of the queue as many as fit.
//!
//! Nobody polls. A release (or a dropped waiter) grants the waiters that now fit on the
//! spot, through their oneshot channels. A holder whose lease runs out is dropped by the
//! waiters themselves: each sleeps until the earliest holder expiry (and is told when that
//! moves earlier), then expires what ran out, which grants the head of the queue. With
//! nobody waiting, an expired holder is dropped at the next call on its key, or by a sweep.

use std::{collections::VecDeque, sync::Arc, time::Duration};

use tokio::{
    sync::{Notify, oneshot},
    time::Instant,
};

use super::{
    MemoryBackend,
    holders::{Holders, Holding},
};
use crate::{
    AcquireRequest, ExtendMode, Fence, Grant, Holder, HolderLabel, LockError, Mode, Token,
    options::after,
};

/// One key's holders and waiters, in both modes.
#[derive(Default)]
pub(super) struct Space {
    holders: Holders,
    pub(super) queue: Queue,
}

/// A key's waiters in arrival order, and what they were told of the earliest holder
/// expiry.
#[derive(Default)]
pub(super) struct Queue {
    pub(super) waiters: VecDeque<Waiter>,
    /// Wakes the waiters when the earliest holder expiry moves earlier than they may have
    /// seen (a grant or hand-off with a shorter lease, a shortening extend, an admin set),
    /// so that each re-reads it: a waiter must never sleep past the moment the key frees up.
    pub(super) changed: Option<Arc<Notify>>,
    /// The earliest holder expiry as of the last change (`None`: none); a waiter that read
    /// it sleeps no later than that.
    told: Option<Instant>,
}

impl Queue {
    /// The earliest holder expiry is now `earliest`: wake the waiters if it is earlier than
    /// what they were told.
    fn expiry_is(&mut self, earliest: Option<Instant>) {
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
}

/// A queued acquisition, granted through its channel.
pub(super) struct Waiter {
    pub(super) id: u64,
    pub(super) token: Token,
    pub(super) ttl: Duration,
    pub(super) mode: Mode,
    pub(super) label: Option<HolderLabel>,
    pub(super) grant: oneshot::Sender<Grant>,
}

/// How many a request in `mode` lets hold at once, itself included: 1 holds alone (the
/// key's lock, or a shared lease with a limit of 1).
fn limit(mode: Mode) -> u32 {
    match mode {
        Mode::Shared { limit } => limit,
        _ => 1,
    }
}

/// How a holder in `mode` is listed (see [`Holder::mode`]): the limit of a shared lease
/// among others is not kept.
fn listed(mode: Mode) -> Mode {
    match mode {
        Mode::Shared { limit } if limit != 1 => Mode::Shared { limit: u32::MAX },
        other => other,
    }
}

impl Space {
    /// Whether a request with `limit` fits beside the current holders (the queue aside):
    /// one alone (`limit == 1`) only when nobody holds, another when nobody holds alone
    /// and fewer than its own `limit` hold.
    fn fits(&self, limit: u32) -> bool {
        if limit == 1 {
            self.holders.is_empty()
        } else {
            !self.alone() && (self.holders.len() as u64) < u64::from(limit)
        }
    }

    /// Whether the one holder holds the key alone.
    fn alone(&self) -> bool {
        matches!(&self.holders, Holders::One(_, h) if limit(h.mode) == 1)
    }

    fn holding(&self, token: &Token) -> Option<Holding> {
        self.holders.get(token)
    }

    /// Whether `token` holds the key.
    pub(super) fn holds(&self, token: &Token) -> bool {
        self.holders.get(token).is_some()
    }

    /// Add `token` as a holder (it holds nothing yet).
    fn insert(&mut self, token: Token, holding: Holding) {
        debug_assert!(self.fits(if limit(holding.mode) == 1 {
            1
        } else {
            u32::MAX
        }));
        self.holders.insert(token, holding);
        self.expiries_changed();
    }

    /// Remove `token`'s holding, if any; the caller then grants the waiters that fit.
    fn remove(&mut self, token: &Token) -> Option<Holding> {
        let holding = self.holders.remove(token)?;
        self.expiries_changed();
        Some(holding)
    }

    /// Move `token`'s expiry to `expires`; `false` if it holds nothing.
    fn set_expiry(&mut self, token: &Token, expires: Instant) -> bool {
        let set = self.holders.set_expiry(token, expires);
        if set {
            self.expiries_changed();
        }
        set
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

    /// Decide `req` now (holders whose lease ran out dropped first): granted, or refused
    /// at once; `None` when it has to queue.
    pub(super) fn decide(
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
        // Re-entry: the token's holding, refreshed, with its fence. A shared lease is not
        // made alone by asking again, even by its sole holder: that would be an upgrade.
        if let Some(held) = self.holding(&req.token) {
            if limit == 1 && !self.alone() {
                return Some(Err(LockError::InvalidValue(
                    "a shared lease cannot be re-entered alone",
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
                    expires: Some(after(now, req.ttl)),
                    mode: req.mode,
                    fence: fence.get(),
                    label: req.label.clone(),
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
    pub(super) fn expire(&mut self, now: Instant, backend: &MemoryBackend) {
        if self.holders.drop_expired(now) {
            self.expiries_changed();
            self.grant_waiters(now, backend);
        }
    }

    /// Grant from the head of the queue as many as fit, stopping at the first that does
    /// not (so nobody is overtaken, and a waiter alone keeps later ones out). A waiter
    /// that is gone is skipped.
    pub(super) fn grant_waiters(&mut self, now: Instant, backend: &MemoryBackend) {
        while let Some(head) = self.queue.waiters.front() {
            // A token queued twice (a caller's own token) re-enters what it already holds.
            if let Some(held) = self.holding(&head.token) {
                let w = self.queue.waiters.pop_front().expect("the head is there");
                if w.grant
                    .send(Grant::new(Fence::new(held.fence), now))
                    .is_ok()
                {
                    let expires = held.expires.map(|e| e.max(after(now, w.ttl)));
                    self.set_expiry(&w.token, expires.unwrap_or_else(|| after(now, w.ttl)));
                }
                continue;
            }
            if !self.fits(limit(head.mode)) {
                return;
            }
            let w = self.queue.waiters.pop_front().expect("the head is there");
            let fence = backend.next_fence();
            let (grant, claim_ends) = super::handed_off(fence, now, w.ttl);
            if w.grant.send(grant).is_ok() {
                self.insert(
                    w.token,
                    Holding {
                        expires: Some(claim_ends),
                        mode: w.mode,
                        fence: fence.get(),
                        label: w.label,
                    },
                );
            }
        }
    }

    /// When the first holder's lease runs out, if anyone holds with an expiry.
    pub(super) fn earliest(&self) -> Option<Instant> {
        self.holders.earliest()
    }

    /// How long until the first holder's lease runs out (a retry hint).
    pub(super) fn remaining(&self, now: Instant) -> Option<Duration> {
        self.earliest().map(|e| e.saturating_duration_since(now))
    }

    /// Give back a grant of `fence` to `token` that its waiter never saw, if it still
    /// holds it (it may have run out, and the key gone on to someone else).
    pub(super) fn give_back(
        &mut self,
        token: &Token,
        fence: u64,
        now: Instant,
        backend: &MemoryBackend,
    ) {
        if self.holding(token).is_some_and(|h| h.fence == fence) {
            self.remove(token);
            self.grant_waiters(now, backend);
        }
    }

    /// Release `token`'s lease, granting the waiters that now fit.
    pub(super) fn release(
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

    /// Change `token`'s remaining TTL; the new remaining TTL.
    pub(super) fn extend(
        &mut self,
        token: &Token,
        ttl: Duration,
        how: ExtendMode,
        now: Instant,
    ) -> Result<Duration, LockError> {
        let Some(held) = self.holding(token) else {
            return Err(self.not_held_by_caller());
        };
        let expires = match (how, held.expires) {
            (ExtendMode::Add, Some(e)) => after(e, ttl),
            (ExtendMode::Add, None) => return Ok(Duration::MAX),
            (ExtendMode::Replace, _) => after(now, ttl),
        };
        self.set_expiry(token, expires);
        Ok(expires - now)
    }

    /// Renew `token`'s lease to at least `ttl` from now (never shorter); whether it holds.
    pub(super) fn renew(&mut self, token: &Token, ttl: Duration, now: Instant) -> bool {
        // A renewal never shortens a lease: one that lands after an extend must not undo it.
        match self.holding(token) {
            None => false,
            Some(Holding { expires: None, .. }) => true,
            Some(Holding {
                expires: Some(e), ..
            }) => self.set_expiry(token, e.max(after(now, ttl))),
        }
    }

    /// The holders now, earliest expiry first, with their remaining TTLs.
    pub(super) fn holders(&self, now: Instant) -> Vec<Holder> {
        self.holders
            .list()
            .into_iter()
            .map(|(token, h)| Holder {
                token: token.clone(),
                ttl: h.expires.map(|e| e.saturating_duration_since(now)),
                mode: listed(h.mode),
                label: h.label.clone(),
                fence: Some(Fence::new(h.fence)),
            })
            .collect()
    }

    /// Make `token` the one holder, alone, whoever holds now (an admin's set); the waiters
    /// keep waiting.
    pub(super) fn set_alone(&mut self, token: Token, expires: Option<Instant>, fence: u64) {
        self.holders = Holders::None;
        let mode = Mode::Exclusive;
        self.insert(
            token,
            Holding {
                expires,
                mode,
                fence,
                label: None,
            },
        );
    }

    /// Drop every holder (an admin's force release), granting the waiters that now fit;
    /// whether anyone held.
    pub(super) fn clear(&mut self, now: Instant, backend: &MemoryBackend) -> bool {
        let held = !self.holders.is_empty();
        self.holders = Holders::None;
        self.expiries_changed();
        self.grant_waiters(now, backend);
        held
    }

    /// How many wait.
    pub(super) fn waiting(&self) -> usize {
        self.queue.waiters.len()
    }

    /// Nothing to keep: nobody waits, and nobody holds.
    pub(super) fn is_empty(&self) -> bool {
        self.queue.waiters.is_empty() && self.holders.is_empty()
    }

    /// Nothing to keep but holders whose leases ran out.
    pub(super) fn idle(&self, now: Instant) -> bool {
        self.queue.waiters.is_empty() && self.holders.all_expired(now)
    }
}
