//! Counters and histograms of a lock layer, exportable to any metrics system.
//!
//! [`LockMetrics`] is a cheap handle on atomic counters; [`LockMetrics::snapshot`] reads
//! them all. Histograms have fixed bucket bounds ([`BUCKET_BOUNDS_MS`]) so a snapshot maps
//! directly onto a Prometheus or OpenTelemetry histogram, without a metrics dependency here.
//!
//! ```
//! # fn demo(layer: tower_lock::LockLayer) {
//! let metrics = layer.metrics();
//! let snap = metrics.snapshot();
//! println!("acquired {} / rejected {}", snap.acquired, snap.rejected.total());
//! println!("wait-time buckets: {:?} (bounds {:?} ms)", snap.wait.buckets, tower_lock::metrics::BUCKET_BOUNDS_MS);
//! # }
//! ```

use std::{
    fmt,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
    time::Duration,
};

use crate::reject::RejectionKind;

/// Upper bounds of the histogram buckets, in milliseconds; a last bucket counts the rest.
pub const BUCKET_BOUNDS_MS: [u64; 12] =
    [1, 5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000];

const BUCKETS: usize = BUCKET_BOUNDS_MS.len() + 1;

#[derive(Default)]
struct Histogram {
    buckets: [AtomicU64; BUCKETS],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    fn record(&self, d: Duration) {
        let ms = d.as_millis();
        let i = BUCKET_BOUNDS_MS
            .iter()
            .position(|&b| ms <= u128::from(b))
            .unwrap_or(BUCKETS - 1);
        self.buckets[i].fetch_add(1, Relaxed);
        self.count.fetch_add(1, Relaxed);
        self.sum_micros
            .fetch_add(u64::try_from(d.as_micros()).unwrap_or(u64::MAX), Relaxed);
    }

    fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            buckets: std::array::from_fn(|i| self.buckets[i].load(Relaxed)),
            count: self.count.load(Relaxed),
            sum: Duration::from_micros(self.sum_micros.load(Relaxed)),
        }
    }
}

#[derive(Default)]
struct Inner {
    acquired: AtomicU64,
    contended: AtomicU64,
    unlocked: AtomicU64,
    degraded: AtomicU64,
    replayed: AtomicU64,
    discarded: AtomicU64,
    rejected: [AtomicU64; RejectionKind::COUNT],
    wait: Histogram,
    hold: Histogram,
}

/// A handle on one layer's counters and histograms. Cheap to clone; every clone reads the
/// same numbers.
#[derive(Clone, Default)]
pub struct LockMetrics {
    inner: Arc<Inner>,
}

impl fmt::Debug for LockMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.snapshot(), f)
    }
}

impl LockMetrics {
    /// Read every counter and histogram (each is read atomically, not all together).
    pub fn snapshot(&self) -> MetricsSnapshot {
        let i = &self.inner;
        let r = |k: RejectionKind| i.rejected[k.index()].load(Relaxed);
        MetricsSnapshot {
            acquired: i.acquired.load(Relaxed),
            contended: i.contended.load(Relaxed),
            unlocked: i.unlocked.load(Relaxed),
            degraded: i.degraded.load(Relaxed),
            replayed: i.replayed.load(Relaxed),
            discarded: i.discarded.load(Relaxed),
            rejected: RejectedCounts {
                missing_key: r(RejectionKind::MissingKey),
                malformed_key: r(RejectionKind::MalformedKey),
                locked: r(RejectionKind::Locked),
                conflict: r(RejectionKind::Conflict),
                timed_out: r(RejectionKind::TimedOut),
                queue_full: r(RejectionKind::QueueFull),
                unavailable: r(RejectionKind::BackendUnavailable),
                fingerprint_mismatch: r(RejectionKind::FingerprintMismatch),
                not_replayable: r(RejectionKind::NotReplayable),
                request_too_large: r(RejectionKind::RequestTooLarge),
                unreadable_body: r(RejectionKind::UnreadableBody),
            },
            wait: i.wait.snapshot(),
            hold: i.hold.snapshot(),
        }
    }

    pub(crate) fn acquired(&self, waited: Duration, contended: bool) {
        self.inner.acquired.fetch_add(1, Relaxed);
        if contended {
            self.inner.contended.fetch_add(1, Relaxed);
        }
        self.inner.wait.record(waited);
    }

