//! [`lock_setters!`]: the setters of the lock settings
//! ([`LockSettings`](tower_lock_core::settings::LockSettings)), written once for both
//! middlewares' builders.

/// The setters of the lock settings, for a builder with a `settings: LockSettings` field:
/// written once, so that both middlewares' builders offer every shared lock setting by the
/// same name and document it the same way.
macro_rules! lock_setters {
    () => {
        /// The layer's namespace: the first part of each of its lock keys
        /// (`<namespace>/<kind>/<value>`, see [`key`](crate::key#the-lock-key)), and of its
        /// idempotency records. Layers on one engine with different namespaces never share
        /// a lock, whatever their clients send; layers with the same namespace and
        /// extractors of the same kind share their locks (one tenant lock over several
        /// routes, say). Give each layer keyed by a closure a namespace of its own. Any text
        /// without control characters. Default: empty.
        pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
            self.settings.namespace = namespace.into();
            self
        }

        /// Lock exactly the requests with one of these methods; the others pass through
        /// unlocked (no key is extracted, so a keyless `GET` next to a keyed `POST` on one
        /// route is not answered `400`).
        ///
        /// Default: every method but the safe ones of RFC 9110 (§9.2.1): `GET`, `HEAD`,
        /// `OPTIONS` and `TRACE` pass through unlocked, so a CORS preflight or a status
        /// read never waits behind a write nor meets a `423`; `POST`, `PUT`, `PATCH`,
        /// `DELETE` and extension methods are locked. Name `GET` here for reads that must
        /// not run beside a write. Under idempotency the default is `POST` and `PATCH`
        /// (the methods that are not idempotent by definition).
        ///
        /// Naming `GET` names `HEAD` too: a `HEAD` is a `GET` without its body, and axum and
        /// actix-web answer it with the `GET` handler, so it must not run beside a writer.
        ///
        /// Methods are named as text (`"POST"`) or by any type that is one (`http`'s
        /// `Method` of either version, so actix-web's `Method::POST` too). Methods are
        /// case-sensitive. `build` refuses an empty list
        /// ([`ConfigError::NoMethods`](crate::ConfigError::NoMethods)) and a name that is
        /// not a method, or a standard one in the wrong case such as `post`
        /// ([`ConfigError::InvalidMethod`](crate::ConfigError::InvalidMethod)).
        ///
        /// ```
        /// use tower_lock::{LockEngine, LockLayer, http::Method, key::PathKey};
        ///
        /// let layer = LockLayer::builder(LockEngine::in_memory())
        ///     .key(PathKey)
        ///     .methods(["POST", "PUT", "DELETE"])
        ///     .build()
        ///     .unwrap();
        /// // The same, by type.
        /// let same = LockLayer::builder(LockEngine::in_memory())
        ///     .key(PathKey)
        ///     .methods([Method::POST, Method::PUT, Method::DELETE])
        ///     .build()
        ///     .unwrap();
        /// # let _ = (layer, same);
        /// ```
        pub fn methods<M: AsRef<str>>(mut self, methods: impl IntoIterator<Item = M>) -> Self {
            self.settings.methods(methods);
            self
        }

        /// What to do with a request without a key. Default:
        /// [`MissingKeyPolicy::Reject`](crate::MissingKeyPolicy::Reject) (`400`).
        pub fn on_missing_key(mut self, policy: $crate::MissingKeyPolicy) -> Self {
            self.settings.missing = policy;
            self
        }

        /// The lease length; renewed while the request runs, so it bounds how long a
        /// crashed node blocks the key (and, under idempotency, how soon a retry runs again
        /// after the process running the first request died), not how long a request may
        /// take. At least 1 ms and at most a day, or `build` fails; the engine rounds a TTL
        /// under its [`MIN_TTL`](crate::engine::MIN_TTL) (10 ms) up to it. Default: 30 s.
        pub fn ttl(mut self, ttl: std::time::Duration) -> Self {
            self.settings.ttl(ttl);
            self
        }

        /// How long a request waits for a held key. `Duration::ZERO` (the default) answers
        /// at once: `423 Locked` (`409 Conflict` under idempotency). Otherwise a wait that
        /// runs out is answered `429 Too Many Requests`; under idempotency a duplicate that
        /// waits for the request in flight then receives its replay.
        pub fn wait(mut self, wait: std::time::Duration) -> Self {
            self.settings.wait(wait);
            self
        }

        /// Grant waiting requests the key in arrival order. Needs a wait limit. Default: off.
        pub fn fifo(mut self, fifo: bool) -> Self {
            self.settings.fifo(fifo);
            self
        }

        /// At most `max` requests wait per key; more are answered `429` at once. Needs a
        /// wait limit, and at least 1 (with no room to wait, set no wait limit instead: a
        /// held key is then answered at once). Default: no limit.
        pub fn max_waiters(mut self, max: usize) -> Self {
            self.settings.max_waiters(max);
            self
        }

        /// What to do when the backend fails. Default:
        /// [`BackendFailurePolicy::FailClosed`](crate::BackendFailurePolicy::FailClosed)
        /// (the only policy idempotency accepts: running without the record would run a
        /// completed request twice).
        pub fn on_backend_failure(mut self, policy: $crate::BackendFailurePolicy) -> Self {
            self.settings.backend_failure = policy;
            self
        }

        /// The `Retry-After` sent when nothing better is known: a `503`, or contention
        /// before the layer has observed a hold (after that, the 95th percentile of its
        /// recent hold times). Set it to how long your handler usually takes if that is
        /// much more than a second. Less what this node's holder has already held the key;
        /// never more than its remaining lease; rounded to whole seconds, at least 1.
        /// Default: 1 s.
        pub fn retry_after_fallback(mut self, d: std::time::Duration) -> Self {
            self.settings.retry_after_fallback(d);
            self
        }

        /// Build rejection responses with `hook` instead of the default problem+json.
        pub fn on_reject<F>(mut self, hook: F) -> Self
        where
            F: Fn($crate::Rejection) -> http::Response<bytes::Bytes> + Send + Sync + 'static,
        {
            self.settings.on_reject(hook);
            self
        }

        /// The base of the problem `type` URIs of rejections, so they point at your own
        /// documentation: `https://example.com/problems/` makes a `423` answer with
        /// `"type": "https://example.com/problems/locked"` (the base followed by
        /// [`RejectionKind::slug`](crate::RejectionKind::slug)). Default: the
        /// `urn:tower-lock:problem:` URNs. A base that is not a valid URI is refused by
        /// `build`. Every rejection also carries `instance`, the request path (RFC 9457).
        pub fn problem_type_base(mut self, base: impl Into<String>) -> Self {
            self.settings.problem_type_base(base.into());
            self
        }

        /// The layer's name in its metrics (the `layer` label of every series recorded
        /// through the `metrics` facade, see [`metrics`](crate::metrics)) and in its outage
        /// logs. Default: the namespace, or the key extractor's
        /// [kind](crate::key::KeyExtractor::kind) when the namespace is empty
        /// (`idempotency-key` under idempotency). `build` logs a warning when a layer takes
        /// a default name that a live layer on the same engine has already (two
        /// `RouteKey` layers are both `axum-route`): give each its own name.
        pub fn metrics_name(mut self, name: impl Into<String>) -> Self {
            self.settings.metrics_name(name.into());
            self
        }

        /// Observe only, for a rollout: take no lock that another layer (or a job on the
        /// same keys) could meet, reject nothing, and record in the same metrics and logs
        /// what the layer would have done. Every request runs; one that would have been
        /// answered (`400`, `409`, `423`, `429`, `500`, `503`; under idempotency, a replay or
        /// a `422`) is counted as that answer (`rejected`, `replayed`) and logged at `info`
        /// (`dry run: would have…`); one that would have waited is counted as contended.
        ///
        /// Its leases are taken on keys of its own (its keys behind a `%!dry-run/` mark, see
        /// [`key_for`](crate::RequestLocker::key_for)) and never waited for, so
        /// that its requests see each other across the fleet; under idempotency its
        /// records are stored there too, so that retries show what would have been
        /// replayed. A handler finds that lease in its extensions, as under the lock; a
        /// request it would have rejected or made wait finds one too, holding nothing
        /// (fence `0`, a lost signal that never fires), so that extractors such as
        /// tower-lock-axum's `Locked` answer as under the enforcing layer rather than
        /// `500`: [`LeaseInfo::is_dry_run`](crate::LeaseInfo::is_dry_run) tells them apart
        /// from a real lease. Do not trust a fence in a dry run. The one answer a dry run
        /// still gives is an
        /// idempotent request body found over `max_request_body` while it is read (one
        /// whose declared length is over it runs). Default: off.
        ///
        /// ```
        /// use tower_lock::{LockEngine, LockLayer, key::HeaderKey};
        ///
        /// let layer = LockLayer::builder(LockEngine::in_memory())
        ///     .key(HeaderKey::new("x-tenant-id"))
        ///     .dry_run(true)
        ///     .build()
        ///     .unwrap();
        /// assert!(layer.locker().is_dry_run());
        /// ```
        pub fn dry_run(mut self, observe_only: bool) -> Self {
            self.settings.dry_run = observe_only;
            self
        }

        /// Log at `info` every hold of this layer that lasts `threshold` or longer: once
        /// while it is still held (`lock held longer than the threshold`, seen within a
        /// second of crossing it, so a hung handler shows up before it ends) and at its
        /// release (`long hold released`). Each line names `key`, `fence`, `holder` (the
        /// lease's holder label) and `held`, within the request's span. Every grant and
        /// release is logged at `debug` whatever the threshold. Default: none (no
        /// `info` line). See `docs/runbook.md`.
        ///
        /// ```
        /// use std::time::Duration;
        /// use tower_lock::{LockEngine, LockLayer, key::HeaderKey};
        ///
        /// let layer = LockLayer::builder(LockEngine::in_memory())
        ///     .key(HeaderKey::new("x-tenant-id"))
        ///     .log_holds_longer_than(Duration::from_secs(5))
        ///     .build()
        ///     .unwrap();
        /// # drop(layer);
        /// ```
        pub fn log_holds_longer_than(mut self, threshold: std::time::Duration) -> Self {
            self.settings.long_hold = Some(threshold);
            self
        }
    };
}

pub(crate) use lock_setters;
