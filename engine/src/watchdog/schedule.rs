//! [`WatchState`]: the watchdog's schedule of live leases (a map by id, an ordered set by
//! due instant, the list of leases not yet filed) and the spare states it reuses.

use std::{
    collections::{BTreeSet, HashMap},
    hash::{BuildHasherDefault, Hasher},
    sync::{Arc, atomic::Ordering},
};

use tokio::time::Instant;

use crate::lease::LeaseState;

#[derive(Default)]
pub(super) struct WatchState {
    /// Every registered lease, with the instant it is filed under in `queue`.
    pub(super) leases: HashMap<u64, (Arc<LeaseState>, Instant), BuildHasherDefault<IdHasher>>,
    pub(super) queue: BTreeSet<(Instant, u64)>,
    /// Leases registered and not yet filed (with their ids), filed by `incoming_due`.
    pub(super) incoming: Vec<(Arc<LeaseState>, u64)>,
    /// No incoming lease is due before this instant (`None`: the list is empty).
    pub(super) incoming_due: Option<Instant>,
    /// The list's length at which registering compacts it (drops the released leases),
    /// so that it holds at most about twice the live ones.
    pub(super) compact_at: usize,
    /// States of released leases that nothing refers to any more, for new leases to
    /// reuse (at most [`MAX_SPARE`]): a short-lived lease then allocates nothing.
    pub(super) spare: Vec<Arc<LeaseState>>,
    pub(super) next_id: u64,
    pub(super) started: bool,
    /// When the task will next look by itself (`None`: it waits for a registration).
    pub(super) scheduled: Option<Instant>,
}

/// Hashes the watchdog's own lease ids, which count up from 0 and never come from outside
/// the engine: one multiply (a SipHash of each id on every grant and release was a
/// measurable part of an in-process request).
#[derive(Default)]
pub(super) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u64(&mut self, id: u64) {
        // Golden-ratio multiply: consecutive ids spread over every bit, the top ones too.
        self.0 = id.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl WatchState {
    /// File lease `id` under `at`, replacing where it was filed. Returns whether the task
    /// must be woken to look earlier than it planned.
    pub(super) fn file(&mut self, id: u64, at: Instant) -> bool {
        let Some((_, filed)) = self.leases.get_mut(&id) else {
            return false;
        };
        let old = std::mem::replace(filed, at);
        self.queue.remove(&(old, id));
        self.queue.insert((at, id));
        self.scheduled.is_none_or(|s| at < s)
    }

    pub(super) fn remove(&mut self, id: u64) {
        if let Some((_, at)) = self.leases.remove(&id) {
            self.queue.remove(&(at, id));
        }
    }

    /// File every incoming lease that is still live under the instant it is due.
    pub(super) fn file_incoming(&mut self) {
        self.incoming_due = None;
        let mut incoming = std::mem::take(&mut self.incoming);
        for (lease, id) in incoming.drain(..) {
            // Said filed before its release is read: a lease released meanwhile either is
            // seen released here, or sees itself filed and unregisters (after this lock).
            lease.filed.store(true, Ordering::SeqCst);
            if lease.released.load(Ordering::SeqCst) || lease.lost.set.load(Ordering::Acquire) {
                keep_spare(&mut self.spare, lease);
                continue;
            }
            let due = lease.times.lock().unwrap().due();
            self.queue.insert((due, id));
            self.leases.insert(id, (lease, due));
        }
        // The list's room is kept for the next leases.
        self.incoming = incoming;
    }

    /// Drop the released and lost leases from the incoming list.
    pub(super) fn compact_incoming(&mut self) {
        let done = |(lease, _): &mut (Arc<LeaseState>, u64)| {
            lease.released.load(Ordering::SeqCst) || lease.lost.set.load(Ordering::Acquire)
        };
        for (lease, _) in self.incoming.extract_if(.., done) {
            keep_spare(&mut self.spare, lease);
        }
        self.compact_at = (2 * self.incoming.len()).max(MIN_COMPACT_AT);
    }

    /// Put `lease` (registered as `id`, due at `due`) on the incoming list, and say
    /// whether the task must be woken to look by `due`.
    pub(super) fn add(&mut self, lease: Arc<LeaseState>, id: u64, due: Instant) -> bool {
        if self.incoming.len() >= self.compact_at {
            self.compact_incoming();
        }
        self.incoming.push((lease, id));
        if self.incoming_due.is_none_or(|d| due < d) {
            self.incoming_due = Some(due);
        }
        self.scheduled.is_none_or(|s| due < s)
    }
}

/// Keep a finished lease's state for a new lease if nothing else refers to it (and room).
pub(super) fn keep_spare(spare: &mut Vec<Arc<LeaseState>>, mut lease: Arc<LeaseState>) {
    if spare.len() < MAX_SPARE && Arc::get_mut(&mut lease).is_some() {
        spare.push(lease);
    }
}

/// How many states of finished leases the watchdog keeps for reuse.
pub(super) const MAX_SPARE: usize = 64;

/// The smallest length of the incoming list at which registering compacts it.
pub(super) const MIN_COMPACT_AT: usize = 64;
