//! [`SERIES`]: every series a layer records through the `metrics` facade, by name, type
//! and label names, for tooling that must stay in step with the crate (the repository's
//! `docs/metrics.md` and Grafana dashboard are checked against it, and a test of this
//! crate checks it against what the facade registers).

/// The type of a series, as the `metrics` facade records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum SeriesKind {
    /// A counter (`_total`).
    Counter,
    /// A gauge.
    Gauge,
    /// A histogram (a Prometheus exporter with bucket bounds serves `_bucket`, `_sum`
    /// and `_count`).
    Histogram,
}

impl SeriesKind {
    /// `counter`, `gauge` or `histogram`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::Gauge => "gauge",
            Self::Histogram => "histogram",
        }
    }
}

/// One series a layer records: its name, type and label names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Series {
    /// The metric name (`tower_lock_…`).
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: SeriesKind,
    /// Its label names, `layer` first.
    pub labels: &'static [&'static str],
}

const fn series(name: &'static str, kind: SeriesKind, labels: &'static [&'static str]) -> Series {
    Series { name, kind, labels }
}

use SeriesKind::{Counter, Gauge, Histogram};

/// Every series a layer records (feature `metrics`), each with every label it carries. The
/// values of `reason` are [`RejectionKind::as_str`](crate::reject::RejectionKind::as_str)'s;
/// `mode` is `shared` or `exclusive`; `key` is a contended lock key or `other` (at most
/// [`HOT_KEYS`](super::HOT_KEYS) values per layer).
pub const SERIES: &[Series] = &[
    series("tower_lock_acquired_total", Counter, &["layer"]),
    series("tower_lock_contended_total", Counter, &["layer"]),
    series(
        "tower_lock_contended_keys_total",
        Counter,
        &["layer", "key"],
    ),
    series("tower_lock_rejected_total", Counter, &["layer", "reason"]),
    series("tower_lock_unlocked_total", Counter, &["layer"]),
    series("tower_lock_degraded_total", Counter, &["layer"]),
    series("tower_lock_lost_leases_total", Counter, &["layer"]),
    series("tower_lock_replayed_total", Counter, &["layer"]),
    series("tower_lock_replay_discarded_total", Counter, &["layer"]),
    series("tower_lock_wait_seconds", Histogram, &["layer"]),
    series("tower_lock_hold_seconds", Histogram, &["layer"]),
    series("tower_lock_requests_holding", Gauge, &["layer"]),
    series("tower_lock_oldest_hold_seconds", Gauge, &["layer"]),
    series("tower_lock_requests_waiting", Gauge, &["layer"]),
    series("tower_lock_permits_in_use", Gauge, &["layer", "mode"]),
];
