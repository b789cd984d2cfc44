//! The in-process backend's records ([`RecordBackend`]): a map with per-record expiry and
//! a byte budget, evicting the oldest completed records first when it is exceeded.

use std::{
    collections::{BTreeMap, HashMap},
    time::Duration,
};

use tokio::time::Instant;

use super::MemoryBackend;
use crate::engine::{BoxFuture, LockError, LockKey, Record, RecordBackend, Token, options::after};

/// The default byte budget of an in-process record store: 64 MiB.
pub(super) const DEFAULT_BUDGET: usize = 64 << 20;

pub(super) struct RecordStore {
    map: HashMap<LockKey, Stored>,
    /// Kept records in insertion order (sequence number → key): eviction takes the oldest
    /// first, and leaves its tombstone.
    order: BTreeMap<u64, LockKey>,
    /// Tombstones in the order they were made: dropped, oldest first, only when no kept
    /// record is left to evict.
    tombstones: BTreeMap<u64, LockKey>,
    next_seq: u64,
    bytes: usize,
    budget: usize,
    /// Records whose output was dropped before their retention ran out (evicted, or
    /// larger than the whole budget): each left a tombstone.
    pub(super) evicted: u64,
    /// Tombstones dropped before their retention ran out, to make room for others: a
    /// retry of those operations finds nothing.
    pub(super) evicted_tombstones: u64,
    /// Sweep expired records when the map grows past this size.
    sweep_at: usize,
}

struct Stored {
    record: Record,
    expires: Instant,
    seq: u64,
    size: usize,
}

/// What `record` under `key` is charged against the budget.
fn charge(key: &LockKey, record: &Record) -> usize {
    key.as_str().len() + record.size()
}

impl RecordStore {
    pub(super) fn new(budget: usize) -> Self {
        RecordStore {
            map: HashMap::new(),
            order: BTreeMap::new(),
            tombstones: BTreeMap::new(),
            next_seq: 0,
            bytes: 0,
            budget,
            evicted: 0,
            evicted_tombstones: 0,
            sweep_at: 64,
        }
    }

    fn remove(&mut self, key: &LockKey) -> Option<Stored> {
        let stored = self.map.remove(key)?;
        self.unlink(&stored);
        Some(stored)
    }

    /// Take `stored` (already out of the map) out of its order and the byte count.
    fn unlink(&mut self, stored: &Stored) {
        if stored.record.kept {
            self.order.remove(&stored.seq);
        } else {
            self.tombstones.remove(&stored.seq);
        }
        self.bytes -= stored.size;
    }

    pub(super) fn get(&mut self, key: &LockKey, now: Instant) -> Option<Record> {
        match self.map.get(key) {
            Some(s) if s.expires > now => Some(s.record.clone()),
            Some(_) => {
                self.remove(key);
                None
            }
            None => None,
        }
    }

    /// Remove the record or tombstone under `key`; whether one was there (within its
    /// retention).
    pub(super) fn forget(&mut self, key: &LockKey, now: Instant) -> bool {
        self.remove(key).is_some_and(|s| s.expires > now)
    }

    pub(super) fn insert(
        &mut self,
        key: &LockKey,
        mut record: Record,
        expires: Instant,
        now: Instant,
    ) {
        self.remove(key);
        self.sweep(now);
        if !record.kept {
            // Handed a tombstone: keep nothing of its output, whatever it carries.
            record = record.to_tombstone();
        }
        let mut size = charge(key, &record);
        if record.kept && size > self.budget {
            // Could never fit: kept as a tombstone at once, evicting nothing for it.
            record = record.to_tombstone();
            size = charge(key, &record);
            self.evicted += 1;
        }
        // Room is made by evicting the oldest kept records (each leaves its tombstone);
        // when none is left, this record is kept as a tombstone itself; only then do the
        // oldest tombstones go.
        while self.bytes + size > self.budget {
            if let Some((_, oldest)) = self.order.pop_first() {
                self.evict(oldest, now);
            } else if record.kept {
                record = record.to_tombstone();
                size = charge(key, &record);
                self.evicted += 1;
            } else if let Some((_, oldest)) = self.tombstones.pop_first() {
                if let Some(s) = self.map.remove(&oldest) {
                    self.bytes -= s.size;
                    if s.expires > now {
                        self.evicted_tombstones += 1;
                    }
                }
            } else {
                // Not even its tombstone fits in the budget.
                self.evicted_tombstones += 1;
                return;
            }
        }
        self.place(key.clone(), record, expires, size);
    }

    /// Replace the kept record under `oldest` (already out of the order) with its
    /// tombstone, or drop it if its retention has run out.
    fn evict(&mut self, oldest: LockKey, now: Instant) {
        let Some(s) = self.map.remove(&oldest) else {
            return;
        };
        self.bytes -= s.size;
        if s.expires <= now {
            return;
        }
        self.evicted += 1;
        let tombstone = s.record.to_tombstone();
        let size = charge(&oldest, &tombstone);
        self.place(oldest, tombstone, s.expires, size);
    }

