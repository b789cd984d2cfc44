//! Counters, histograms and gauges of a lock layer: exported through the
//! [`metrics`](https://docs.rs/metrics) facade (feature `metrics`) and readable in process
//! with [`LockMetrics::snapshot`].
//!
//! # Through the `metrics` facade
//!
//! With the `metrics` feature, every layer records each event as it happens through the
//! `metrics` crate's facade, to whatever recorder the application installed (Prometheus,
//! StatsD, OpenTelemetry…); without a recorder the calls cost next to nothing. The names
//! follow Prometheus conventions (durations in seconds, counters ending in `_total`), and
//! every series has a `layer` label: the name set with
//! [`LockLayerBuilder::metrics_name`](crate::LockLayerBuilder::metrics_name), by default the
//! layer's namespace or, without one, its extractor's kind (`idempotency-key`).
//!
//! | name | type | labels | what |
//! |---|---|---|---|
//! | `tower_lock_acquired_total` | counter | `layer` | requests that ran holding their key |
//! | `tower_lock_contended_total` | counter | `layer` | requests that found their key held (rejected, or granted after waiting) |
//! | `tower_lock_rejected_total` | counter | `layer`, `reason` | rejections, by [`RejectionKind::as_str`] |
//! | `tower_lock_unlocked_total` | counter | `layer` | requests that ran without a lock (no key under pass-through, fail-open) |
//! | `tower_lock_degraded_total` | counter | `layer` | acquisitions that fell back to the in-process engine |
//! | `tower_lock_lost_leases_total` | counter | `layer` | leases lost while their request held them (counted when the request ends) |
//! | `tower_lock_replayed_total` | counter | `layer` | idempotent requests answered with a stored response |
//! | `tower_lock_replay_discarded_total` | counter | `layer` | idempotent responses not stored because the holder's lease had run out |
//! | `tower_lock_wait_seconds` | histogram | `layer` | from the start of the acquisition to the grant |
//! | `tower_lock_hold_seconds` | histogram | `layer` | from the grant to the release |
//! | `tower_lock_requests_holding` | gauge | `layer` | requests holding their key now |
//! | `tower_lock_requests_waiting` | gauge | `layer` | requests whose acquisition is under way now (waiting for a held key, or for the backend's answer) |
//!
//! Install the recorder before serving: gauges are moved up and down by events, so a
//! recorder installed while requests hold or wait starts from their later decrements. For
//! histograms as Prometheus histograms rather than summaries, give the exporter bucket
//! bounds, for example [`BUCKET_BOUNDS_SECONDS`] (`examples/prometheus.rs` serves
//! `/metrics` with `metrics-exporter-prometheus`).
//!
//! # In process
//!
//! [`LockMetrics`] is a cheap handle on the same numbers kept in atomics, with or without
//! the feature; [`LockMetrics::snapshot`] reads them all (for tests and health pages).
//!
//! ```
//! # fn demo(layer: tower_lock::LockLayer) {
//! use tower_lock::metrics::BUCKET_BOUNDS_SECONDS;
//!
//! let snap = layer.metrics().snapshot();
//! println!("acquired {} / rejected {}", snap.acquired, snap.rejected.total());
//! // Cumulative, as in Prometheus: waits of at most 10 ms (the third bound).
//! assert_eq!(BUCKET_BOUNDS_SECONDS[2], 0.010);
//! println!("waits <= 10 ms: {} of {}", snap.wait.buckets[2], snap.wait.count);
//! # }
//! ```

use std::{
    fmt,
    sync::{
        Arc,
        atomic::{AtomicI64, AtomicU64, Ordering::Relaxed},
    },
    time::Duration,
};

use crate::{reject::RejectionKind, retry_after::RecentHolds};

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

const BUCKETS: usize = BOUNDS.len() + 1;

#[derive(Default)]
struct Histogram {
    /// Samples per bucket (not cumulative: one add per sample); the snapshot sums them.
    buckets: [AtomicU64; BUCKETS],
    sum_micros: AtomicU64,
}

