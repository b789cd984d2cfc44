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
    /// Insertion order (sequence number → key): eviction takes the oldest first.
    order: BTreeMap<u64, LockKey>,
    next_seq: u64,
    bytes: usize,
    budget: usize,
    /// Records removed to stay within the budget before their retention ran out.
    pub(super) evicted: u64,
    /// Sweep expired records when the map grows past this size.
    sweep_at: usize,
}

struct Stored {
    record: Record,
    expires: Instant,
    seq: u64,
    size: usize,
}

impl RecordStore {
    pub(super) fn new(budget: usize) -> Self {
        RecordStore {
            map: HashMap::new(),
            order: BTreeMap::new(),
            next_seq: 0,
            bytes: 0,
            budget,
            evicted: 0,
            sweep_at: 64,
        }
    }

    fn remove(&mut self, key: &LockKey) -> Option<Stored> {
        let stored = self.map.remove(key)?;
        self.order.remove(&stored.seq);
        self.bytes -= stored.size;
        Some(stored)
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

    pub(super) fn insert(&mut self, key: &LockKey, record: Record, expires: Instant, now: Instant) {
        self.remove(key);
        self.sweep(now);
        let size = key.as_str().len() + record.size();
        if size > self.budget {
            // Could never fit: counted as evicted at once (the retry is told it was not
            // kept, exactly as after a later eviction).
            self.evicted += 1;
            return;
        }
        while self.bytes + size > self.budget {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            if let Some(s) = self.map.remove(&oldest) {
                self.bytes -= s.size;
                if s.expires > now {
                    self.evicted += 1;
                }
            }
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.order.insert(seq, key.clone());
        self.bytes += size;
        self.map.insert(
            key.clone(),
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

    /// Records within their retention.
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
        assert!(store.get(&key("a"), now).is_none(), "the oldest went first");
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
        // A record larger than the whole budget is not kept.
        store.insert(&key("huge"), record(1000), later, now);
        assert!(store.get(&key("huge"), now).is_none());
        assert_eq!(store.evicted, 2);
    }
}
