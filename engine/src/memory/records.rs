//! The in-process backend's records ([`RecordBackend`]): a map with per-record expiry and
//! a byte budget, evicting the oldest completed records first when it is exceeded (each
//! leaving a tombstone), and tombstones only when nothing else is left.
//!
//! Each record is one allocation (a `Slot`: its key, fingerprint, metadata, body and
//! bookkeeping, copied in), referenced from the map and from its queue: the map then holds
//! no key of its own, and a record costs what the budget charges for it (see `charge`).

use std::{collections::HashSet, time::Duration};

use tokio::time::Instant;

use self::{
    queue::Queue,
    slot::{HEADER, Parts, Slot, charge},
};
use super::MemoryBackend;
use crate::{
    AcquireRequest, Backend, BoxFuture, GrantOrRecord, LockError, LockKey, Mode, Record,
    RecordBackend, Token, options::after, unix_millis,
};

mod queue;
mod slot;

/// The default byte budget of an in-process record store: 64 MiB.
pub(super) const DEFAULT_BUDGET: usize = 64 << 20;

pub(super) struct RecordStore {
    map: HashSet<Slot>,
    /// Kept records, oldest first: eviction takes the front, and leaves its tombstone.
    kept: Queue,
    /// Tombstones, oldest first: dropped only when no kept record is left to evict.
    tombstones: Queue,
    /// What the slots are charged, in all.
    bytes: usize,
    budget: usize,
    /// Expiries are kept as nanoseconds since this instant.
    base: Instant,
    /// Where slots are built before they are copied into their allocation.
    scratch: Vec<u8>,
    /// Records whose output was dropped before their retention ran out (evicted, or
    /// larger than the whole budget): each left a tombstone.
    pub(super) evicted: u64,
    /// Tombstones dropped before their retention ran out, to make room for others: a
    /// retry of those operations finds nothing.
    pub(super) evicted_tombstones: u64,
    /// Sweep expired records when the map grows past this size.
    sweep_at: usize,
}

impl RecordStore {
    pub(super) fn new(budget: usize) -> Self {
        Self {
            map: HashSet::new(),
            kept: Queue::default(),
            tombstones: Queue::default(),
            bytes: 0,
            budget,
            base: Instant::now(),
            scratch: Vec::new(),
            evicted: 0,
            evicted_tombstones: 0,
            sweep_at: 64,
        }
    }

