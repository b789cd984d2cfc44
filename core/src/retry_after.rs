//! `Retry-After` from what the layer has observed: a high percentile of its recent hold
//! times, bounded by the holder's remaining lease.
//!
//! The holder's remaining lease alone (30 s by default) is an upper bound that a renewed
//! holder almost never reaches: a client told to wait it out waits far too long. The hold
//! times the layer has just seen say how long a holder usually keeps a key; before it has
//! seen any (after every deploy), the layer's short fallback stands in for them, never the
//! lease, or every client that honours `Retry-After` would wait half a minute.

use std::{
    sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed},
    time::Duration,
};

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

/// The `Retry-After` of a contended request (before rounding up to whole seconds, at
/// least 1): the layer's recent hold-time percentile, or `fallback` before it has observed
/// a hold, but never more than the holder's remaining lease (the key is free by then at
/// the latest).
pub(crate) fn contended(
    observed: Option<Duration>,
    holder_remaining: Option<Duration>,
    fallback: Duration,
) -> Duration {
    let expected = observed.unwrap_or(fallback);
    holder_remaining.map_or(expected, |remaining| expected.min(remaining))
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
        assert_eq!(contended(Some(s(2)), Some(s(29)), s(1)), s(2));
        assert_eq!(contended(Some(s(8)), Some(s(3)), s(1)), s(3));
        assert_eq!(contended(None, Some(s(29)), s(1)), s(1));
        assert_eq!(contended(None, Some(s(3)), s(5)), s(3));
        assert_eq!(contended(Some(s(2)), None, s(1)), s(2));
        assert_eq!(contended(None, None, s(1)), s(1));
    }
}
