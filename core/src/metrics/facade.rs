//! Recording through the `metrics` facade (feature `metrics`; `silent.rs` is its empty
//! twin). The keys (name and labels) are built once per layer; each event looks up the
//! recorder installed at that moment and records on it.

use std::{sync::Once, time::Duration};

use metrics::{Key, Label, Metadata, Unit};

use crate::reject::RejectionKind;

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

/// One layer's series on the `metrics` facade.
pub(super) struct Facade {
    acquired: Key,
    contended: Key,
    rejected: [Key; RejectionKind::COUNT],
    unlocked: Key,
    degraded: Key,
    lost: Key,
    replayed: Key,
    discarded: Key,
    wait: Key,
    hold: Key,
    holding: Key,
    oldest_hold: Key,
    waiting: Key,
    /// `tower_lock_permits_in_use`, `mode` = `shared` and `exclusive`.
    permits: [Key; 2],
    /// The `layer` label, for `tower_lock_contended_keys_total` (whose `key` label is
    /// known only at the event).
    layer: String,
    /// The descriptions are given to the recorder of the layer's first event.
    described: Once,
}

impl Default for Facade {
    fn default() -> Self {
        Self::new("")
    }
}

impl Facade {
    pub(super) fn new(layer: &str) -> Self {
        let key =
            |name: &'static str| Key::from_parts(name, vec![Label::new("layer", layer.to_owned())]);
        Self {
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
            oldest_hold: key("tower_lock_oldest_hold_seconds"),
            waiting: key("tower_lock_requests_waiting"),
            permits: ["shared", "exclusive"].map(|mode| {
                Key::from_parts(
                    "tower_lock_permits_in_use",
                    vec![
                        Label::new("layer", layer.to_owned()),
                        Label::from_static_parts("mode", mode),
                    ],
                )
            }),
            layer: layer.to_owned(),
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
                counter(
                    &self.discarded,
                    "Completed idempotent responses not stored: a retry runs again.",
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
                    self.oldest_hold.name_shared(),
                    Some(Unit::Seconds),
                    "How long the oldest hold of the layer on this node has lasted.".into(),
                );
                r.describe_gauge(
                    self.waiting.name_shared(),
                    Some(Unit::Count),
                    "Requests whose lock acquisition is under way now.".into(),
                );
                r.describe_gauge(
                    self.permits[0].name_shared(),
                    Some(Unit::Count),
                    "Requests holding a permit of their lock key now, by mode.".into(),
                );
            });
        });
    }

    fn count(&self, key: &Key) {
        self.describe();
        metrics::with_recorder(|r| r.register_counter(key, &METADATA).increment(1));
    }

    pub(super) fn unlocked(&self) {
        self.count(&self.unlocked);
    }

    pub(super) fn degraded(&self) {
        self.count(&self.degraded);
    }

    pub(super) fn contended(&self) {
        self.count(&self.contended);
    }

    pub(super) fn lost(&self, n: u64) {
        self.describe();
        metrics::with_recorder(|r| r.register_counter(&self.lost, &METADATA).increment(n));
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
        });
    }

    /// Requests left (or, `delta` > 0, joined) the holding gauge.
    pub(super) fn holding(&self, delta: f64) {
        self.describe();
        metrics::with_recorder(|r| r.register_gauge(&self.holding, &METADATA).increment(delta));
    }

    pub(super) fn oldest_hold(&self, age: Duration) {
        self.describe();
        metrics::with_recorder(|r| {
            r.register_gauge(&self.oldest_hold, &METADATA)
                .set(age.as_secs_f64());
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

    /// Contention on the key labelled `label` (a contended event: the key is built here).
    pub(super) fn contended_key(&self, label: String) {
        self.describe();
        let key = Key::from_parts(
            "tower_lock_contended_keys_total",
            vec![
                Label::new("layer", self.layer.clone()),
                Label::new("key", label),
            ],
        );
        metrics::with_recorder(|r| r.register_counter(&key, &METADATA).increment(1));
    }

    pub(super) fn permits(&self, exclusive: bool, delta: f64) {
        self.describe();
        let key = &self.permits[usize::from(exclusive)];
        metrics::with_recorder(|r| r.register_gauge(key, &METADATA).increment(delta));
    }
}

/// Idempotency replay's events.
#[cfg_attr(not(feature = "idempotency"), allow(dead_code))]
impl Facade {
    pub(super) fn replayed(&self) {
        self.count(&self.replayed);
    }

    pub(super) fn discarded(&self) {
        self.count(&self.discarded);
    }
}