impl Histogram {
    fn record(&self, d: Duration) {
        let i = BOUNDS
            .iter()
            .position(|&bound| d <= bound)
            .unwrap_or(BUCKETS - 1);
        self.buckets[i].fetch_add(1, Relaxed);
        self.sum_micros
            .fetch_add(u64::try_from(d.as_micros()).unwrap_or(u64::MAX), Relaxed);
    }

    fn snapshot(&self) -> HistogramSnapshot {
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

#[derive(Default)]
struct Inner {
    acquired: AtomicU64,
    contended: AtomicU64,
    unlocked: AtomicU64,
    degraded: AtomicU64,
    lost: AtomicU64,
    replayed: AtomicU64,
    discarded: AtomicU64,
    rejected: [AtomicU64; RejectionKind::COUNT],
    wait: Histogram,
    hold: Histogram,
    holding: AtomicI64,
    waiting: AtomicI64,
    /// The hold times `Retry-After` is derived from.
    recent_holds: RecentHolds,
    #[cfg(feature = "metrics")]
    facade: facade::Facade,
}

/// A handle on one layer's counters, histograms and gauges. Cheap to clone; every clone
/// reads the same numbers.
#[derive(Clone)]
pub struct LockMetrics {
    inner: Arc<Inner>,
}

impl Default for LockMetrics {
    fn default() -> Self {
        LockMetrics::new("")
    }
}

impl fmt::Debug for LockMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.snapshot(), f)
    }
}

impl LockMetrics {
    /// The metrics of a layer whose series carry `layer = name`.
    pub(crate) fn new(name: &str) -> Self {
        #[cfg(not(feature = "metrics"))]
        let _ = name;
        LockMetrics {
            inner: Arc::new(Inner {
                #[cfg(feature = "metrics")]
                facade: facade::Facade::new(name),
                ..Inner::default()
            }),
        }
    }

    /// Read every counter, histogram and gauge (each is read atomically, not all together).
    pub fn snapshot(&self) -> MetricsSnapshot {
        let i = &self.inner;
        let r = |k: RejectionKind| i.rejected[k.index()].load(Relaxed);
        let gauge = |g: &AtomicI64| u64::try_from(g.load(Relaxed)).unwrap_or(0);
        MetricsSnapshot {
            acquired: i.acquired.load(Relaxed),
            contended: i.contended.load(Relaxed),
            unlocked: i.unlocked.load(Relaxed),
            degraded: i.degraded.load(Relaxed),
            lost: i.lost.load(Relaxed),
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
            holding: gauge(&i.holding),
            waiting: gauge(&i.waiting),
        }
    }

    /// A request was granted its key after `waited`; it holds it until [`held`](Self::held).
    pub(crate) fn acquired(&self, waited: Duration, contended: bool) {
        let i = &self.inner;
        i.acquired.fetch_add(1, Relaxed);
        if contended {
            i.contended.fetch_add(1, Relaxed);
        }
        i.wait.record(waited);
        i.holding.fetch_add(1, Relaxed);
        #[cfg(feature = "metrics")]
        i.facade.acquired(waited, contended);
    }

    /// A request that held its key for `d` released it.
    pub(crate) fn held(&self, d: Duration) {
        let i = &self.inner;
        i.hold.record(d);
        i.recent_holds.record(d);
        i.holding.fetch_sub(1, Relaxed);
        #[cfg(feature = "metrics")]
        i.facade.held(d);
    }

    pub(crate) fn rejected(&self, kind: RejectionKind) {
        let i = &self.inner;
        i.rejected[kind.index()].fetch_add(1, Relaxed);
        let contended = kind.is_contention();
        if contended {
            i.contended.fetch_add(1, Relaxed);
        }
        #[cfg(feature = "metrics")]
        i.facade.rejected(kind, contended);
    }

    pub(crate) fn unlocked(&self) {
        self.inner.unlocked.fetch_add(1, Relaxed);
        #[cfg(feature = "metrics")]
        self.inner.facade.count(&self.inner.facade.unlocked);
    }