    /// `at` as nanoseconds since `base` (0 before it; the far future saturates).
    fn offset(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    fn queue(&mut self, kept: bool) -> &mut Queue {
        if kept {
            &mut self.kept
        } else {
            &mut self.tombstones
        }
    }

    /// Take `slot` out of the map, its queue and the byte count.
    fn unlink(&mut self, slot: &Slot) {
        self.map.remove(slot.key());
        self.queue(slot.kept()).remove(slot.seq());
        self.bytes -= slot.charge();
    }

    fn remove(&mut self, key: &LockKey) -> Option<Slot> {
        let slot = self.map.get(key.as_str().as_bytes())?.clone();
        self.unlink(&slot);
        Some(slot)
    }

    pub(super) fn get(&mut self, key: &LockKey, now: Instant) -> Option<Record> {
        let now = self.offset(now);
        let slot = self.map.get(key.as_str().as_bytes())?;
        if slot.expires() > now {
            return Some(slot.record());
        }
        let slot = slot.clone();
        self.unlink(&slot);
        None
    }

    /// How long the record or tombstone under `key` lives on, if there is one.
    pub(super) fn expiry(&self, key: &LockKey, now: Instant) -> Option<Duration> {
        let now = self.offset(now);
        let slot = self.map.get(key.as_str().as_bytes())?;
        let left = slot.expires().checked_sub(now).filter(|&n| n > 0)?;
        Some(Duration::from_nanos(left))
    }

    /// Remove the record or tombstone under `key`; whether one was there (within its
    /// retention).
    pub(super) fn forget(&mut self, key: &LockKey, now: Instant) -> bool {
        let now = self.offset(now);
        self.remove(key).is_some_and(|s| s.expires() > now)
    }

    pub(super) fn insert(
        &mut self,
        key: &LockKey,
        record: &Record,
        expires: Instant,
        now: Instant,
    ) {
        self.remove(key);
        self.sweep(now);
        let (expires, now) = (self.offset(expires), self.offset(now));
        let mut parts = Parts {
            key: key.as_str().as_bytes(),
            fingerprint: &record.fingerprint,
            meta: &record.meta,
            body: &record.body,
            kept: record.kept,
            completed_at: unix_millis(record.completed_at),
            expires,
            seq: 0,
        };
        if !parts.kept {
            // Handed a tombstone: keep nothing of its output, whatever it carries.
            (parts.meta, parts.body) = (&[], &[]);
        }
        let tombstone = charge(HEADER + parts.key.len() + parts.fingerprint.len());
        let mut size = tombstone;
        if parts.kept {
            let whole = charge(
                HEADER
                    + parts.key.len()
                    + parts.fingerprint.len()
                    + parts.meta.len()
                    + parts.body.len(),
            );
            if whole > self.budget {
                // Could never fit: kept as a tombstone at once, evicting nothing for it.
                (parts.kept, parts.meta, parts.body) = (false, &[], &[]);
                self.evicted += 1;
            } else {
                size = whole;
            }
        }
        // Room is made by evicting the oldest kept records (each leaves its tombstone);
        // when none is left, this record is kept as a tombstone itself; only then do the
        // oldest tombstones go.
        while self.bytes + size > self.budget {
            if let Some(oldest) = self.kept.front().cloned() {
                self.evict(&oldest, now);
            } else if parts.kept {
                (parts.kept, parts.meta, parts.body) = (false, &[], &[]);
                size = tombstone;
                self.evicted += 1;
            } else if let Some(oldest) = self.tombstones.front().cloned() {
                self.unlink(&oldest);
                if oldest.expires() > now {
                    self.evicted_tombstones += 1;
                }
            } else {
                // Not even its tombstone fits in the budget.
                self.evicted_tombstones += 1;
                return;
            }
        }
        self.place(parts);
    }

    /// Replace the kept record `oldest` with its tombstone, or drop it if its retention
    /// has run out.
    fn evict(&mut self, oldest: &Slot, now: u64) {
        self.unlink(oldest);
        if oldest.expires() <= now {
            return;
        }
        self.evicted += 1;
        self.place(Parts {
            key: oldest.key(),
            fingerprint: &oldest.0[oldest.fingerprint_range()],
            meta: &[],
            body: &[],
            kept: false,
            completed_at: oldest.completed_at(),
            expires: oldest.expires(),
            seq: 0,
        });
    }

    /// Make the slot of `parts` (at the back of its queue) and keep it.
    fn place(&mut self, mut parts: Parts<'_>) {
        parts.seq = self.queue(parts.kept).next();
        let Some(slot) = Slot::new(&parts, &mut self.scratch) else {
            // A fingerprint or metadata of 4 GiB or more: nothing of it is kept.
            self.evicted_tombstones += 1;
            return;
        };
        self.bytes += slot.charge();
        self.queue(slot.kept()).push(slot.clone());
        self.map.insert(slot);
    }

    fn sweep(&mut self, now: Instant) {
        let now = self.offset(now);
        // With one retention for every record (the usual case) the oldest expire first:
        // taken from the fronts at once.
        for kept in [true, false] {
            while let Some(front) = self.queue(kept).front()
                && front.expires() <= now
            {
                let front = front.clone();
                self.unlink(&front);
            }
        }
        // Records of mixed retentions: a scan, amortized over the map's growth.
        if self.map.len() < self.sweep_at {
            return;
        }
        let expired: Vec<Slot> = self
            .map
            .iter()
            .filter(|s| s.expires() <= now)
            .cloned()
            .collect();
        for slot in &expired {
            self.unlink(slot);
        }
        self.sweep_at = (self.map.len() * 2).max(64);
        if self.map.capacity() > 64 && self.map.len() < self.map.capacity() / 8 {
            // Give memory back after a burst.
            self.map.shrink_to(self.map.len() * 2);
        }
    }

    /// What the records and tombstones kept now are charged against the budget.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
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

    fn record_expiry<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<Duration>, LockError>> {
        Box::pin(async move { Ok(self.records.lock().unwrap().expiry(key, Instant::now())) })
    }

    fn acquire_or_record(
        &self,
        req: AcquireRequest,
    ) -> BoxFuture<'_, Result<GrantOrRecord, LockError>> {
        Box::pin(async move {
            if req.mode.is_shared() {
                // Records live beside the key's lock.
                return Err(LockError::Unsupported("records of shared leases"));
            }
            let stored = self.records.lock().unwrap().get(&req.key, Instant::now());
            if let Some(record) = stored {
                return Ok(GrantOrRecord::Record(record));
            }
            let (key, token) = (req.key.clone(), req.token.clone());
            let grant = Backend::acquire(self, req).await?;
            // A record appears only with the release of the holder that wrote it, in the
            // same step: a completion between the look above and this grant (the key was
            // held, and handed to us) is seen now.
            let stored = self.records.lock().unwrap().get(&key, Instant::now());
            match stored {
                None => Ok(GrantOrRecord::Grant(grant)),
                Some(record) => {
                    let _ = Backend::release(self, &key, &token, Mode::Exclusive).await;
                    Ok(GrantOrRecord::Record(record))
                }
            }
        })
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
                    .insert(key, record, expires, now);
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
        // Three records of 100 bytes of body fit, with room for one tombstone; four do not.
        let (rec, tomb) = (charge(HEADER + 1 + 2 + 100), charge(HEADER + 1 + 2));
        let mut store = RecordStore::new(3 * rec + tomb);
        for k in ["a", "b", "c"] {
            store.insert(&key(k), &record(100), later, now);
        }
        assert_eq!(store.live(now), 3);
        store.insert(&key("d"), &record(100), later, now);
        assert!(
            !store.get(&key("a"), now).unwrap().kept,
            "the oldest went first"
        );
        for k in ["b", "c", "d"] {
            assert!(store.get(&key(k), now).is_some(), "{k}");
        }
        assert_eq!(store.evicted, 1);
        // Replacing a record frees its old bytes rather than evicting another.
        store.insert(&key("b"), &record(100), later, now);
        assert_eq!(store.evicted, 1);
        // Expired records make room without counting as evicted.
        let much_later = later + Duration::from_secs(1);
        store.insert(
            &key("e"),
            &record(100),
            much_later + Duration::from_secs(60),
            much_later,
        );
        assert_eq!(store.evicted, 1);
        // A record larger than the whole budget is not kept: only its tombstone is (the
        // expired records went at the last insert, so it fits without evicting another).
        store.insert(&key("huge"), &record(1000), later, now);
        assert!(!store.get(&key("huge"), now).unwrap().kept);
        assert_eq!(store.evicted, 2);
        assert_eq!(store.bytes(), rec + charge(HEADER + 4 + 2));
    }

