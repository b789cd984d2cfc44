//! The wait and hold histograms: Prometheus bucket bounds in seconds, and a [`Histogram`]
//! kept in atomics.

use std::{
    sync::atomic::{AtomicU64, Ordering::Relaxed},
    time::Duration,
};

use super::HistogramSnapshot;

/// Upper bounds of the wait and hold histograms' buckets, in seconds (Prometheus `le`
/// values; a last `+Inf` bucket counts every sample).
pub const BUCKET_BOUNDS_SECONDS: [f64; 12] = [
    0.001, 0.005, 0.010, 0.025, 0.050, 0.100, 0.250, 0.500, 1.0, 2.5, 5.0, 10.0,
];

/// [`BUCKET_BOUNDS_SECONDS`] as durations, compared with the exact sample (never a
/// rounded one: 1.9 ms is above the 1 ms bound).
const BOUNDS: [Duration; 12] = [
    Duration::from_millis(1),
    Duration::from_millis(5),
    Duration::from_millis(10),
    Duration::from_millis(25),
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_millis(2_500),
    Duration::from_secs(5),
    Duration::from_secs(10),
];

/// The buckets of a histogram: one per bound, and `+Inf`.
pub(super) const BUCKETS: usize = BOUNDS.len() + 1;

/// A histogram of durations in atomics: one add per sample.
#[derive(Default)]
pub(super) struct Histogram {
    /// Samples per bucket (not cumulative: one add per sample); the snapshot sums them.
    buckets: [AtomicU64; BUCKETS],
    sum_micros: AtomicU64,
}

impl Histogram {
    pub(super) fn record(&self, d: Duration) {
        let i = BOUNDS
            .iter()
            .position(|&bound| d <= bound)
            .unwrap_or(BUCKETS - 1);
        self.buckets[i].fetch_add(1, Relaxed);
        self.sum_micros
            .fetch_add(u64::try_from(d.as_micros()).unwrap_or(u64::MAX), Relaxed);
    }

    pub(super) fn snapshot(&self) -> HistogramSnapshot {
        let mut running = 0;
        let buckets = std::array::from_fn(|i| {
            running += self.buckets[i].load(Relaxed);
            running
        });
        HistogramSnapshot {
            buckets,
            count: running,
            sum: Duration::from_micros(self.sum_micros.load(Relaxed)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn bounds_in_seconds_and_as_durations_agree() {
        for (secs, d) in BUCKET_BOUNDS_SECONDS.iter().zip(BOUNDS) {
            assert_eq!(*secs, d.as_secs_f64());
        }
    }

    #[test]
    fn buckets_are_cumulative_and_a_sample_never_rounds_down_into_a_bucket() {
        let h = Histogram::default();
        h.record(Duration::from_micros(500));
        h.record(MS); // on the bound: in it
        h.record(Duration::from_micros(1_900)); // above 1 ms: not in the 1 ms bucket
        h.record(Duration::from_micros(5_001));
        h.record(Duration::from_secs(60));
        let s = h.snapshot();
        assert_eq!(s.buckets[0], 2, "<= 1 ms");
        assert_eq!(s.buckets[1], 3, "<= 5 ms");
        assert_eq!(s.buckets[2], 4, "<= 10 ms");
        assert_eq!(s.buckets[BUCKETS - 2], 4, "<= 10 s");
        assert_eq!(s.buckets[BUCKETS - 1], 5, "+Inf");
        assert_eq!(s.count, 5);
    }
}
