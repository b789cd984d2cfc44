//! The dry run (`dry_run(true)`): a layer that observes instead of acting, for a rollout.
//! It takes no lock another layer could meet and rejects nothing, but records, in the
//! same metrics and logs, what it would have done.
//!
//! Its leases are taken on keys of their own (the layer's keys behind the `%!dry-run/`
//! mark, which no escaped namespace can start with), never waited for: so its requests
//! see each other (two at once on one key: the second "would have" been answered `423`,
//! or would have waited), and a layer that enforces on the same keys, a background job
//! that takes them, never meets them. An answer the layer would have given instead of
//! running the request (`400`, `409`, `423`, `429`, `500`, `503`, an idempotency replay or
//! its `422`) is counted as usual, logged at `info` ("dry run: would have…"), and the
//! request runs, unlocked, as [`Outcome::Observed`]: with a [`LeaseInfo`] in its extensions
//! all the same (fence `0`, a lost signal that never fires), so that a handler's extractor
//! answers as under the enforcing layer (a `500` there would change the answer).

use super::{Outcome, RequestLocker};
use crate::{engine::LockKey, lease_info::LeaseInfo, reject::Rejection};

/// What begins every key of a dry-run layer, in place of nothing: a namespace is escaped
/// (`%` is written `%25`), so no real key starts with `%!`.
pub(crate) const DRY_RUN_MARK: &str = "%!dry-run/";

impl RequestLocker {
    /// Whether the layer observes only (`dry_run(true)`).
    pub fn is_dry_run(&self) -> bool {
        self.shared.config.dry_run
    }

    /// In a dry run, `outcome` with a rejection turned into running the request unlocked
    /// (the rejection counted and logged) with the lease info of `key` (the dry run's key
    /// it would have locked, `None` when it has none); otherwise `outcome`.
    pub(crate) fn observed(&self, outcome: Outcome, key: Option<&LockKey>) -> Outcome {
        match outcome {
            Outcome::Rejected(rejection) if self.is_dry_run() => {
                self.would_have(&rejection);
                Outcome::Observed(unheld(key))
            }
            outcome => outcome,
        }
    }

    /// A dry run's request that would have been answered with `rejection` (already
    /// counted in the metrics when it was made) runs instead: logged.
    pub(crate) fn would_have(&self, rejection: &Rejection) {
        tracing::info!(
            layer = self.shared.config.name.as_str(),
            reason = rejection.kind().as_str(),
            status = rejection.status().as_u16(),
            detail = rejection.detail(),
            "dry run: would have rejected this request; it runs"
        );
    }

    /// A dry run's request found `key` held where the layer would have waited: counted as
    /// contended (for `key` too) and logged; it runs without waiting.
    pub(crate) fn would_wait(&self, key: &LockKey) {
        let metrics = &self.shared.metrics;
        metrics.contended();
        metrics.contended_key(key.as_str());
        tracing::info!(
            layer = self.shared.config.name.as_str(),
            %key,
            "dry run: would have waited for this key; it runs"
        );
    }
}

/// The lease info of a dry run's request that got no lease on `key` (`None`: it had no
/// key; the dry run's mark alone then names it).
pub(crate) fn unheld(key: Option<&LockKey>) -> LeaseInfo {
    let key = key
        .cloned()
        .unwrap_or_else(|| LockKey::new(DRY_RUN_MARK).expect("the dry run's mark is a valid key"));
    LeaseInfo::unheld_dry_run(key)
}
