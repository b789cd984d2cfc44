//! [`Config`]: a layer's settings as the [`RequestLocker`](super::RequestLocker) runs them,
//! checked by the builder.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;

use super::{LockedMethods, Sharing};
use crate::{
    engine::LockOptions,
    key::KeyExtractor,
    options::{BackendFailurePolicy, MissingKeyPolicy, ReleasePoint},
    reject::{Rejection, RejectionKind},
};

/// Builds a custom response for a rejection. Receives the typed rejection, with its
/// headers already filled in; [`Rejection::into_response`] is the default.
pub(crate) type RejectHook = Arc<dyn Fn(Rejection) -> http::Response<Bytes> + Send + Sync>;

/// A layer's checked settings.
pub(crate) struct Config {
    pub(crate) extractor: Arc<dyn KeyExtractor>,
    /// The layer's namespace, possibly empty.
    pub(crate) namespace: String,
    /// `<namespace>/<kind>/`, escaped ([`crate::key::encode`]): every lock key of the
    /// layer is this followed by an extracted value.
    pub(crate) key_head: String,
    pub(crate) missing: MissingKeyPolicy,
    /// The lease TTL, FIFO mode and waiter limit each lock is taken with (and the wait,
    /// also in `wait`).
    pub(crate) options: LockOptions,
    /// How long a request waits for a held key: zero answers at once.
    pub(crate) wait: Duration,
    /// The answer to a held key when not waiting: `Locked` (423) or, for the idempotency
    /// preset, `Conflict` (409).
    pub(crate) busy: RejectionKind,
    pub(crate) backend_failure: BackendFailurePolicy,
    pub(crate) release: ReleasePoint,
    pub(crate) retry_after_fallback: Duration,
    pub(crate) on_reject: Option<RejectHook>,
    /// The methods that take a lock.
    pub(crate) methods: LockedMethods,
    /// Permits instead of the lock (`permits(n)`, `shared_for([..])`): `None` for the
    /// plain lock.
    pub(crate) sharing: Option<Sharing>,
    /// The base of problem `type` URIs (`None`: the `urn:tower-lock:problem:` URNs).
    pub(crate) problem_type_base: Option<Arc<str>>,
    /// The layer's name: the `layer` label of its metrics and a field of its outage logs.
    pub(crate) name: String,
    /// Whether `name` is the default (no `metrics_name`): `build()` warns when another
    /// live layer on the engine has it too.
    pub(crate) default_name: bool,
    /// Observe only (`dry_run(true)`): no lock another layer meets, no rejection; what
    /// would have happened is counted and logged.
    pub(crate) dry_run: bool,
    /// `log_holds_longer_than`: holds past it are logged at `info` (while still held, and
    /// at their release).
    pub(crate) long_hold: Option<Duration>,
}
