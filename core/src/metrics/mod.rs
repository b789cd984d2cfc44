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
//! `LockLayerBuilder::metrics_name`, by default the
//! layer's namespace or, without one, its extractor's kind (`idempotency-key`).
//!
//! | name | type | labels | what |
//! |---|---|---|---|
//! | `tower_lock_acquired_total` | counter | `layer` | requests that ran holding their key |
//! | `tower_lock_contended_total` | counter | `layer` | requests that found their key held (rejected, or granted after waiting) |
//! | `tower_lock_contended_keys_total` | counter | `layer`, `key` | the same, by lock key: the first keys contended get a `key` of their own, the later ones share `key="other"` (at most [`HOT_KEYS`] values) |
//! | `tower_lock_rejected_total` | counter | `layer`, `reason` | rejections, by [`RejectionKind::as_str`] |
//! | `tower_lock_unlocked_total` | counter | `layer` | requests that ran without a lock (no key under pass-through, fail-open) |
//! | `tower_lock_degraded_total` | counter | `layer` | acquisitions that fell back to the in-process engine |
//! | `tower_lock_lost_leases_total` | counter | `layer` | leases lost while their request held them (counted when the layer finds them lost: within a second while the request still runs, or at its end) |
//! | `tower_lock_replayed_total` | counter | `layer` | idempotent requests answered with a stored response |
//! | `tower_lock_replay_discarded_total` | counter | `layer` | completed idempotent responses not stored (the lease ran out, the backend refused or failed: an outage), so a retry runs again: alert on it |
//! | `tower_lock_wait_seconds` | histogram | `layer` | from the start of the acquisition to the grant |
//! | `tower_lock_hold_seconds` | histogram | `layer` | from the grant to the release |
//! | `tower_lock_requests_holding` | gauge | `layer` | requests holding their key now (a request whose lease was lost leaves it within a second, though it may still run) |
//! | `tower_lock_oldest_hold_seconds` | gauge | `layer` | how long the oldest current hold of the layer on this node has lasted (0: none), set every second while the layer holds keys |
//! | `tower_lock_requests_waiting` | gauge | `layer` | requests whose acquisition is under way now (waiting for a held key, or for the backend's answer) |
//! | `tower_lock_permits_in_use` | gauge | `layer`, `mode` | requests holding a permit of their key now (a layer with `permits` or `shared_for`), by `mode`: `shared` or `exclusive` |
//!
//! The same table, with what each series is for, the dashboard
//! (`dashboards/grafana.json`) and the alerts, is in the repository's `docs/metrics.md`.
//!
//! Install the recorder before serving: gauges are moved up and down by events, so a
//! recorder installed while requests hold or wait starts from their later decrements. For
//! histograms as Prometheus histograms rather than summaries, give the exporter bucket
//! bounds, for example [`BUCKET_BOUNDS_SECONDS`] (`examples/prometheus.rs` serves
//! `/metrics` with `metrics-exporter-prometheus`).
//!
//! The hottest keys: `topk(5, rate(tower_lock_contended_keys_total[5m]))` in PromQL; in
//! process, [`MetricsSnapshot::contended_keys`]. The label set is capped per layer, so
//! clients cannot grow it; lock keys hold what the extractor read (a tenant, a principal's
//! scope), so treat the series as you treat those values.
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
        atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed},
    },
    time::Duration,
};

pub(crate) use crate::retry_after::HolderSlot;
use crate::{
    engine::LockKey,
    reject::RejectionKind,
    retry_after::{CurrentHolders, RecentHolds},
};

mod histogram;
mod holds;
mod hot_keys;
mod series;
mod snapshot;
// The `metrics` facade, or its empty twin: chosen once, here.
#[cfg_attr(feature = "metrics", path = "facade.rs")]
#[cfg_attr(not(feature = "metrics"), path = "silent.rs")]
mod recorder;

use histogram::Histogram;
use holds::Holds;
pub(crate) use holds::{Ended, HoldFacts, HoldId};
use hot_keys::HotKeys;
use recorder::Facade;

pub use histogram::BUCKET_BOUNDS_SECONDS;
pub use hot_keys::{HOT_KEYS, OTHER};
pub use series::{SERIES, Series, SeriesKind};
pub use snapshot::{HistogramSnapshot, MetricsSnapshot, RejectedCounts};

/// The numbers of one layer, and its series on the `metrics` facade.
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
    /// Permits held now by the layer's requests: shared, and exclusive.
    permits: [AtomicI64; 2],
    /// The hold times `Retry-After` is derived from.
    recent_holds: RecentHolds,
    /// When this node's exclusive holders began, for what is left of a hold.
    current_holders: CurrentHolders,
    /// Contention by key, capped.
    hot: HotKeys,
    /// The holds of this layer on this node now: the holding gauge follows their leases.
    holds: Holds,
    /// The layer's `log_holds_longer_than`: holds past it are logged at `info`.
    long_hold: Option<Duration>,
    facade: Facade,
    /// Whether a locked request answered `405` was logged (see [`LockMetrics::wrapped_405`]).
    wrapped_405: AtomicBool,
}