    pub(crate) fn rejected(&self, kind: RejectionKind) {
        self.inner.rejected[kind.index()].fetch_add(1, Relaxed);
        if kind.is_contention() {
            self.inner.contended.fetch_add(1, Relaxed);
        }
    }

    pub(crate) fn unlocked(&self) {
        self.inner.unlocked.fetch_add(1, Relaxed);
    }

    pub(crate) fn degraded(&self) {
        self.inner.degraded.fetch_add(1, Relaxed);
    }

    pub(crate) fn replayed(&self) {
        self.inner.replayed.fetch_add(1, Relaxed);
    }

    pub(crate) fn discarded(&self) {
        self.inner.discarded.fetch_add(1, Relaxed);
    }

    pub(crate) fn held(&self, d: Duration) {
        self.inner.hold.record(d);
    }
}

/// The numbers of a [`LockMetrics`] at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MetricsSnapshot {
    /// Requests that ran holding their key (including degraded in-process locks).
    pub acquired: u64,
    /// Requests that found their key held: turned away with `409`/`423`/`429`, or
    /// granted after waiting (a grant under a wait limit that took 1 ms or more; the
    /// engine does not report whether a grant queued).
    pub contended: u64,
    /// Requests that ran without a lock: no key under the pass-through policy, or the
    /// backend failed under the fail-open policy.
    pub unlocked: u64,
    /// Acquisitions that fell back to the in-process engine because the backend failed.
    pub degraded: u64,
    /// Idempotency replay: requests answered with a stored response.
    pub replayed: u64,
    /// Idempotency replay: responses not stored because the holder's lease had run out
    /// before it completed (another request may have run with the same key meanwhile).
    pub discarded: u64,
    /// Requests answered with a rejection, by reason.
    pub rejected: RejectedCounts,
    /// Time from the start of the acquisition to the grant, of acquired requests.
    pub wait: HistogramSnapshot,
    /// Time from the grant to the release, of acquired requests.
    pub hold: HistogramSnapshot,
}

/// Rejections by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RejectedCounts {
    /// `400`: no key, under the reject policy.
    pub missing_key: u64,
    /// `400`: a malformed or over-long key.
    pub malformed_key: u64,
    /// `423`: the key was held and the layer does not wait.
    pub locked: u64,
    /// `409`: a duplicate idempotency key in flight.
    pub conflict: u64,
    /// `429`: the wait limit passed.
    pub timed_out: u64,
    /// `429`: too many waiters for the key.
    pub queue_full: u64,
    /// `503`: the backend failed, under the fail-closed policy.
    pub unavailable: u64,
    /// `422`: an idempotency key reused with a different request.
    pub fingerprint_mismatch: u64,
    /// `409`: the original response was not stored, so it cannot be replayed.
    pub not_replayable: u64,
    /// `413`: a request body over the idempotency layer's limit.
    pub request_too_large: u64,
    /// `400`: a request body that failed before its end.
    pub unreadable_body: u64,
}

impl RejectedCounts {
    /// All rejections.
    pub fn total(&self) -> u64 {
        self.missing_key
            + self.malformed_key
            + self.locked
            + self.conflict
            + self.timed_out
            + self.queue_full
            + self.unavailable
            + self.fingerprint_mismatch
            + self.not_replayable
            + self.request_too_large
            + self.unreadable_body
    }
}

/// A histogram: counts per bucket of [`BUCKET_BOUNDS_MS`] (the last bucket counts
/// everything above the last bound), the number of samples, and their sum.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HistogramSnapshot {
    /// Samples per bucket (not cumulative).
    pub buckets: [u64; BUCKETS],
    /// Number of samples.
    pub count: u64,
    /// Sum of the samples.
    pub sum: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_puts_samples_in_the_first_bucket_that_bounds_them() {
        let h = Histogram::default();
        h.record(Duration::from_micros(500));
        h.record(Duration::from_millis(5));
        h.record(Duration::from_millis(6));
        h.record(Duration::from_secs(60));
        let s = h.snapshot();
        assert_eq!(s.buckets[0], 1);
        assert_eq!(s.buckets[1], 1);
        assert_eq!(s.buckets[2], 1);
        assert_eq!(s.buckets[BUCKETS - 1], 1);
        assert_eq!(s.count, 4);
    }
}
