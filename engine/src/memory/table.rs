//! The in-process backend's table of one space (a key's lock, or its shared leases): per
//! key, an entry of that space, sharded, each shard behind its lock. One table type for
//! both spaces; what differs between them is the entry ([`Space`]).
//!
//! A key is hashed once per operation (a keyed SipHash: keys come from clients), and that
//! hash both picks the shard and finds the entry in it: a grant and its release used to
//! hash the key seven times.

use std::{
    collections::{VecDeque, hash_map::RandomState},
    hash::BuildHasher,
    ops::{Deref, DerefMut},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use hashbrown::HashTable;

use tokio::{
    sync::{Notify, oneshot},
    time::Instant,
};

use super::MemoryBackend;
use crate::{AcquireRequest, ExtendMode, Grant, Holder, LockError, LockKey, Mode, Token};

const SHARDS: usize = 64;

/// One key's entry in one space: its holders and its waiters in arrival order, and the
/// decisions that differ between the lock ([`Exclusive`](super::exclusive::Exclusive))
/// and the shared leases ([`Shared`](super::shared::Shared)). Every method runs with the
/// entry's shard locked.
pub(super) trait Space: Default + Send + 'static {
    /// Decide `req` now (holders whose lease ran out dropped first): granted, or refused
    /// at once; `None` when it has to queue.
    fn decide(
        &mut self,
        req: &AcquireRequest,
        now: Instant,
        backend: &MemoryBackend,
    ) -> Option<Result<Grant, LockError>>;

    /// Drop the holders whose lease ran out, granting the waiters that now fit.
    fn expire(&mut self, now: Instant, backend: &MemoryBackend);

    /// Grant from the head of the queue whoever now fits (a waiter left, say).
    fn grant_waiters(&mut self, now: Instant, backend: &MemoryBackend);

    /// When the first holder's lease runs out, if anyone holds with an expiry.
    fn earliest(&self) -> Option<Instant>;

    /// Give back a grant of `fence` to `token` that its waiter never saw, if it still
    /// holds it (it may have run out, and the key gone on to someone else).
    fn give_back(&mut self, token: &Token, fence: u64, now: Instant, backend: &MemoryBackend);

    /// Release `token`'s lease, granting the waiters that now fit.
    fn release(
        &mut self,
        token: &Token,
        now: Instant,
        backend: &MemoryBackend,
    ) -> Result<(), LockError>;

    /// Change `token`'s remaining TTL; the new remaining TTL.
    fn extend(
        &mut self,
        token: &Token,
        ttl: Duration,
        how: ExtendMode,
        now: Instant,
    ) -> Result<Duration, LockError>;

    /// Renew `token`'s lease to at least `ttl` from now (never shorter); whether it holds.
    fn renew(&mut self, token: &Token, ttl: Duration, now: Instant) -> bool;

    /// The holders now, with their remaining TTLs.
    fn holders(&self, now: Instant) -> Vec<Holder>;

    /// Whether anyone holds (expired holders included until they are dropped).
    fn is_held(&self) -> bool;

    /// The waiters.
    fn queue(&mut self) -> &mut Queue;

    /// How many wait.
    fn waiting(&self) -> usize;

    /// How long until the first holder's lease runs out (a retry hint).
    fn remaining(&self, now: Instant) -> Option<Duration> {
        self.earliest().map(|e| e.saturating_duration_since(now))
    }

    /// Nothing to keep: nobody waits, and nobody holds.
    fn is_empty(&self) -> bool {
        self.waiting() == 0 && !self.is_held()
    }

    /// Nothing to keep but holders whose leases ran out.
    fn idle(&self, now: Instant) -> bool;
}

/// A key's waiters in one space, in arrival order, and what they were told of the
/// earliest holder expiry.
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
    pub(super) fn expiry_is(&mut self, earliest: Option<Instant>) {
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
    pub(super) grant: oneshot::Sender<Grant>,
}

/// The entries of one space, sharded by key.
pub(super) struct Table<E> {
    shards: Box<[Mutex<Shard<E>>]>,
    hasher: RandomState,
}

pub(super) struct Shard<E> {
    map: HashTable<Slot<E>>,
    /// Sweep idle entries when the map grows past this size.
    sweep_at: usize,
}

/// One key's entry, with the key's hash (so that a table that grows hashes no key again).
struct Slot<E> {
    hash: u64,
    key: LockKey,
    entry: E,
}

impl<E> Default for Shard<E> {
    fn default() -> Self {
        Self {
            map: HashTable::new(),
            sweep_at: 0,
        }
    }
}

/// A shard locked for one key, with the key's hash: what is done under it hashes nothing
/// again.
pub(super) struct Locked<'a, E> {
    shard: MutexGuard<'a, Shard<E>>,
    hash: u64,
}