/// A handle on one layer's counters, histograms and gauges. Cheap to clone; every clone
/// reads the same numbers.
#[derive(Clone)]
pub struct LockMetrics {
    inner: Arc<Inner>,
}

impl Default for LockMetrics {
    fn default() -> Self {
        Self::new("", None)
    }
}

impl fmt::Debug for LockMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.snapshot(), f)
    }
}

impl LockMetrics {
    /// The metrics of a layer whose series carry `layer = name`, logging holds longer
    /// than `long_hold` at `info`.
    pub(crate) fn new(name: &str, long_hold: Option<Duration>) -> Self {
        Self {
            inner: Arc::new(Inner {
                facade: Facade::new(name),
                long_hold,
                ..Inner::default()
            }),
        }
    }

    /// Read every counter, histogram and gauge (each is read atomically, not all together).
    ///
    /// The layer's holds are looked at first, as its watch task does every second: a
    /// lease found lost here leaves `holding` (and is counted in `lost`) at this read.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let oldest_hold = self.look(false).and_then(|oldest| oldest);
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
                misconfigured: r(RejectionKind::Misconfigured),
            },
            wait: i.wait.snapshot(),
            hold: i.hold.snapshot(),
            holding: gauge(&i.holding),
            oldest_hold,
            waiting: gauge(&i.waiting),
            shared_permits: gauge(&i.permits[0]),
            exclusive_permits: gauge(&i.permits[1]),
            contended_keys: i.hot.snapshot(),
        }
    }

    /// A dry run's request found its key held where the layer would have waited: neither
    /// granted nor rejected, counted as contended only.
    pub(crate) fn contended(&self) {
        self.inner.contended.fetch_add(1, Relaxed);
        self.inner.facade.contended();
    }

    /// A request met contention on `key` (counted in `contended` by
    /// [`rejected`](Self::rejected) or [`acquired`](Self::acquired)): by key, capped.
    pub(crate) fn contended_key(&self, key: &str) {
        let label = self.inner.hot.count(key);
        self.inner.facade.contended_key(label);
    }

    /// A request was granted its key after `waited`, at `granted`; it holds it until
    /// [`held`](Self::held), or until its lease is found lost.
    pub(crate) fn acquired(
        &self,
        waited: Duration,
        contended: bool,
        facts: HoldFacts,
        granted: tokio::time::Instant,
    ) -> HoldId {
        let i = &self.inner;
        i.acquired.fetch_add(1, Relaxed);
        if contended {
            i.contended.fetch_add(1, Relaxed);
        }
        i.wait.record(waited);
        i.holding.fetch_add(1, Relaxed);
        i.facade.acquired(waited, contended);
        let (id, start_watch) = i.holds.begin(facts, granted);
        if start_watch {
            holds::watch(Arc::downgrade(&self.inner));
        }
        id
    }

    /// The request of hold `id`, which held its key for `d`, let it go: the hold's facts,
    /// and whether its lease was already found lost (it left the holding gauge and was
    /// counted lost then).
    pub(crate) fn held(&self, id: HoldId, d: Duration) -> Option<Ended> {
        let i = &self.inner;
        i.hold.record(d);
        i.recent_holds.record(d);
        let ended = i.holds.end(id);
        if !ended.as_ref().is_some_and(|e| e.already_lost) {
            i.holding.fetch_sub(1, Relaxed);
            i.facade.holding(-1.0);
        }
        i.facade.held(d);
        ended
    }

    /// The layer's `log_holds_longer_than`.
    pub(crate) fn long_hold(&self) -> Option<Duration> {
        self.inner.long_hold
    }

    /// Look at the layer's holds now (the watch task: `stop_if_empty`): the leases found
    /// lost leave the holding gauge and are counted lost, and the oldest-hold gauge is set.
    /// `None` when the watch task is to stop (no holds); else the oldest hold's age.
    fn look(&self, stop_if_empty: bool) -> Option<Option<Duration>> {
        let i = &self.inner;
        let look = i.holds.look(i.long_hold, stop_if_empty);
        let Some(look) = look else {
            i.facade.oldest_hold(Duration::ZERO);
            return None;
        };
        if look.newly_lost > 0 {
            let n = look.newly_lost;
            i.holding.fetch_sub(i64::from(n), Relaxed);
            i.lost.fetch_add(u64::from(n), Relaxed);
            i.facade.holding(-f64::from(n));
            i.facade.lost(u64::from(n));
        }
        i.facade.oldest_hold(look.oldest.unwrap_or_default());
        Some(look.oldest)
    }

    pub(crate) fn rejected(&self, kind: RejectionKind) {
        let i = &self.inner;
        i.rejected[kind.index()].fetch_add(1, Relaxed);
        let contended = kind.is_contention();
        if contended {
            i.contended.fetch_add(1, Relaxed);
        }
        i.facade.rejected(kind, contended);
    }

    pub(crate) fn unlocked(&self) {
        self.inner.unlocked.fetch_add(1, Relaxed);
        self.inner.facade.unlocked();
    }

    pub(crate) fn degraded(&self) {
        self.inner.degraded.fetch_add(1, Relaxed);
        self.inner.facade.degraded();
    }

    /// A request's lease was lost while it held it (found at the request's end: the
    /// layer's holds did not see it lost before).
    pub(crate) fn lost(&self) {
        self.inner.lost.fetch_add(1, Relaxed);
        self.inner.facade.lost(1);
    }

    /// A request's acquisition is under way until the returned guard is dropped.
    pub(crate) fn waiting(&self) -> Waiting {
        self.inner.waiting.fetch_add(1, Relaxed);
        self.inner.facade.waiting(1.0);
        Waiting {
            metrics: self.clone(),
        }
    }

    /// A request holds a permit of its key (`exclusive`: alone) until the returned guard
    /// is dropped.
    pub(crate) fn permit(&self, exclusive: bool) -> PermitInUse {
        self.inner.permits[usize::from(exclusive)].fetch_add(1, Relaxed);
        self.inner.facade.permits(exclusive, 1.0);
        PermitInUse {
            metrics: self.clone(),
            exclusive,
        }
    }

    /// The layer's recent hold-time percentile, for `Retry-After`.
    pub(crate) fn recent_hold(&self) -> Option<Duration> {
        self.inner.recent_holds.percentile()
    }

    /// A request of this layer on this node holds `key` alone from `at`, until
    /// [`ended`](Self::ended).
    pub(crate) fn began(&self, key: &LockKey, at: tokio::time::Instant) -> HolderSlot {
        self.inner.current_holders.began(key, at)
    }

    /// A request of this layer on this node holds `key` as one of its shared holders from
    /// `at`: recorded only when no holder of `key` is recorded here (the first one's start
    /// is what a contender waits on), until [`ended`](Self::ended).
    pub(crate) fn began_first(
        &self,
        key: &LockKey,
        at: tokio::time::Instant,
    ) -> Option<HolderSlot> {
        self.inner.current_holders.began_first(key, at)
    }

    /// The holder of `slot` let its key go.
    pub(crate) fn ended(&self, slot: HolderSlot) {
        self.inner.current_holders.ended(slot);
    }

    /// How long this node's holder of `key` has held it, when one of this layer's requests
    /// holds it here, for `Retry-After`.
    pub(crate) fn holder_elapsed(&self, key: &LockKey) -> Option<Duration> {
        self.inner.current_holders.elapsed(key)
    }
}

