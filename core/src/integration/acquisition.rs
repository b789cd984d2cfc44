//! The acquisition: from a request to an [`Outcome`], decided at once when the key is free
//! on the in-process engine, else in one boxed future (waiting, the network, the degrade
//! policy's two locks), with contention and backend failures turned into rejections.

use std::{
    task::{Context, Poll, Waker},
    time::Duration,
};

use tokio::time::Instant;
use tracing::Instrument;

use super::{
    LockGuard, Outcome, RequestLocker,
    guard::{Granted, HeldAs},
    hold_log,
};
use crate::{
    LockError,
    engine::{BoxFuture, HolderLabel, Lease, Lock, LockEngine, LockKey, Mode},
    key::RequestView,
    lease_info::LeaseInfo,
    metrics::HoldFacts,
    options::BackendFailurePolicy,
    reject::RejectionKind,
    retry_after,
};

/// The first step of an acquisition: decided at once (no future at all), or a future to
/// wait for.
pub enum Acquisition {
    /// Decided while the request was called: a free key on the in-process engine, a
    /// method the layer does not lock, no key, a rejection.
    Decided(Outcome),
    /// To be waited for: a held key, or a backend across the network.
    Pending(BoxFuture<'static, Outcome>),
}

impl std::fmt::Debug for Acquisition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Decided(outcome) => f.debug_tuple("Decided").field(outcome).finish(),
            Self::Pending(_) => f.debug_tuple("Pending").finish_non_exhaustive(),
        }
    }
}

