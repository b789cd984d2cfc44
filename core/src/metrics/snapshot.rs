//! [`MetricsSnapshot`]: the numbers of a [`LockMetrics`](super::LockMetrics) at one moment.

use std::time::Duration;

use super::histogram::BUCKETS;

/// The numbers of a [`LockMetrics`](super::LockMetrics) at one moment.
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
    /// Leases lost while their request held them (renewal failed, or the key was taken
    /// away), counted when the layer finds them lost: within a second, while the request
    /// still runs, or at its end.
    pub lost: u64,
    /// Idempotency replay: requests answered with a stored response.
    pub replayed: u64,
    /// Idempotency replay: completed responses not stored (the holder's lease ran out, or
    /// the backend refused the write or failed), so a retry runs the request again.
    pub discarded: u64,
    /// Requests answered with a rejection, by reason.
    pub rejected: RejectedCounts,
    /// Time from the start of the acquisition to the grant, of acquired requests.
    pub wait: HistogramSnapshot,
    /// Time from the grant to the release, of acquired requests.
    pub hold: HistogramSnapshot,
    /// Requests holding their key now: a request whose lease was lost (taken away by an
    /// operator, a backend reset, a failed renewal) is not counted, though it may still
    /// run.
    pub holding: u64,
    /// How long the oldest of those holds has lasted (`None`: none held). The
    /// `tower_lock_oldest_hold_seconds` gauge, exact at the snapshot.
    pub oldest_hold: Option<Duration>,
    /// Requests whose acquisition is under way now.
    pub waiting: u64,
    /// Requests holding one of the shared permits of their key now (a layer with
    /// `permits` or
    /// `shared_for`).
    pub shared_permits: u64,
    /// Requests holding their key exclusively, under
    /// `shared_for`, now.
    pub exclusive_permits: u64,
    /// Contention by lock key, the most contended first: the first keys contended each
    /// have their count, the later ones share one under [`OTHER`](super::OTHER), at most
    /// [`HOT_KEYS`](super::HOT_KEYS) entries (the `tower_lock_contended_keys_total`
    /// series).
    pub contended_keys: Vec<(String, u64)>,
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
    /// `500`: the server's setup could not derive the key.
    pub misconfigured: u64,
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
            + self.misconfigured
    }
}

/// A histogram in Prometheus form: cumulative counts per bound of
/// [`BUCKET_BOUNDS_SECONDS`](super::BUCKET_BOUNDS_SECONDS) (`buckets[i]` counts the samples of at most the `i`th bound;
/// the last entry, `+Inf`, counts them all), the number of samples, and their sum.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HistogramSnapshot {
    /// Samples at or below each bound (cumulative); the last entry is `+Inf`.
    pub buckets: [u64; BUCKETS],
    /// Number of samples.
    pub count: u64,
    /// Sum of the samples.
    pub sum: Duration,
}