impl LockMetrics {
    /// A locked request was answered `405 Method Not Allowed` by the service inside:
    /// `true` the first time for this layer (the caller logs why, once: the fix is in the
    /// install, and every wrong method would repeat it).
    pub(crate) fn wrapped_405(&self) -> bool {
        !self.inner.wrapped_405.swap(true, Relaxed)
    }
}

/// Idempotency replay's events.
#[cfg_attr(not(feature = "idempotency"), allow(dead_code))]
impl LockMetrics {
    /// An idempotent request was answered with a stored response (idempotency replay).
    pub(crate) fn replayed(&self) {
        self.inner.replayed.fetch_add(1, Relaxed);
        self.inner.facade.replayed();
    }

    /// Idempotency replay: a completed response was not stored (its holder's lease ran
    /// out, the backend refused the write until then, or failed: an outage), so a retry
    /// runs the request again. Worth an alert: each is a completed request that may run
    /// twice.
    pub(crate) fn discarded(&self) {
        self.inner.discarded.fetch_add(1, Relaxed);
        self.inner.facade.discarded();
    }
}

/// Counts one request in the `waiting` gauge while it lives.
pub(crate) struct Waiting {
    metrics: LockMetrics,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.metrics.inner.waiting.fetch_sub(1, Relaxed);
        self.metrics.inner.facade.waiting(-1.0);
    }
}

/// Counts one request in the permits gauge while it lives.
pub(crate) struct PermitInUse {
    metrics: LockMetrics,
    exclusive: bool,
}

impl Drop for PermitInUse {
    fn drop(&mut self) {
        let i = &self.metrics.inner;
        i.permits[usize::from(self.exclusive)].fetch_sub(1, Relaxed);
        i.facade.permits(self.exclusive, -1.0);
    }
}

#[cfg(test)]
mod tests;