impl RequestLocker {
    /// Decide for `req`: extract its key, then acquire the key as configured. Waiting, if
    /// any, happens in the returned future, which borrows nothing from `req`; dropping it
    /// gives up the wait and leaves nothing behind.
    pub fn acquire(&self, req: &dyn RequestView) -> BoxFuture<'static, Outcome> {
        match self.start_acquisition(req) {
            Acquisition::Decided(outcome) => Box::pin(std::future::ready(outcome)),
            Acquisition::Pending(fut) => fut,
        }
    }

    /// [`acquire`](Self::acquire) without a future when none is needed: a request decided
    /// at once (a free key on the in-process engine, a method the layer does not lock, no
    /// key, a rejection) costs no allocation.
    pub fn start_acquisition(&self, req: &dyn RequestView) -> Acquisition {
        if !self.locks_method(req.method()) || self.passes_unrouted(req) {
            return Acquisition::Decided(Outcome::Unlocked);
        }
        match self.key(req) {
            Err(rejection) => {
                Acquisition::Decided(self.observed(Outcome::Rejected(rejection), None))
            }
            Ok(None) => {
                tracing::debug!("no lock key; running unlocked");
                self.shared.metrics.unlocked();
                Acquisition::Decided(Outcome::Unlocked)
            }
            Ok(Some(key)) => {
                // The method is asked again only by a layer with permits: the plain lock's
                // path stays as it was.
                let take = match &self.shared.config.sharing {
                    None => Mode::Exclusive,
                    Some(sharing) => sharing.take(req.method()),
                };
                // A free key on the in-process engine is granted right here, with no future
                // (boxed or not): the request goes straight to the inner service. Not under
                // the degrade policy, which takes two locks in turn, nor for permits, which
                // the engine grants in a future.
                // The engine's label with the route the router matched: who holds the key,
                // for `holders()` and `tower-lock-cli status`.
                let label = req.route_template().and_then(|route| {
                    self.shared
                        .engine
                        .label()
                        .map(|label| self.shared.route_labels.get(label, &route))
                });
                if self.shared.local.is_none() && take == Mode::Exclusive {
                    let lock = self.lock_handle(
                        &self.shared.engine,
                        &key,
                        self.shared.config.wait,
                        label.as_ref(),
                    );
                    if let Some(result) = lock.acquire_now() {
                        // Asked first: a disabled span still costs a request some work (its
                        // fields are recorded for the `log` fallback).
                        let _span = tracing::enabled!(tracing::Level::DEBUG)
                            .then(|| tracing::debug_span!("tower_lock.acquire", %key).entered());
                        // Decided at once: no wait to time, so no clock read of its own.
                        let outcome = self.settle(result, &key, take, None);
                        return Acquisition::Decided(self.observed(outcome, Some(&key)));
                    }
                }
                // It must wait (or the backend answers over the network): one boxed future,
                // polled once here, so that a waiter takes its place in the queue (and a
                // network request is sent) when the request is called, not when its future
                // is first polled: FIFO order is the order of calls.
                let span = tracing::debug_span!("tower_lock.acquire", %key);
                let metrics = self.shared.metrics.clone();
                let lock = self.clone().lock_as(key, take, label);
                let mut acquire: BoxFuture<'static, Outcome> = Box::pin(
                    async move {
                        let mut lock = std::pin::pin!(lock);
                        // Counted as waiting from a first poll that did not decide, until
                        // the acquisition ends or is given up (this future is dropped).
                        let mut waiting = None;
                        std::future::poll_fn(|cx| {
                            let poll = lock.as_mut().poll(cx);
                            if poll.is_pending() && waiting.is_none() {
                                waiting = Some(metrics.waiting());
                            }
                            poll
                        })
                        .await
                    }
                    .instrument(span),
                );
                let mut cx = Context::from_waker(Waker::noop());
                match acquire.as_mut().poll(&mut cx) {
                    Poll::Ready(outcome) => Acquisition::Decided(outcome),
                    Poll::Pending => Acquisition::Pending(acquire),
                }
            }
        }
    }

    /// Take `key` with the lock (idempotency replay's way: its layers have no permits).
    #[cfg_attr(not(feature = "idempotency"), allow(dead_code))]
    pub(crate) async fn lock(self, key: LockKey) -> Outcome {
        self.lock_as(key, Mode::Exclusive, None).await
    }

    /// Take `key` as `take` says.
    async fn lock_as(self, key: LockKey, take: Mode, label: Option<HolderLabel>) -> Outcome {
        let started = Instant::now();
        let outcome = match &self.shared.local {
            Some(local) => {
                self.lock_degradable(local, key.clone(), take, started, label.as_ref())
                    .await
            }
            None => {
                let result = self
                    .lock_on(
                        &self.shared.engine,
                        &key,
                        self.shared.config.wait,
                        take,
                        label.as_ref(),
                    )
                    .await;
                self.settle(result, &key, take, Some(started))
            }
        };
        self.observed(outcome, Some(&key))
    }

    /// The outcome of an acquisition on the engine (not under the degrade policy), begun at
    /// `started` (`None`: decided at once, without waiting).
    pub(super) fn settle(
        &self,
        result: Result<Lease, LockError>,
        key: &LockKey,
        take: Mode,
        started: Option<Instant>,
    ) -> Outcome {
        let c = &self.shared.config;
        self.backend_answered(&result);
        match result {
            Ok(lease) => self.held(lease, None, take, started, false),
            // A dry run never waits: a held key where the layer would have waited.
            Err(e) if c.dry_run && e.is_contention() && !c.wait.is_zero() => {
                self.would_wait(key);
                Outcome::Observed(LeaseInfo::unheld_dry_run(key.clone()))
            }
            Err(LockError::Backend(error)) => match c.backend_failure {
                // (A degrading locker locks in `lock_degradable`.)
                BackendFailurePolicy::FailClosed | BackendFailurePolicy::Degrade => {
                    self.shared
                        .outage
                        .failed(&c.name, &error, BackendFailurePolicy::FailClosed);
                    Outcome::Rejected(self.reject(
                        RejectionKind::BackendUnavailable,
                        "the lock service is unavailable".to_owned(),
                        Some(c.retry_after_fallback),
                    ))
                }
                BackendFailurePolicy::FailOpen => {
                    self.shared
                        .outage
                        .failed(&c.name, &error, BackendFailurePolicy::FailOpen);
                    self.shared.metrics.unlocked();
                    Outcome::Unlocked
                }
            },
            Err(e) => self.refuse(&e, key),
        }
    }

    /// The degrade policy: the node-local lock first, then the backend's. The node-local
    /// lease is kept for the whole request, so the node stays serialized per key even
    /// when the backend stalls while some requests hold its lock and others fall back.
    async fn lock_degradable(
        &self,
        local: &LockEngine,
        key: LockKey,
        take: Mode,
        started: Instant,
        label: Option<&HolderLabel>,
    ) -> Outcome {
        let c = &self.shared.config;
        let node = match self.lock_on(local, &key, c.wait, take, label).await {
            Ok(lease) => lease,
            Err(e) => return self.refuse(&e, &key),
        };
        // What is left of the wait; a waiting layer keeps waiting (and answers 429, not
        // 423, when nothing is left).
        let wait = if c.wait.is_zero() {
            Duration::ZERO
        } else {
            c.wait
                .saturating_sub(started.elapsed())
                .max(Duration::from_millis(1))
        };
        let result = self
            .lock_on(&self.shared.engine, &key, wait, take, label)
            .await;
        self.backend_answered(&result);
        match result {
            Ok(lease) => self.held(lease, Some(node), take, Some(started), false),
            Err(LockError::Backend(error)) => {
                self.shared
                    .outage
                    .failed(&c.name, &error, BackendFailurePolicy::Degrade);
                self.shared.metrics.degraded();
                self.held(node, None, take, Some(started), true)
            }
            Err(e) => self.refuse(&e, &key),
        }
    }

    /// Ends an outage, if one was logged, when the backend answered (anything but a
    /// backend failure is an answer: a grant, a refusal, a wait that ran out).
    fn backend_answered(&self, result: &Result<Lease, LockError>) {
        if !matches!(result, Err(LockError::Backend(_))) {
            self.shared.outage.answered(&self.shared.config.name);
        }
    }

    async fn lock_on(
        &self,
        engine: &LockEngine,
        key: &LockKey,
        wait: Duration,
        take: Mode,
        label: Option<&HolderLabel>,
    ) -> Result<Lease, LockError> {
        self.lock_handle(engine, key, wait, label)
            .in_mode(take)
            .acquire()
            .await
    }

    /// The lock this locker takes on `key`, waiting up to `wait` (zero: not at all),
    /// labelled `label` (`None`: the engine's label).
    pub(super) fn lock_handle(
        &self,
        engine: &LockEngine,
        key: &LockKey,
        wait: Duration,
        label: Option<&HolderLabel>,
    ) -> Lock {
        // Option by option, not `Lock::options`: what the layer does not set (auto-renewal,
        // a waiter limit when it has none) stays the engine's default.
        let options = &self.shared.config.options;
        // A dry run never makes a request wait: it only learns that it would have.
        let wait = if self.shared.config.dry_run {
            Duration::ZERO
        } else {
            wait
        };
        let lock = engine
            .lock_on(key.clone())
            .ttl(options.lease_ttl())
            .fifo(options.is_fifo() && !wait.is_zero())
            .wait(wait);
        let lock = match label {
            Some(label) => lock.holder_label(label.clone()),
            None => lock,
        };
        match options.waiter_limit() {
            Some(max) if !wait.is_zero() => lock.max_waiters(max),
            _ => lock,
        }
    }

    /// The outcome of a grant of an acquisition begun at `started` (`None`: decided at
    /// once).
    fn held(
        &self,
        lease: Lease,
        node: Option<Lease>,
        take: Mode,
        started: Option<Instant>,
        degraded: bool,
    ) -> Outcome {
        let (now, waited) = match started {
            Some(started) => {
                let now = Instant::now();
                (now, now.saturating_duration_since(started))
            }
            // Decided at once: it waited for nothing, and began when the engine decided
            // (the clock the engine read then serves: a clock read is a good part of an
            // in-process request's cost).
            None => (lease.granted_at(), Duration::ZERO),
        };
        // A non-waiting acquire that succeeded found the key free. A waiting one: the
        // engine cannot say whether it queued, so a grant that took a millisecond or more
        // is counted as contended.
        // A dry run never waits: its grants found the key free.
        let c = &self.shared.config;
        let contended = !c.wait.is_zero() && !c.dry_run && waited >= Duration::from_millis(1);
        let facts = HoldFacts {
            lost: lease.lost_signal(),
            fence: lease.fence().get(),
            label: hold_log::holder_label(&self.shared.engine),
            // The request's span, for the lines logged away from it: the release (often
            // where the server drops the body, outside any span) and the watch task's.
            // Kept only when one of them is logged: two reference counts a request.
            span: (self.shared.metrics.long_hold().is_some()
                || tracing::enabled!(tracing::Level::DEBUG))
            .then(|| {
                let dispatch = tracing::dispatcher::get_default(tracing::Dispatch::clone);
                (tracing::Span::current(), dispatch)
            }),
        };
        hold_log::acquired(&facts, contended.then_some(waited), degraded);
        let hold = self.shared.metrics.acquired(waited, contended, facts, now);
        if contended {
            self.shared.metrics.contended_key(lease.key().as_str());
        }
        // Where this node's holder of the key began, for a contender's `Retry-After`: the
        // lock's holder, a permit taken alone (`permits(1)`, a writer beside `shared_for`
        // readers), or the first of the shared holders here, whose hold, begun first,
        // usually ends first and frees a permit.
        let metrics = &self.shared.metrics;
        let held_as = match take {
            Mode::Exclusive => HeldAs::Alone(metrics.began(lease.key(), now)),
            shared if shared.is_alone() => HeldAs::Permit {
                _in_use: metrics.permit(true),
                holder: Some(metrics.began(lease.key(), now)),
            },
            _ => HeldAs::Permit {
                _in_use: metrics.permit(false),
                holder: metrics.began_first(lease.key(), now),
            },
        };
        let info = LeaseInfo::new(
            lease.fence(),
            waited,
            lease.lost_signal(),
            degraded,
            c.dry_run,
        );
        Outcome::Locked(LockGuard::new(
            lease,
            node,
            info,
            Granted { at: now, hold },
            self.shared.metrics.clone(),
            self.shared.config.release,
            held_as,
        ))
    }

    fn refuse(&self, error: &LockError, key: &LockKey) -> Outcome {
        let c = &self.shared.config;
        if error.is_contention() {
            self.shared.metrics.contended_key(key.as_str());
        }
        // What this layer has seen of hold times, less what the holder has already had
        // when it is this layer's (on this node), bounded by its remaining lease.
        let retry = retry_after::contended(
            self.shared.metrics.recent_hold(),
            self.shared.metrics.holder_elapsed(key),
            error.retry_after(),
            c.retry_after_fallback,
        );
        let (kind, detail) = match &error {
            LockError::Busy { .. } if c.busy == RejectionKind::Conflict => (
                RejectionKind::Conflict,
                "a request with the same idempotency key is still being processed".to_owned(),
            ),
            LockError::Busy { .. } => (
                RejectionKind::Locked,
                "another request holds the lock for this resource".to_owned(),
            ),
            LockError::TimedOut { waited, .. } => (
                RejectionKind::TimedOut,
                format!(
                    "waited {} ms for the lock without getting it",
                    waited.as_millis()
                ),
            ),
            LockError::QueueFull { .. } => (
                RejectionKind::QueueFull,
                "too many requests are already waiting for this lock".to_owned(),
            ),
            LockError::InvalidKey(e) => {
                return Outcome::Rejected(self.reject(
                    RejectionKind::MalformedKey,
                    format!("the lock key is unusable: {e}"),
                    None,
                ));
            }
            other => {
                tracing::error!(error = %other, "lock acquisition failed");
                return Outcome::Rejected(self.reject(
                    RejectionKind::BackendUnavailable,
                    "the lock service is unavailable".to_owned(),
                    Some(c.retry_after_fallback),
                ));
            }
        };
        Outcome::Rejected(self.reject(kind, detail, Some(retry)))
    }
}