    #[test]
    fn an_evicted_or_oversized_record_leaves_a_tombstone_for_its_retention() {
        let now = Instant::now();
        let later = now + Duration::from_secs(60);
        let key = |s: &str| LockKey::new(s).unwrap();
        let mut store = RecordStore::new(4096);
        store.insert(&key("first"), &record(1000), later, now);
        // Enough later records to push the first out of the budget.
        for i in 0..8 {
            store.insert(&key(&format!("other-{i}")), &record(1000), later, now);
        }
        assert!(store.evicted >= 1);
        let first = store
            .get(&key("first"), now)
            .expect("an evicted record leaves a tombstone");
        assert_eq!(first.fingerprint, Bytes::from_static(b"fp"));
        assert!(!first.kept && first.body.is_empty() && first.meta.is_empty());
        assert_eq!(store.evicted_tombstones, 0, "tombstones go last");
        // A record larger than the whole budget is kept as a tombstone at once.
        store.insert(&key("huge"), &record(10_000), later, now);
        let huge = store
            .get(&key("huge"), now)
            .expect("an oversized record leaves a tombstone");
        assert!(!huge.kept && huge.body.is_empty());
        // Tombstones last for the record's retention, not longer.
        assert!(store.get(&key("huge"), later).is_none());
    }

    #[test]
    fn tombstones_are_dropped_oldest_first_only_when_no_kept_record_is_left() {
        let now = Instant::now();
        let later = now + Duration::from_secs(60);
        let key = |s: &str| LockKey::new(s).unwrap();
        // Room for three tombstones of one-byte keys, not four.
        let tomb = charge(HEADER + 1 + 2);
        let mut store = RecordStore::new(3 * tomb + tomb / 2);
        for k in ["a", "b", "c"] {
            store.insert(&key(k), &record(10_000), later, now);
        }
        assert_eq!((store.evicted, store.evicted_tombstones), (3, 0));
        store.insert(&key("d"), &record(10_000), later, now);
        assert_eq!(store.evicted_tombstones, 1);
        assert!(
            store.get(&key("a"), now).is_none(),
            "the oldest tombstone went"
        );
        for k in ["b", "c", "d"] {
            assert!(!store.get(&key(k), now).unwrap().kept, "{k}");
        }
        // Forgetting frees a tombstone's bytes.
        assert!(store.forget(&key("b"), now));
        assert!(!store.forget(&key("b"), now));
        assert_eq!(store.bytes(), 2 * tomb);
    }

    #[test]
    fn a_record_reads_back_byte_for_byte_from_its_one_allocation() {
        let now = Instant::now();
        let key = LockKey::new("k").unwrap();
        let mut store = RecordStore::new(DEFAULT_BUDGET);
        let written = Record::new(
            Bytes::from_static(b"fingerprint"),
            Bytes::from_static(b"\x00meta\xff"),
            Bytes::from_static(b"body"),
        );
        store.insert(&key, &written, now + Duration::from_secs(1), now);
        assert_eq!(store.get(&key, now), Some(written.clone()));
        assert_eq!(store.bytes(), charge(HEADER + 1 + 11 + 6 + 4));
        assert_eq!(store.live(now), 1);
        assert_eq!(store.live(now + Duration::from_secs(1)), 0, "expired");
        assert_eq!(store.bytes(), 0);
    }
}