    fn place(&mut self, key: LockKey, record: Record, expires: Instant, size: usize) {
        let seq = self.next_seq;
        self.next_seq += 1;
        if record.kept {
            self.order.insert(seq, key.clone());
        } else {
            self.tombstones.insert(seq, key.clone());
        }
        self.bytes += size;
        self.map.insert(
            key,
            Stored {
                record,
                expires,
                seq,
                size,
            },
        );
    }

    fn sweep(&mut self, now: Instant) {
        if self.map.len() < self.sweep_at {
            return;
        }
        let expired: Vec<LockKey> = self
            .map
            .iter()
            .filter(|(_, s)| s.expires <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for key in expired {
            self.remove(&key);
        }
        self.sweep_at = (self.map.len() * 2).max(64);
    }

    /// Records and tombstones within their retention.
    pub(super) fn live(&mut self, now: Instant) -> usize {
        self.sweep_at = 0;
        self.sweep(now);
        self.map.len()
    }
}

impl RecordBackend for MemoryBackend {
    fn record<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<Option<Record>, LockError>> {
        Box::pin(async move { Ok(self.records.lock().unwrap().get(key, Instant::now())) })
    }

    fn forget<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<bool, LockError>> {
        // The record store only: the key's lock lives in its shard, untouched.
        Box::pin(async move { Ok(self.records.lock().unwrap().forget(key, Instant::now())) })
    }

    fn complete<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        record: &'a Record,
        retention: Duration,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(async move {
            // The shard lock is held from the ownership check to the hand-off, and the
            // record is in place before it is released: whoever is granted the key next
            // (a waiter here, or a new caller taking the shard lock) finds the record.
            self.release_then(key, token, |now| {
                let expires = after(now, retention);
                self.records
                    .lock()
                    .unwrap()
                    .insert(key, record.clone(), expires, now);
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn record(body: usize) -> Record {
        Record::new(
            Bytes::from_static(b"fp"),
            Bytes::new(),
            Bytes::from(vec![b'x'; body]),
        )
    }

    #[test]
    fn the_budget_evicts_the_oldest_completed_records_first() {
        let now = Instant::now();
        let later = now + Duration::from_secs(60);
        let key = |s: &str| LockKey::new(s).unwrap();
        // Each record takes 100 bytes of body plus a little: three fit in 350, four do not.
        let mut store = RecordStore::new(350);
        for k in ["a", "b", "c"] {
            store.insert(&key(k), record(100), later, now);
        }
        assert_eq!(store.live(now), 3);
        store.insert(&key("d"), record(100), later, now);
        assert!(
            !store.get(&key("a"), now).unwrap().kept,
            "the oldest went first"
        );
        for k in ["b", "c", "d"] {
            assert!(store.get(&key(k), now).is_some(), "{k}");
        }
        assert_eq!(store.evicted, 1);
        // Replacing a record frees its old bytes rather than evicting another.
        store.insert(&key("b"), record(100), later, now);
        assert_eq!(store.evicted, 1);
        // Expired records make room without counting as evicted.
        let much_later = later + Duration::from_secs(1);
        store.insert(
            &key("e"),
            record(100),
            much_later + Duration::from_secs(60),
            much_later,
        );
        assert_eq!(store.evicted, 1);
        // A record larger than the whole budget is not kept: only its tombstone is, and
        // the room the tombstone needs is made as for any record (the oldest kept one).
        store.insert(&key("huge"), record(1000), later, now);
        assert!(!store.get(&key("huge"), now).unwrap().kept);
        assert_eq!(store.evicted, 3);
    }

    #[test]
    fn an_evicted_or_oversized_record_leaves_a_tombstone_for_its_retention() {
        let now = Instant::now();
        let later = now + Duration::from_secs(60);
        let key = |s: &str| LockKey::new(s).unwrap();
        let mut store = RecordStore::new(4096);
        store.insert(&key("first"), record(1000), later, now);
        // Enough later records to push the first out of the budget.
        for i in 0..8 {
            store.insert(&key(&format!("other-{i}")), record(1000), later, now);
        }
        assert!(store.evicted >= 1);
        let first = store
            .get(&key("first"), now)
            .expect("an evicted record leaves a tombstone");
        assert_eq!(first.fingerprint, Bytes::from_static(b"fp"));
        assert!(!first.kept && first.body.is_empty() && first.meta.is_empty());
        assert_eq!(store.evicted_tombstones, 0, "tombstones go last");
        // A record larger than the whole budget is kept as a tombstone at once.
        store.insert(&key("huge"), record(10_000), later, now);
        let huge = store
            .get(&key("huge"), now)
            .expect("an oversized record leaves a tombstone");
        assert!(!huge.kept && huge.body.is_empty());
        // Tombstones last for the record's retention, not longer.
        assert!(store.get(&key("huge"), later).is_none());
    }
}
