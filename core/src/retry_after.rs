//! `Retry-After` from what the layer has observed: a high percentile of its recent hold
//! times, less what the current holder has already had when it holds the key on this node,
//! bounded by the holder's remaining lease.
//!
//! The holder's remaining lease alone (30 s by default) is an upper bound that a renewed
//! holder almost never reaches: a client told to wait it out waits far too long. The hold
//! times the layer has just seen say how long a holder usually keeps a key; before it has
//! seen any (after every deploy), the layer's short fallback stands in for them, never the
//! lease, or every client that honours `Retry-After` would wait half a minute.

use std::{
    sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed},
    time::Duration,
};

use tokio::time::Instant;

use crate::engine::LockKey;

/// How many recent hold times are kept: enough for a stable 95th percentile, few enough
/// to follow a change of load within seconds on a busy layer, and cheap to sort on a
/// rejection.
const SAMPLES: usize = 128;

/// The percentile of recent hold times a contended client is told to wait.
const PERCENTILE: usize = 95;

/// A slot never written.
const EMPTY: u64 = u64::MAX;

/// The last [`SAMPLES`] hold times of a layer, in microseconds, lock-free: each release
/// overwrites the oldest slot.
pub(crate) struct RecentHolds {
    micros: [AtomicU64; SAMPLES],
    next: AtomicUsize,
}

impl Default for RecentHolds {
    fn default() -> Self {
        Self {
            micros: std::array::from_fn(|_| AtomicU64::new(EMPTY)),
            next: AtomicUsize::new(0),
        }
    }
}

impl RecentHolds {
    pub(crate) fn record(&self, held: Duration) {
        let slot = self.next.fetch_add(1, Relaxed) % SAMPLES;
        let micros = u64::try_from(held.as_micros()).unwrap_or(EMPTY - 1);
        self.micros[slot].store(micros.min(EMPTY - 1), Relaxed);
    }

    /// The [`PERCENTILE`]th percentile (nearest rank) of the recent hold times, or `None`
    /// before the first release.
    pub(crate) fn percentile(&self) -> Option<Duration> {
        let mut samples: Vec<u64> = self
            .micros
            .iter()
            .map(|m| m.load(Relaxed))
            .filter(|&m| m != EMPTY)
            .collect();
        if samples.is_empty() {
            return None;
        }
        samples.sort_unstable();
        // Nearest rank: the smallest sample with at least PERCENTILE % of them at or below it.
        let rank = (samples.len() * PERCENTILE).div_ceil(100).max(1);
        Some(Duration::from_micros(samples[rank - 1]))
    }
}

/// How many holders [`CurrentHolders`] remembers: keys whose hashes share a slot overwrite
/// each other, which only costs the later one's contenders the elapsed-time correction.
const HOLDERS: usize = 64;

/// When this node's current exclusive holders of a layer's keys began, so that a
/// contender is told what is left of a usual hold rather than a whole one. Lock-free and
/// bounded: one slot per key hash, two atomics each. A reader that races a writer may pair
/// one holder's key with another's start; the answer is then a hint off by one hold, never
/// a wrong exclusion. A holder on another node is not here: its contenders are told a
/// whole usual hold, as before.
pub(crate) struct CurrentHolders {
    keys: [AtomicU32; HOLDERS],
    since: [AtomicU64; HOLDERS],
    epoch: Instant,
}

/// A holder's place in [`CurrentHolders`] (its key's hash, never 0, which marks a free
/// slot), kept by its guard to clear it at release. Four bytes, so a guard stays small.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HolderSlot(u32);

impl Default for CurrentHolders {
    fn default() -> Self {
        Self {
            keys: std::array::from_fn(|_| AtomicU32::new(0)),
            since: std::array::from_fn(|_| AtomicU64::new(0)),
            epoch: Instant::now(),
        }
    }
}