    pub(crate) fn degraded(&self) {
        self.inner.degraded.fetch_add(1, Relaxed);
        #[cfg(feature = "metrics")]
        self.inner.facade.count(&self.inner.facade.degraded);
    }

    /// A request's lease was lost while it held it.
    pub(crate) fn lost(&self) {
        self.inner.lost.fetch_add(1, Relaxed);
        #[cfg(feature = "metrics")]
        self.inner.facade.count(&self.inner.facade.lost);
    }

    /// An idempotent request was answered with a stored response (idempotency replay).
    pub(crate) fn replayed(&self) {
        self.inner.replayed.fetch_add(1, Relaxed);
        #[cfg(feature = "metrics")]
        self.inner.facade.count(&self.inner.facade.replayed);
    }

    /// Idempotency replay: a response was not stored, its holder's lease having run out.
    pub(crate) fn discarded(&self) {
        self.inner.discarded.fetch_add(1, Relaxed);
        #[cfg(feature = "metrics")]
        self.inner.facade.count(&self.inner.facade.discarded);
    }

    /// A request's acquisition is under way until the returned guard is dropped.
    pub(crate) fn waiting(&self) -> Waiting {
        self.inner.waiting.fetch_add(1, Relaxed);
        #[cfg(feature = "metrics")]
        self.inner.facade.waiting(1.0);
        Waiting {
            metrics: self.clone(),
        }
    }

    /// The layer's recent hold-time percentile, for `Retry-After`.
    pub(crate) fn recent_hold(&self) -> Option<Duration> {
        self.inner.recent_holds.percentile()
    }
}

/// Counts one request in the `waiting` gauge while it lives.
pub(crate) struct Waiting {
    metrics: LockMetrics,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.metrics.inner.waiting.fetch_sub(1, Relaxed);
        #[cfg(feature = "metrics")]
        self.metrics.inner.facade.waiting(-1.0);
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
    /// Leases lost while their request held them (renewal failed, or the key was taken
    /// away), counted when the request ends.
    pub lost: u64,
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
    /// Requests holding their key now.
    pub holding: u64,
    /// Requests whose acquisition is under way now.
    pub waiting: u64,
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

/// A histogram in Prometheus form: cumulative counts per bound of
/// [`BUCKET_BOUNDS_SECONDS`] (`buckets[i]` counts the samples of at most the `i`th bound;
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

#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
mod facade {
    //! Recording through the `metrics` facade. The keys (name and labels) are built once per
    //! layer; each event looks up the recorder installed at that moment and records on it.

    use std::{sync::Once, time::Duration};

    use metrics::{Key, Label, Metadata, Unit};

    use crate::reject::RejectionKind;

    static METADATA: Metadata<'static> =
        Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

    pub(super) struct Facade {
        acquired: Key,
        contended: Key,
        rejected: [Key; RejectionKind::COUNT],
        pub(super) unlocked: Key,
        pub(super) degraded: Key,
        pub(super) lost: Key,
        pub(super) replayed: Key,
        pub(super) discarded: Key,
        wait: Key,
        hold: Key,
        holding: Key,
        waiting: Key,
        /// The descriptions are given to the recorder of the layer's first event.
        described: Once,
    }

    impl Default for Facade {
        fn default() -> Self {
            Facade::new("")
        }
    }

    impl Facade {
        pub(super) fn new(layer: &str) -> Self {
            let key = |name: &'static str| {
                Key::from_parts(name, vec![Label::new("layer", layer.to_owned())])
            };
            Facade {
                acquired: key("tower_lock_acquired_total"),
                contended: key("tower_lock_contended_total"),
                rejected: RejectionKind::ALL.map(|kind| {
                    Key::from_parts(
                        "tower_lock_rejected_total",
                        vec![
                            Label::new("layer", layer.to_owned()),
                            Label::from_static_parts("reason", kind.as_str()),
                        ],
                    )
                }),
                unlocked: key("tower_lock_unlocked_total"),
                degraded: key("tower_lock_degraded_total"),
                lost: key("tower_lock_lost_leases_total"),
                replayed: key("tower_lock_replayed_total"),
                discarded: key("tower_lock_replay_discarded_total"),
                wait: key("tower_lock_wait_seconds"),
                hold: key("tower_lock_hold_seconds"),
                holding: key("tower_lock_requests_holding"),
                waiting: key("tower_lock_requests_waiting"),
                described: Once::new(),
            }
        }

