//! The in-process backend's table of keys: per key, its holder and its waiters in arrival
//! order, with the hand-off from one to the next; sharded, each shard behind its lock.

use std::{
    collections::{HashMap, VecDeque},
    sync::Arc,
    time::Duration,
};

use tokio::{
    sync::{Notify, oneshot},
    time::Instant,
};

use super::MemoryBackend;
use crate::{Grant, LockKey, Token, options::after};

#[derive(Default)]
pub(super) struct Shard {
    pub(super) map: HashMap<LockKey, Entry>,
    /// Sweep expired, abandoned entries when the map grows past this size.
    pub(super) sweep_at: usize,
}

#[derive(Default)]
pub(super) struct Entry {
    pub(super) holder: Option<HeldBy>,
    pub(super) waiters: VecDeque<Waiter>,
    /// Wakes the waiters when the holder's expiry moves earlier than they may have seen
    /// (a hand-off to a shorter lease, a shortening extend, an admin set), so that each
    /// re-reads it: a waiter must never sleep past the moment the key frees up.
    pub(super) changed: Option<Arc<Notify>>,
    /// The holder expiry waiters were last told of (`None`: no expiry); every waiter
    /// sleeps until no later than this.
    pub(super) told: Option<Instant>,
}

pub(super) struct HeldBy {
    pub(super) token: Token,
    /// `None`: no expiry (only an admin can set that).
    pub(super) expires: Option<Instant>,
    pub(super) fence: u64,
}

impl HeldBy {
    pub(super) fn expired(&self, now: Instant) -> bool {
        self.expires.is_some_and(|e| e <= now)
    }
}

pub(super) struct Waiter {
    pub(super) id: u64,
    pub(super) token: Token,
    pub(super) ttl: Duration,
    pub(super) grant: oneshot::Sender<Grant>,
}

impl Entry {
    /// Install `holder`, waking the waiters if it expires earlier than they were told.
    pub(super) fn set_holder(&mut self, holder: HeldBy) {
        let expires = holder.expires;
        self.holder = Some(holder);
        self.expiry_changed(expires);
    }

    /// The holder's expiry is now `expires`.
    pub(super) fn expiry_changed(&mut self, expires: Option<Instant>) {
        let earlier = match (expires, self.told) {
            (Some(new), Some(told)) => new < told,
            (Some(_), None) => true,
            (None, _) => false,
        };
        self.told = expires;
        if earlier && let Some(changed) = &self.changed {
            changed.notify_waiters();
        }
    }

    /// Drop an expired holder and hand the key to the next waiter.
    pub(super) fn expire(&mut self, now: Instant, backend: &MemoryBackend) {
        if self.holder.as_ref().is_some_and(|h| h.expired(now)) {
            self.holder = None;
            self.grant_next(now, backend);
        }
    }

    /// Hand the free key to the first waiter still listening.
    pub(super) fn grant_next(&mut self, now: Instant, backend: &MemoryBackend) {
        debug_assert!(self.holder.is_none());
        while let Some(w) = self.waiters.pop_front() {
            let fence = backend.next_fence();
            if w.grant.send(Grant::new(fence, now)).is_ok() {
                self.set_holder(HeldBy {
                    token: w.token,
                    expires: Some(after(now, w.ttl)),
                    fence: fence.get(),
                });
                return;
            }
        }
    }

    pub(super) fn remaining(&self, now: Instant) -> Option<Duration> {
        self.holder
            .as_ref()
            .and_then(|h| h.expires)
            .map(|e| e.saturating_duration_since(now))
    }

    pub(super) fn is_empty(&self) -> bool {
        self.holder.is_none() && self.waiters.is_empty()
    }
}

impl Shard {
    pub(super) fn remove_if_empty(&mut self, key: &LockKey) {
        if self.map.get(key).is_some_and(Entry::is_empty) {
            self.map.remove(key);
            // Give memory back after a burst of distinct keys.
            if self.map.capacity() > 64 && self.map.len() < self.map.capacity() / 8 {
                self.map.shrink_to(self.map.len() * 2);
            }
        }
    }

    pub(super) fn sweep(&mut self, now: Instant) {
        if self.map.len() < self.sweep_at {
            return;
        }
        self.map.retain(|_, e| {
            !(e.waiters.is_empty() && e.holder.as_ref().is_none_or(|h| h.expired(now)))
        });
        self.sweep_at = (self.map.len() * 2).max(64);
    }
}