impl<E> Deref for Locked<'_, E> {
    type Target = Shard<E>;

    fn deref(&self) -> &Shard<E> {
        &self.shard
    }
}

impl<E> DerefMut for Locked<'_, E> {
    fn deref_mut(&mut self) -> &mut Shard<E> {
        &mut self.shard
    }
}

impl<E: Space> Default for Table<E> {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
        }
    }
}

impl<E: Space> Table<E> {
    /// `key`'s shard, locked.
    pub(super) fn shard(&self, key: &LockKey) -> Locked<'_, E> {
        self.shard_at(key, None)
    }

    /// `key`'s shard, locked, with `key`'s hash when the caller kept it
    /// ([`Locked::hash`]; `None`: it is computed).
    fn shard_at(&self, key: &LockKey, hash: Option<u64>) -> Locked<'_, E> {
        let hash = hash.unwrap_or_else(|| self.hasher.hash_one(key));
        // Bits the shard's table uses for neither its buckets (the low ones) nor its tags
        // (the top 7): within a shard they would all be alike.
        let i = (hash >> 32) as usize % SHARDS;
        Locked {
            shard: self.shards[i].lock().unwrap(),
            hash,
        }
    }

    /// How many keys have an entry (held, or waited for, or expired and not yet swept).
    pub(super) fn key_count(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap().map.len())
            .sum()
    }

    /// Run `change` on `key`'s entry (its expired holders dropped first), then drop the
    /// entry if nothing is left; [`LockError::Expired`] if there is no entry.
    pub(super) fn with_entry<T>(
        &self,
        key: &LockKey,
        backend: &MemoryBackend,
        change: impl FnOnce(&mut E, Instant) -> Result<T, LockError>,
    ) -> Result<T, LockError> {
        self.with_entry_at(key, backend, None, None, change)
    }

    /// [`with_entry`](Self::with_entry) as of `now` (`None`: the clock is read), an
    /// instant the caller has just read: one clock read then serves the caller and this;
    /// with `key`'s `hash` in this table, if the caller kept it.
    pub(super) fn with_entry_at<T>(
        &self,
        key: &LockKey,
        backend: &MemoryBackend,
        now: Option<Instant>,
        hash: Option<u64>,
        change: impl FnOnce(&mut E, Instant) -> Result<T, LockError>,
    ) -> Result<T, LockError> {
        let mut shard = self.shard_at(key, hash);
        let now = now.unwrap_or_else(Instant::now);
        let Some(entry) = shard.get_mut(key) else {
            return Err(LockError::Expired);
        };
        entry.expire(now, backend);
        let result = change(entry, now);
        shard.remove_if_empty(key);
        result
    }
}

impl<E: Space> Locked<'_, E> {
    /// The key's hash in this table: a caller that keeps it locks the key's shard again
    /// without hashing the key ([`Table::with_entry_at`]).
    pub(super) fn hash(&self) -> u64 {
        self.hash
    }

    /// `key`'s entry (the key this shard was locked for), if it has one.
    pub(super) fn get(&self, key: &LockKey) -> Option<&E> {
        self.shard
            .map
            .find(self.hash, |s| s.key == *key)
            .map(|s| &s.entry)
    }

    /// `key`'s entry, if it has one.
    pub(super) fn get_mut(&mut self, key: &LockKey) -> Option<&mut E> {
        self.shard
            .map
            .find_mut(self.hash, |s| s.key == *key)
            .map(|s| &mut s.entry)
    }

    /// `key`'s entry, made empty if it has none.
    pub(super) fn entry(&mut self, key: &LockKey) -> &mut E {
        let slot = self
            .shard
            .map
            .entry(self.hash, |s| s.key == *key, |s| s.hash)
            .or_insert_with(|| Slot {
                hash: self.hash,
                key: key.clone(),
                entry: E::default(),
            })
            .into_mut();
        &mut slot.entry
    }

    pub(super) fn remove_if_empty(&mut self, key: &LockKey) {
        let map = &mut self.shard.map;
        if let Ok(slot) = map.find_entry(self.hash, |s| s.key == *key)
            && slot.get().entry.is_empty()
        {
            slot.remove();
            // Give memory back after a burst of distinct keys.
            if map.capacity() > 64 && map.len() < map.capacity() / 8 {
                map.shrink_to(map.len() * 2, |s| s.hash);
            }
        }
    }
}

impl<E: Space> Shard<E> {
    /// Drop the idle entries when the map has grown past its last size twice over.
    pub(super) fn sweep(&mut self, now: Instant) {
        if self.map.len() < self.sweep_at {
            return;
        }
        self.map.retain(|s| !s.entry.idle(now));
        self.sweep_at = (self.map.len() * 2).max(64);
    }
}
