//! The lock space of a key in memory ([`Exclusive`]): one holder, its waiters in arrival
//! order, and the hand-off from one to the next.

use std::time::Duration;

use tokio::time::Instant;

use super::{
    MemoryBackend,
    table::{Queue, Space},
};
use crate::{AcquireRequest, ExtendMode, Fence, Grant, Holder, LockError, Token, options::after};

/// One key's lock.
#[derive(Default)]
pub(super) struct Exclusive {
    pub(super) holder: Option<HeldBy>,
    queue: Queue,
}

pub(super) struct HeldBy {
    pub(super) token: Token,
    /// `None`: no expiry (only an admin can set that).
    pub(super) expires: Option<Instant>,
    pub(super) fence: u64,
}

impl HeldBy {
    fn expired(&self, now: Instant) -> bool {
        self.expires.is_some_and(|e| e <= now)
    }
}

impl Exclusive {
    /// Install `holder`, waking the waiters if it expires earlier than they were told.
    pub(super) fn set_holder(&mut self, holder: HeldBy) {
        let expires = holder.expires;
        self.holder = Some(holder);
        self.queue.expiry_is(expires);
    }

    /// Hand the free key to the first waiter still listening.
    pub(super) fn grant_next(&mut self, now: Instant, backend: &MemoryBackend) {
        debug_assert!(self.holder.is_none());
        while let Some(w) = self.queue.waiters.pop_front() {
            let fence = backend.next_fence();
            let (grant, claim_ends) = super::handed_off(fence, now, w.ttl);
            if w.grant.send(grant).is_ok() {
                self.set_holder(HeldBy {
                    token: w.token,
                    expires: Some(claim_ends),
                    fence: fence.get(),
                });
                return;
            }
        }
    }

    /// The holder, checked against `token`: [`LockError::NotOwned`] if another token holds
    /// the key, [`LockError::Expired`] if nobody does.
    fn owned_by(&mut self, token: &Token) -> Result<&mut HeldBy, LockError> {
        match &mut self.holder {
            Some(h) if h.token == *token => Ok(h),
            Some(_) => Err(LockError::NotOwned),
            None => Err(LockError::Expired),
        }
    }
}

impl Space for Exclusive {
    fn decide(
        &mut self,
        req: &AcquireRequest,
        now: Instant,
        backend: &MemoryBackend,
    ) -> Option<Result<Grant, LockError>> {
        self.expire(now, backend);
        match &mut self.holder {
            None => {
                let fence = backend.next_fence();
                self.set_holder(HeldBy {
                    token: req.token.clone(),
                    expires: Some(after(now, req.ttl)),
                    fence: fence.get(),
                });
                return Some(Ok(Grant::new(fence, now)));
            }
            Some(h) if h.token == req.token => {
                let expires = Some(after(now, req.ttl));
                h.expires = expires;
                let fence = Fence::new(h.fence);
                self.queue.expiry_is(expires);
                return Some(Ok(Grant::new(fence, now)));
            }
            Some(_) => {}
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

    /// Drop an expired holder and hand the key to the next waiter.
    fn expire(&mut self, now: Instant, backend: &MemoryBackend) {
        if self.holder.as_ref().is_some_and(|h| h.expired(now)) {
            self.holder = None;
            self.grant_next(now, backend);
        }
    }

    fn grant_waiters(&mut self, now: Instant, backend: &MemoryBackend) {
        if self.holder.is_none() {
            self.grant_next(now, backend);
        }
    }

    fn earliest(&self) -> Option<Instant> {
        self.holder.as_ref().and_then(|h| h.expires)
    }

    fn give_back(&mut self, token: &Token, fence: u64, now: Instant, backend: &MemoryBackend) {
        let ours = self
            .holder
            .as_ref()
            .is_some_and(|h| h.token == *token && h.fence == fence);
        if ours {
            self.holder = None;
            self.grant_next(now, backend);
        }
    }

    fn release(
        &mut self,
        token: &Token,
        now: Instant,
        backend: &MemoryBackend,
    ) -> Result<(), LockError> {
        self.owned_by(token)?;
        self.holder = None;
        self.grant_next(now, backend);
        Ok(())
    }

    fn extend(
        &mut self,
        token: &Token,
        ttl: Duration,
        how: ExtendMode,
        now: Instant,
    ) -> Result<Duration, LockError> {
        let h = self.owned_by(token)?;
        let expires = match (how, h.expires) {
            (ExtendMode::Add, Some(e)) => after(e, ttl),
            (ExtendMode::Add, None) => return Ok(Duration::MAX),
            (ExtendMode::Replace, _) => after(now, ttl),
        };
        h.expires = Some(expires);
        self.queue.expiry_is(Some(expires));
        Ok(expires - now)
    }

    fn renew(&mut self, token: &Token, ttl: Duration, now: Instant) -> bool {
        let Ok(h) = self.owned_by(token) else {
            return false;
        };
        // A renewal never shortens a lease: one that lands after an extend must not undo it.
        if let Some(e) = h.expires {
            let expires = e.max(after(now, ttl));
            h.expires = Some(expires);
            self.queue.expiry_is(Some(expires));
        }
        true
    }

    fn holders(&self, now: Instant) -> Vec<Holder> {
        self.holder
            .iter()
            .map(|h| {
                Holder::new(
                    h.token.clone(),
                    h.expires.map(|e| e.saturating_duration_since(now)),
                )
            })
            .collect()
    }

    fn is_held(&self) -> bool {
        self.holder.is_some()
    }

    fn queue(&mut self) -> &mut Queue {
        &mut self.queue
    }

    fn waiting(&self) -> usize {
        self.queue.waiters.len()
    }

    fn idle(&self, now: Instant) -> bool {
        self.queue.waiters.is_empty() && self.holder.as_ref().is_none_or(|h| h.expired(now))
    }
}
