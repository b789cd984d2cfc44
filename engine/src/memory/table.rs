//! The in-process backend's table of keys: per key, its one space ([`Space`]: holders and
//! waiters of both modes), sharded, each shard behind its lock.
//!
//! A key is hashed once per operation (a keyed SipHash: keys come from clients), and that
//! hash both picks the shard and finds the entry in it: a grant and its release used to
//! hash the key seven times.

use std::{
    collections::hash_map::RandomState,
    hash::BuildHasher,
    ops::{Deref, DerefMut},
    sync::{Mutex, MutexGuard},
};

use hashbrown::HashTable;

use tokio::time::Instant;

use super::{MemoryBackend, space::Space};
use crate::{LockError, LockKey};

const SHARDS: usize = 64;

/// The keys' spaces, sharded by key.
pub(super) struct Table {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
}

pub(super) struct Shard {
    map: HashTable<Slot>,
    /// Sweep idle entries when the map grows past this size.
    sweep_at: usize,
}

/// One key's entry, with the key's hash (so that a table that grows hashes no key again).
struct Slot {
    hash: u64,
    key: LockKey,
    entry: Space,
}

impl Default for Shard {
    fn default() -> Self {
        Self {
            map: HashTable::new(),
            sweep_at: 0,
        }
    }
}

/// A shard locked for one key, with the key's hash: what is done under it hashes nothing
/// again.
pub(super) struct Locked<'a> {
    shard: MutexGuard<'a, Shard>,
    hash: u64,
}

impl Deref for Locked<'_> {
    type Target = Shard;

    fn deref(&self) -> &Shard {
        &self.shard
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Shard {
        &mut self.shard
    }
}

impl Default for Table {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
        }
    }
}

impl Table {
    /// `key`'s shard, locked.
    pub(super) fn shard(&self, key: &LockKey) -> Locked<'_> {
        self.shard_at(key, None)
    }

    /// `key`'s shard, locked, with `key`'s hash when the caller kept it
    /// ([`Locked::hash`]; `None`: it is computed).
    fn shard_at(&self, key: &LockKey, hash: Option<u64>) -> Locked<'_> {
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
        change: impl FnOnce(&mut Space, Instant) -> Result<T, LockError>,
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
        change: impl FnOnce(&mut Space, Instant) -> Result<T, LockError>,
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

impl Locked<'_> {
    /// The key's hash in this table: a caller that keeps it locks the key's shard again
    /// without hashing the key ([`Table::with_entry_at`]).
    pub(super) fn hash(&self) -> u64 {
        self.hash
    }

    /// `key`'s entry (the key this shard was locked for), if it has one.
    pub(super) fn get(&self, key: &LockKey) -> Option<&Space> {
        self.shard
            .map
            .find(self.hash, |s| s.key == *key)
            .map(|s| &s.entry)
    }

    /// `key`'s entry, if it has one.
    pub(super) fn get_mut(&mut self, key: &LockKey) -> Option<&mut Space> {
        self.shard
            .map
            .find_mut(self.hash, |s| s.key == *key)
            .map(|s| &mut s.entry)
    }

    /// `key`'s entry, made empty if it has none.
    pub(super) fn entry(&mut self, key: &LockKey) -> &mut Space {
        let slot = self
            .shard
            .map
            .entry(self.hash, |s| s.key == *key, |s| s.hash)
            .or_insert_with(|| Slot {
                hash: self.hash,
                key: key.clone(),
                entry: Space::default(),
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

impl Shard {
    /// Drop the idle entries when the map has grown past its last size twice over.
    pub(super) fn sweep(&mut self, now: Instant) {
        if self.map.len() < self.sweep_at {
            return;
        }
        self.map.retain(|s| !s.entry.idle(now));
        self.sweep_at = (self.map.len() * 2).max(64);
    }
}
