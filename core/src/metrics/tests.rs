//! The layer metrics' own tests: gauges, counters and the oldest hold.

use super::*;

const MS: Duration = Duration::from_millis(1);

/// A hold on `key` whose lease is never lost.
fn facts(key: &str) -> HoldFacts {
    HoldFacts {
        lost: crate::engine::LostSignal::never(LockKey::new(key).unwrap()),
        fence: 1,
        label: None,
        span: None,
    }
}

#[tokio::test]
async fn gauges_follow_grants_releases_and_waits() {
    let m = LockMetrics::default();
    let now = tokio::time::Instant::now();
    let a = m.acquired(MS, false, facts("a"), now);
    m.acquired(MS, false, facts("b"), now);
    let waiting = m.waiting();
    assert_eq!((m.snapshot().holding, m.snapshot().waiting), (2, 1));
    m.held(a, MS);
    drop(waiting);
    assert_eq!((m.snapshot().holding, m.snapshot().waiting), (1, 0));
}

#[tokio::test(start_paused = true)]
async fn oldest_hold_is_the_age_of_the_oldest_current_hold() {
    let m = LockMetrics::default();
    assert_eq!(m.snapshot().oldest_hold, None);
    let first = m.acquired(MS, false, facts("a"), tokio::time::Instant::now());
    tokio::time::advance(Duration::from_secs(3)).await;
    let second = m.acquired(MS, false, facts("b"), tokio::time::Instant::now());
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(m.snapshot().oldest_hold, Some(Duration::from_secs(5)));
    m.held(first, Duration::from_secs(5));
    assert_eq!(m.snapshot().oldest_hold, Some(Duration::from_secs(2)));
    m.held(second, Duration::from_secs(2));
    assert_eq!(m.snapshot().oldest_hold, None);
}

#[test]
fn permits_gauge_counts_shared_and_exclusive_holders() {
    let m = LockMetrics::default();
    let a = m.permit(false);
    let b = m.permit(false);
    let w = m.permit(true);
    let snap = m.snapshot();
    assert_eq!((snap.shared_permits, snap.exclusive_permits), (2, 1));
    drop((a, w));
    let snap = m.snapshot();
    assert_eq!((snap.shared_permits, snap.exclusive_permits), (1, 0));
    drop(b);
    assert_eq!(m.snapshot().shared_permits, 0);
}

#[test]
fn lost_and_replayed_are_counted() {
    let m = LockMetrics::default();
    m.lost();
    m.replayed();
    m.replayed();
    assert_eq!((m.snapshot().lost, m.snapshot().replayed), (1, 2));
}

/// [`SERIES`] is exactly what the facade registers: every event of a layer recorded on a
/// recorder that keeps each series' name, type and label names.
#[cfg(feature = "metrics")]
mod registered {
    use std::{collections::BTreeSet, sync::Mutex};

    use metrics::{
        Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
    };

    use super::{super::recorder::Facade, *};

    type Seen = BTreeSet<(String, &'static str, Vec<String>)>;

    #[derive(Default)]
    struct Registered(Mutex<Seen>);

    impl Registered {
        fn add(&self, key: &Key, kind: SeriesKind) {
            let labels = key.labels().map(|l| l.key().to_owned()).collect();
            let name = key.name().to_owned();
            self.0.lock().unwrap().insert((name, kind.as_str(), labels));
        }
    }

    impl Recorder for Registered {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            self.add(key, SeriesKind::Counter);
            Counter::noop()
        }

        fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
            self.add(key, SeriesKind::Gauge);
            Gauge::noop()
        }

        fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
            self.add(key, SeriesKind::Histogram);
            Histogram::noop()
        }
    }

    #[test]
    fn the_series_table_is_what_the_facade_registers() {
        let recorder = Registered::default();
        metrics::with_local_recorder(&recorder, || {
            let f = Facade::new("l");
            f.acquired(MS, true);
            f.held(MS);
            f.holding(-1.0);
            f.oldest_hold(MS);
            f.contended();
            f.contended_key("l/k".to_owned());
            for kind in RejectionKind::ALL {
                f.rejected(kind, kind.is_contention());
            }
            f.unlocked();
            f.degraded();
            f.lost(1);
            f.replayed();
            f.discarded();
            f.waiting(1.0);
            f.permits(false, 1.0);
            f.permits(true, 1.0);
        });
        let seen = recorder.0.into_inner().unwrap();
        let table: Seen = SERIES
            .iter()
            .map(|s| {
                let labels = s.labels.iter().map(|l| (*l).to_owned()).collect();
                (s.name.to_owned(), s.kind.as_str(), labels)
            })
            .collect();
        assert_eq!(seen, table);
    }
}

/// The repository's `docs/metrics.md` lists exactly the series of [`SERIES`] (name, type,
/// labels) and exactly the rejection reasons, each with its status.
mod docs {
    use std::collections::BTreeSet;

    use super::*;

    const DOC: &str = include_str!("../../../docs/metrics.md");

    /// The cells of the table rows whose first cell starts with `head`, backticks removed.
    fn rows(head: &str) -> Vec<Vec<String>> {
        DOC.lines()
            .filter(|line| line.starts_with(head))
            .map(|line| {
                line.trim_matches('|')
                    .split(" | ")
                    .map(|cell| cell.trim().replace('`', ""))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn metrics_md_lists_every_series_with_its_type_and_labels() {
        let doc: BTreeSet<(String, String, String)> = rows("| `tower_lock_")
            .into_iter()
            .map(|cells| (cells[0].clone(), cells[1].clone(), cells[2].clone()))
            .collect();
        let table: BTreeSet<(String, String, String)> = SERIES
            .iter()
            .map(|s| {
                let kind = s.kind.as_str().to_owned();
                (s.name.to_owned(), kind, s.labels.join(", "))
            })
            .collect();
        assert_eq!(doc, table);
    }

    #[test]
    fn metrics_md_lists_every_rejection_reason_with_its_status() {
        let doc: BTreeSet<(String, String)> = rows("| `")
            .into_iter()
            .filter(|cells| cells.len() == 3 && cells[0] != "reason")
            .map(|cells| (cells[0].clone(), cells[1].clone()))
            .collect();
        let kinds: BTreeSet<(String, String)> = RejectionKind::ALL
            .iter()
            .map(|k| (k.as_str().to_owned(), k.status().as_u16().to_string()))
            .collect();
        assert_eq!(doc, kinds);
    }
}
