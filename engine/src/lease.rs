//! [`Lease`], the RAII guard of an acquisition, and the state it shares with the watchdog.

use std::{
    fmt,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::time::Instant;

use super::{
    AcquireRequest, ExtendMode, Fence, Grant, LockError, LockKey, MAX_TTL, Mode, Record, Token,
    lock_engine::EngineShared,
    lost::{Lost, LostSignal},
    options::{after, check_ttl, expires_by},
    runtime,
};

mod state;

pub(crate) use state::{LeaseState, LeaseTimes, renew_interval};

/// An acquired lease, of a key's lock or of one of its shared leases: the RAII guard of
/// one acquisition.
///
/// While it lives, the engine's watchdog renews it (unless auto-renew is off). Dropping it
/// releases the key in the background without blocking the dropping thread; call
/// [`Lease::release`] to release and learn the outcome.
pub struct Lease {
    engine: Arc<EngineShared>,
    state: Arc<LeaseState>,
    id: u64,
    fence: Fence,
    waited: Duration,
    /// The release has been handed on (to `release`, or done): drop does nothing more.
    handed_off: bool,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.state.key)
            .field("fence", &self.fence)
            .field("waited", &self.waited)
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}

impl Lease {
    pub(crate) fn new(
        engine: Arc<EngineShared>,
        req: AcquireRequest,
        grant: Grant,
        waited: Duration,
        auto_renew: bool,
    ) -> Self {
        let AcquireRequest {
            key,
            mode,
            token,
            ttl,
            ..
        } = req;
        // A short claim (a hand-off) is renewed to the full TTL at a third of the claim,
        // whether or not the lease renews itself later.
        let first = grant.valid_for.map_or(ttl, |v| v.min(ttl));
        let renew_at = if first < ttl {
            Some(after(grant.granted_at, renew_interval(first)))
        } else {
            auto_renew.then(|| after(grant.granted_at, renew_interval(ttl)))
        };
        let state = LeaseState {
            mode,
            key,
            token,
            ttl_nanos: AtomicU64::new(0),
            configured_ttl: ttl,
            auto_renew,
            lost: Lost::default(),
            released: AtomicBool::new(false),
            filed: AtomicBool::new(false),
            epoch: AtomicU64::new(0),
            granted_at: grant.granted_at,
            resets: engine.resets.clone(),
            slot: grant.slot,
            times: Mutex::new(LeaseTimes {
                deadline: expires_by(grant.granted_at, first),
                renew_at,
            }),
        };
        state.set_ttl(ttl);
        state.lost.valid_until(expires_by(grant.granted_at, first));
        let (state, id) = engine.watchdog.register_new(&engine, state);
        // After registering: a reset from here on is the watchdog's to report.
        if !engine.vouches_for(grant.granted_at) {
            state.mark_lost("the backend was reset after the lease was granted");
        }
        Self {
            engine,
            state,
            id,
            fence: grant.fence,
            waited,
            handed_off: false,
        }
    }

    /// The locked key.
    pub fn key(&self) -> &LockKey {
        &self.state.key
    }

    /// How this lease holds its key: the key's lock, or one of its shared leases.
    pub fn mode(&self) -> Mode {
        self.state.mode
    }

    /// The owner token of this acquisition.
    pub fn token(&self) -> &Token {
        &self.state.token
    }

    /// The fencing token: strictly greater than any earlier acquisition's of this key.
    pub fn fence(&self) -> Fence {
        self.fence
    }

    /// How long the acquisition waited.
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// When the acquisition that was granted was sent (on the in-process engine: when it
    /// was decided). The lease's validity counts from this instant.
    pub fn granted_at(&self) -> Instant {
        self.state.granted_at
    }

    /// The local validity deadline: the backend confirmed the lease until at least this
    /// instant (a send time plus a TTL the backend set, less the millisecond a server's
    /// clock may round down), so it is never later than the backend's own expiry. Renewals move it on; once it passes unrenewed, the lease is
    /// lost.
    pub fn valid_until(&self) -> Instant {
        self.state.times.lock().unwrap().deadline
    }

    /// The lease length the watchdog renews to.
    pub fn ttl(&self) -> Duration {
        self.state.ttl()
    }

