//! The empty twin of `facade.rs`, for builds without the `metrics` feature: the same calls,
//! doing nothing, so that no call site carries a `cfg`.

use std::time::Duration;

use crate::reject::RejectionKind;

/// Records nothing.
#[derive(Default)]
pub(super) struct Facade;

impl Facade {
    pub(super) fn new(_layer: &str) -> Self {
        Self
    }

    pub(super) fn unlocked(&self) {}

    pub(super) fn degraded(&self) {}

    pub(super) fn contended(&self) {}

    pub(super) fn lost(&self, _n: u64) {}

    pub(super) fn acquired(&self, _waited: Duration, _contended: bool) {}

    pub(super) fn held(&self, _held: Duration) {}

    pub(super) fn holding(&self, _delta: f64) {}

    pub(super) fn oldest_hold(&self, _age: Duration) {}

    pub(super) fn rejected(&self, _kind: RejectionKind, _contended: bool) {}

    pub(super) fn waiting(&self, _delta: f64) {}

    pub(super) fn permits(&self, _exclusive: bool, _delta: f64) {}

    pub(super) fn contended_key(&self, _label: String) {}
}

/// Idempotency replay's events.
#[cfg_attr(not(feature = "idempotency"), allow(dead_code))]
impl Facade {
    pub(super) fn replayed(&self) {}

    pub(super) fn discarded(&self) {}
}