impl CurrentHolders {
    fn hash(key: &LockKey) -> u32 {
        // Every grant hashes its key here, so a multiply per 8 bytes (FxHash's), not a
        // SipHash: keys that share a slot cost only a hint (see `HOLDERS`), so nothing is
        // gained from a keyed hash. The same on every call; never 0.
        const K: u64 = 0xf135_7aea_2e62_a9c5;
        let bytes = key.as_str().as_bytes();
        let mut chunks = bytes.chunks_exact(8);
        let mut h = bytes.len() as u64;
        for chunk in &mut chunks {
            let word = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
            h = (h.rotate_left(5) ^ word).wrapping_mul(K);
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            h = (h.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(K);
        }
        // The high half: the multiplies mix upwards.
        ((h >> 32) as u32) | 1
    }

    fn slot(hash: u32) -> usize {
        (hash >> 1) as usize % HOLDERS
    }

    /// `key`'s holder on this node began at `at`.
    pub(crate) fn began(&self, key: &LockKey, at: Instant) -> HolderSlot {
        let hash = Self::hash(key);
        let slot = Self::slot(hash);
        let micros = at.saturating_duration_since(self.epoch).as_micros();
        self.since[slot].store(u64::try_from(micros).unwrap_or(u64::MAX), Relaxed);
        self.keys[slot].store(hash, Relaxed);
        HolderSlot(hash)
    }

    /// [`began`](Self::began), unless a holder of `key` is already recorded (`None`): the
    /// first of shared holders stays the one recorded.
    pub(crate) fn began_first(&self, key: &LockKey, at: Instant) -> Option<HolderSlot> {
        let hash = Self::hash(key);
        if self.keys[Self::slot(hash)].load(Relaxed) == hash {
            return None;
        }
        Some(self.began(key, at))
    }

    /// The holder of `slot` released its key (unless another took the slot since).
    pub(crate) fn ended(&self, holder: HolderSlot) {
        let slot = Self::slot(holder.0);
        let _ = self.keys[slot].compare_exchange(holder.0, 0, Relaxed, Relaxed);
    }

    /// How long `key`'s holder on this node has held it, if one does.
    pub(crate) fn elapsed(&self, key: &LockKey) -> Option<Duration> {
        let hash = Self::hash(key);
        let slot = Self::slot(hash);
        if self.keys[slot].load(Relaxed) != hash {
            return None;
        }
        let since = self.epoch + Duration::from_micros(self.since[slot].load(Relaxed));
        Some(Instant::now().saturating_duration_since(since))
    }
}

/// The `Retry-After` of a contended request (before rounding to whole seconds, at least
/// 1): the layer's recent hold-time percentile (or `fallback` before it has observed a
/// hold) less what the holder has already held the key, when it holds it on this node
/// (`holder_elapsed`), but never more than the holder's remaining lease (the key is free
/// by then at the latest).
pub(crate) fn contended(
    observed: Option<Duration>,
    holder_elapsed: Option<Duration>,
    holder_remaining: Option<Duration>,
    fallback: Duration,
) -> Duration {
    let usual = observed.unwrap_or(fallback);
    let left = holder_elapsed.map_or(usual, |elapsed| usual.saturating_sub(elapsed));
    holder_remaining.map_or(left, |remaining| left.min(remaining))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn no_samples_no_percentile() {
        assert_eq!(RecentHolds::default().percentile(), None);
    }

    #[test]
    fn percentile_is_the_95th_by_nearest_rank_over_the_recent_samples() {
        let holds = RecentHolds::default();
        for ms in 1..=100 {
            holds.record(ms * MS);
        }
        assert_eq!(holds.percentile(), Some(95 * MS));
        // One long hold among many short ones does not set the answer.
        let holds = RecentHolds::default();
        for _ in 0..99 {
            holds.record(20 * MS);
        }
        holds.record(30_000 * MS);
        assert_eq!(holds.percentile(), Some(20 * MS));
    }

    #[test]
    fn old_samples_are_overwritten() {
        let holds = RecentHolds::default();
        for _ in 0..SAMPLES {
            holds.record(10_000 * MS);
        }
        for _ in 0..SAMPLES {
            holds.record(5 * MS);
        }
        assert_eq!(holds.percentile(), Some(5 * MS));
    }

    #[test]
    fn contended_retry_is_the_observed_percentile_or_the_fallback_bounded_by_the_remaining_lease() {
        let s = Duration::from_secs;
        assert_eq!(contended(Some(s(2)), None, Some(s(29)), s(1)), s(2));
        assert_eq!(contended(Some(s(8)), None, Some(s(3)), s(1)), s(3));
        assert_eq!(contended(None, None, Some(s(29)), s(1)), s(1));
        assert_eq!(contended(None, None, Some(s(3)), s(5)), s(3));
        assert_eq!(contended(Some(s(2)), None, None, s(1)), s(2));
        assert_eq!(contended(None, None, None, s(1)), s(1));
    }

    #[test]
    fn contended_retry_subtracts_what_the_holder_already_had() {
        let s = Duration::from_secs;
        assert_eq!(contended(Some(s(5)), Some(s(3)), Some(s(29)), s(1)), s(2));
        assert_eq!(contended(None, Some(s(3)), None, s(5)), s(2));
        // A holder past the usual hold: nothing left to wait, by this estimate.
        assert_eq!(
            contended(Some(s(5)), Some(s(9)), None, s(1)),
            Duration::ZERO
        );
    }

    #[tokio::test(start_paused = true)]
    async fn current_holders_say_how_long_a_key_has_been_held_here() {
        let holders = CurrentHolders::default();
        let (a, b) = (LockKey::new("a").unwrap(), LockKey::new("b").unwrap());
        let slot = holders.began(&a, Instant::now());
        tokio::time::advance(Duration::from_millis(1500)).await;
        assert_eq!(holders.elapsed(&a), Some(Duration::from_millis(1500)));
        assert_eq!(holders.elapsed(&b), None);
        holders.ended(slot);
        assert_eq!(holders.elapsed(&a), None);
    }
}