        fn describe(&self) {
            self.described.call_once(|| {
                metrics::with_recorder(|r| {
                    let counter = |key: &Key, help: &'static str| {
                        r.describe_counter(key.name_shared(), Some(Unit::Count), help.into());
                    };
                    counter(&self.acquired, "Requests that ran holding their lock key.");
                    counter(&self.contended, "Requests that found their lock key held.");
                    counter(
                        &self.rejected[0],
                        "Requests rejected by the lock layer, by reason.",
                    );
                    counter(&self.unlocked, "Requests that ran without a lock.");
                    counter(
                        &self.degraded,
                        "Acquisitions that fell back to the in-process engine.",
                    );
                    counter(&self.lost, "Leases lost while their request held them.");
                    counter(
                        &self.replayed,
                        "Idempotent requests answered with a stored response.",
                    );
                    r.describe_histogram(
                        self.wait.name_shared(),
                        Some(Unit::Seconds),
                        "Time from the start of an acquisition to the grant.".into(),
                    );
                    r.describe_histogram(
                        self.hold.name_shared(),
                        Some(Unit::Seconds),
                        "Time from the grant of a lock to its release.".into(),
                    );
                    r.describe_gauge(
                        self.holding.name_shared(),
                        Some(Unit::Count),
                        "Requests holding their lock key now.".into(),
                    );
                    r.describe_gauge(
                        self.waiting.name_shared(),
                        Some(Unit::Count),
                        "Requests whose lock acquisition is under way now.".into(),
                    );
                });
            });
        }

        pub(super) fn count(&self, key: &Key) {
            self.describe();
            metrics::with_recorder(|r| r.register_counter(key, &METADATA).increment(1));
        }

        pub(super) fn acquired(&self, waited: Duration, contended: bool) {
            self.describe();
            metrics::with_recorder(|r| {
                r.register_counter(&self.acquired, &METADATA).increment(1);
                if contended {
                    r.register_counter(&self.contended, &METADATA).increment(1);
                }
                r.register_histogram(&self.wait, &METADATA)
                    .record(waited.as_secs_f64());
                r.register_gauge(&self.holding, &METADATA).increment(1.0);
            });
        }

        pub(super) fn held(&self, held: Duration) {
            self.describe();
            metrics::with_recorder(|r| {
                r.register_histogram(&self.hold, &METADATA)
                    .record(held.as_secs_f64());
                r.register_gauge(&self.holding, &METADATA).decrement(1.0);
            });
        }

        pub(super) fn rejected(&self, kind: RejectionKind, contended: bool) {
            self.describe();
            metrics::with_recorder(|r| {
                r.register_counter(&self.rejected[kind.index()], &METADATA)
                    .increment(1);
                if contended {
                    r.register_counter(&self.contended, &METADATA).increment(1);
                }
            });
        }

        pub(super) fn waiting(&self, delta: f64) {
            self.describe();
            metrics::with_recorder(|r| r.register_gauge(&self.waiting, &METADATA).increment(delta));
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

    #[test]
    fn gauges_follow_grants_releases_and_waits() {
        let m = LockMetrics::default();
        m.acquired(MS, false);
        m.acquired(MS, false);
        let waiting = m.waiting();
        assert_eq!((m.snapshot().holding, m.snapshot().waiting), (2, 1));
        m.held(MS);
        drop(waiting);
        assert_eq!((m.snapshot().holding, m.snapshot().waiting), (1, 0));
    }

    #[test]
    fn lost_and_replayed_are_counted() {
        let m = LockMetrics::default();
        m.lost();
        m.replayed();
        m.replayed();
        assert_eq!((m.snapshot().lost, m.snapshot().replayed), (1, 2));
    }
}