    /// Resolves when the lease is lost (see [`LostSignal`]).
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let state = self.state.clone();
        async move { state.wait_lost().await }
    }

    /// A cloneable handle on the lost signal, for handing to other tasks.
    pub fn lost_signal(&self) -> LostSignal {
        LostSignal(self.state.clone())
    }

    /// `true` once the lease is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.state.is_lost_at(Instant::now())
    }

    /// Stop renewing: from here on the lease is being released.
    fn stop(&mut self) {
        self.handed_off = true;
        // SeqCst: read against the watchdog's `filed` (see `Watchdog::release`).
        self.state.set_released(Instant::now(), Ordering::SeqCst);
        self.engine.watchdog.release(self.id, &self.state);
    }

    /// Stop renewing, and return the backend release to run.
    fn begin_release(&mut self) -> impl Future<Output = Result<(), LockError>> + Send + 'static {
        self.stop();
        let engine = self.engine.clone();
        let state = self.state.clone();
        // In flight from now until the backend answered: this engine's next acquire of the
        // key waits for it (see `releasing`).
        let in_flight = engine.releasing.begin(&state.key);
        async move {
            let _in_flight = in_flight;
            let result = engine
                .backend
                .release(&state.key, &state.token, state.mode)
                .await;
            tracing::trace!(key = %state.key, ok = result.is_ok(), "lease released");
            result
        }
    }

    /// Release the key. [`LockError::NotOwned`] or [`LockError::Expired`] mean the lease
    /// had already run out (another owner may hold the key): nothing was changed.
    ///
    /// Cancellation-safe: once this future has been created, the release happens. If it
    /// is dropped before the backend answered, the release finishes in the background.
    pub fn release(mut self) -> impl Future<Output = Result<(), LockError>> + Send + 'static {
        match self.release_in_place(None) {
            Some(result) => runtime::Detachable::ready(result),
            None => runtime::Detachable::new(self.begin_release()),
        }
    }

    /// Whether this lease is released on the spot, on the caller's thread (the in-process
    /// engine): [`drop_at`](Self::drop_at) has then released it when it returns, with no
    /// future made, boxed or polled. A middleware that must release before it hands on a
    /// response's last frame drops such a lease; any other it releases in order.
    #[doc(hidden)]
    pub fn releases_in_place(&self) -> bool {
        self.engine.synchronous.is_some()
    }

    /// Drop the lease (it is released as [dropping](Drop) it releases it) as of `now`, an
    /// instant the caller has just read: the in-process engine's release then reads no
    /// clock of its own (a clock read is a good part of an in-process request's cost). A
    /// caller that times the hold reads the clock once for both.
    pub fn drop_at(mut self, now: Instant) {
        if let Some(result) = self.release_in_place(Some(now))
            && let Err(error) = result
        {
            tracing::debug!(%error, "release on drop did not apply");
        }
        // Otherwise `Drop` releases it in the background, as ever.
    }

    /// Release on the spot if the backend can (the in-process one), as of `now` (`None`:
    /// the clock is read here): no future to make, box or poll. `None`: it cannot,
    /// and nothing was done.
    fn release_in_place(&mut self, now: Option<Instant>) -> Option<Result<(), LockError>> {
        let synchronous = self.engine.synchronous.as_deref()?;
        // `stop`, field by field: `synchronous` borrows the engine.
        self.handed_off = true;
        let at = now.unwrap_or_else(Instant::now);
        self.state.set_released(at, Ordering::SeqCst);
        self.engine.watchdog.release(self.id, &self.state);
        let state = &self.state;
        let result =
            synchronous.release_now(&state.key, &state.token, state.mode, Some(at), state.slot);
        tracing::trace!(key = %state.key, ok = result.is_ok(), "lease released");
        Some(result)
    }

    /// Store `record` under the key for `retention` and release the key, in one atomic
    /// step on the backend (see [`RecordBackend`](super::RecordBackend)): whoever acquires
    /// the key next finds the record. [`LockError::NotOwned`] or [`LockError::Expired`]
    /// mean the lease had already run out: nothing was written, and another holder's
    /// record is never overwritten. A backend without records answers
    /// [`LockError::Unsupported`] and the key is released without one.
    ///
    /// A backend that [refuses](super::BackendError::is_refusal) it for a moment (a Redis
    /// busy with a script, loading, a replica) is asked again, with backoff, while the
    /// lease stays renewed, until the step is taken or the lease's validity runs out: then
    /// the refusal is the error, nothing was written, and the key frees itself with its
    /// TTL.
    ///
    /// Cancellation-safe like [`release`](Self::release).
    pub fn complete(
        mut self,
        record: Record,
        retention: Duration,
    ) -> impl Future<Output = Result<(), LockError>> + Send + 'static {
        // Not `stop`: the lease stays under watch while a refused completion is retried.
        self.handed_off = true;
        self.state.released.store(true, Ordering::Release);
        // In flight as a release is (see `begin_release`): a retry from this node finds
        // the record, not its own lease.
        let in_flight = self.engine.releasing.begin(&self.state.key);
        let complete = super::completion::complete(
            self.engine.clone(),
            self.state.clone(),
            self.id,
            record,
            retention,
        );
        runtime::Detachable::new(async move {
            let _in_flight = in_flight;
            complete.await
        })
    }

    /// Add `by` to the remaining TTL. The new remaining TTL also becomes the length the
    /// watchdog renews to. More than [`MAX_TTL`] in all is [`LockError::InvalidValue`].
    pub async fn extend(&self, by: Duration) -> Result<Duration, LockError> {
        self.change_ttl(by, ExtendMode::Add).await
    }

    /// Replace the remaining TTL with `ttl` (also used for later renewals). More than
    /// [`MAX_TTL`] is [`LockError::InvalidValue`].
    pub async fn extend_to(&self, ttl: Duration) -> Result<Duration, LockError> {
        self.change_ttl(ttl, ExtendMode::Replace).await
    }

    /// Reset the remaining TTL (and the renewal length) to the TTL the lease was acquired
    /// with.
    pub async fn reacquire(&self) -> Result<Duration, LockError> {
        self.change_ttl(self.state.configured_ttl, ExtendMode::Replace)
            .await
    }

    async fn change_ttl(&self, d: Duration, mode: ExtendMode) -> Result<Duration, LockError> {
        check_ttl(d)?;
        if mode == ExtendMode::Add {
            let remaining = self.state.times.lock().unwrap().deadline;
            let total = remaining
                .saturating_duration_since(Instant::now())
                .checked_add(d);
            if total.is_none_or(|t| t > MAX_TTL) {
                return Err(LockError::InvalidValue(
                    "the lease would be longer than MAX_TTL",
                ));
            }
        }
        // Renewals sent before this point may land before or after the extend: none of
        // them may move the deadline this extend sets.
        self.state.epoch.fetch_add(1, Ordering::AcqRel);
        let sent = Instant::now();
        let state = &self.state;
        let result = self
            .engine
            .backend
            .extend(&state.key, &state.token, state.mode, d, mode)
            .await;
        match &result {
            Ok(remaining) => {
                let remaining = (*remaining).min(MAX_TTL);
                self.state.set_ttl(remaining);
                {
                    let mut t = self.state.times.lock().unwrap();
                    self.state.set_deadline(&mut t, expires_by(sent, remaining));
                    t.renew_at = self
                        .state
                        .auto_renew
                        .then(|| after(sent, renew_interval(remaining)));
                }
                self.engine.watchdog.reschedule(self.id, &self.state);
            }
            Err(LockError::NotOwned | LockError::Expired) => {
                self.state.mark_lost("extend found the lease gone");
            }
            Err(_) if mode == ExtendMode::Replace => {
                // It may still land: a shorter TTL would then hold from about now on.
                let mut t = self.state.times.lock().unwrap();
                let deadline = t.deadline.min(expires_by(sent, d));
                self.state.set_deadline(&mut t, deadline);
                drop(t);
                self.engine.watchdog.reschedule(self.id, &self.state);
            }
            Err(_) => {}
        }
        result
    }

    /// `true` if this lease's token still holds the key on the backend.
    pub async fn owned(&self) -> Result<bool, LockError> {
        let state = &self.state;
        let holders = self.engine.backend.holders(&state.key).await?;
        Ok(holders.iter().any(|h| h.token == state.token))
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.handed_off {
            return;
        }
        if let Some(result) = self.release_in_place(None) {
            if let Err(error) = result {
                tracing::debug!(%error, "release on drop did not apply");
            }
            return;
        }
        // Never block the dropping thread, and never depend on its runtime: the release
        // starts here and, if it needs a round trip, finishes on the engine's runtime.
        let release = self.begin_release();
        runtime::detach(async move {
            if let Err(error) = release.await {
                tracing::debug!(%error, "release on drop did not apply");
            }
        });
    }
}
