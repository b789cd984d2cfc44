//! [`Lock`]: a handle on one key with its acquisition mode and options; acquiring it
//! yields a [`Lease`].

use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use super::{
    AcquireRequest, Acquired, Grant, GrantOrRecord, Holder, HolderLabel, KeyError, Lease,
    LockEngine, LockError, LockKey, LockOptions, LockStatus, Mode, Token, options,
};

/// A handle on one key of a [`LockEngine`], with its acquisition mode and options.
///
/// Setters consume and return the handle; [`Lock::acquire`] and [`Lock::try_acquire`]
/// yield a [`Lease`], on which release, extend, reacquire and owned live. By default it
/// takes the key's lock ([`Mode::Exclusive`]); [`shared`](Self::shared) makes it take one
/// of the key's shared leases instead (a keyed concurrency limit). The lock excludes the
/// key's shared leases and they it, so shared leases for readers and the lock for
/// writers make a read-write lock (see [`Mode`]).
///
/// ```
/// use tower_lock_engine::LockEngine;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_lock_engine::LockError> {
/// let engine = LockEngine::in_memory();
/// let tenant = engine.lock("tenant:7").shared(2);
/// let first = tenant.acquire().await?;
/// let second = tenant.acquire().await?;
/// // Two of two are held: a third is refused without waiting.
/// assert!(tenant.try_acquire().await.is_err());
/// drop((first, second));
///
/// // Readers share, a writer is alone.
/// let reader = engine.lock("doc:1").shared(u32::MAX).acquire().await?;
/// assert!(engine.lock("doc:1").try_acquire().await.is_err());
/// reader.release().await?;
/// let writer = engine.lock("doc:1").acquire().await?;
/// assert!(writer.fence().get() > 0);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Lock {
    pub(crate) engine: LockEngine,
    key: Result<LockKey, KeyError>,
    mode: Mode,
    options: LockOptions,
    token: Option<Token>,
    /// `None`: the engine's.
    label: Option<HolderLabel>,
}

impl Lock {
    #[inline]
    pub(super) fn new(
        engine: LockEngine,
        key: Result<LockKey, KeyError>,
        options: LockOptions,
    ) -> Self {
        Self {
            engine,
            key,
            mode: Mode::Exclusive,
            options,
            token: None,
            label: None,
        }
    }

    /// Take one of the key's shared leases: granted while fewer than `limit` hold the key
    /// and nobody holds it alone (its lock, or a shared lease with a limit of 1);
    /// `shared(1)` holds alone, as the lock does, `u32::MAX` is no limit, `0` makes every
    /// acquisition fail with [`LockError::InvalidValue`]. The key's lock and its shared
    /// leases exclude each other and wait in one queue (see [`Mode`]).
    /// [`LockError::Unsupported`] on a backend without shared mode.
    #[inline]
    pub fn shared(self, limit: u32) -> Self {
        self.in_mode(Mode::Shared { limit })
    }

    /// Take the key's lock (the default): hold it alone, beside no other holder of either
    /// mode. After [`shared`](Self::shared), it undoes it: `lock(k).shared(n).exclusive()`
    /// is `lock(k)`.
    #[inline]
    pub fn exclusive(self) -> Self {
        self.in_mode(Mode::Exclusive)
    }

    /// Take the key in `mode` (see [`Mode`]).
    #[inline]
    pub fn in_mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// How this handle takes its key.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Replace all options.
    #[inline]
    pub fn options(mut self, options: LockOptions) -> Self {
        self.options = options;
        self
    }

    /// See [`LockOptions::ttl`]: at least [`MIN_TTL`](crate::MIN_TTL) (a shorter TTL is
    /// rounded up to it), at most [`MAX_TTL`](crate::MAX_TTL).
    #[inline]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.options = self.options.ttl(ttl);
        self
    }

    /// See [`LockOptions::wait`].
    #[inline]
    pub fn wait(mut self, wait: Duration) -> Self {
        self.options = self.options.wait(wait);
        self
    }

    /// See [`LockOptions::fifo`].
    #[inline]
    pub fn fifo(mut self, fifo: bool) -> Self {
        self.options = self.options.fifo(fifo);
        self
    }

    /// See [`LockOptions::max_waiters`].
    #[inline]
    pub fn max_waiters(mut self, max: usize) -> Self {
        self.options = self.options.max_waiters(max);
        self
    }

    /// See [`LockOptions::auto_renew`].
    #[inline]
    pub fn auto_renew(mut self, on: bool) -> Self {
        self.options = self.options.auto_renew(on);
        self
    }

    /// Acquire with this owner token instead of a fresh random one. Acquiring a key that
    /// this token already holds succeeds, refreshes its TTL and keeps its fence
    /// (reentrancy by owner). A shared lease taken with a limit above 1 is never made
    /// alone: asking to hold alone (the lock, or `shared(1)`) with its token is
    /// [`LockError::InvalidValue`], beside other holders and for the sole holder alike (an
    /// upgrade would have to wait for the others, and two holders asking at once would
    /// each wait for the other). A token holding alone re-enters with any mode.
    #[inline]
    pub fn token(mut self, token: Token) -> Self {
        self.token = Some(token);
        self
    }

    /// Stored with the lease instead of the engine's label (see
    /// [`LockEngine::holder_label`]), for [`holders`](super::Backend::holders) to show; a
    /// layer passes the engine's label with its route template
    /// ([`HolderLabel::with_detail`]).
    #[inline]
    pub fn holder_label(mut self, label: HolderLabel) -> Self {
        self.label = Some(label);
        self
    }

    /// The key, if valid.
    pub fn key(&self) -> Result<&LockKey, LockError> {
        self.key
            .as_ref()
            .map_err(|e| LockError::InvalidKey(e.clone()))
    }

    /// Acquire the key, waiting up to the configured wait limit.
    ///
    /// Errors: [`LockError::TimedOut`] after the wait limit ([`LockError::Busy`] when the
    /// limit is zero), [`LockError::QueueFull`], [`LockError::InvalidKey`],
    /// [`LockError::Backend`]. Dropping the future while it waits leaves nothing behind.
    ///
    /// Never returns a lease that is already lost: a grant whose validity ran out before it
    /// reached the caller (its runtime stalled past a hand-off's claim) is asked for again
    /// with the same token, which confirms it if the key is still ours, and otherwise goes
    /// on waiting within the limit (then [`LockError::TimedOut`]). It is asked again while
    /// the wait allows (once more for a wait of zero), yielding between attempts; a grant
    /// that ran out once the wait is spent is given back by token, and the acquire fails
    /// as a wait that ran out does ([`LockError::Busy`] for a wait of zero).
    pub async fn acquire(&self) -> Result<Lease, LockError> {
        self.acquire_with(self.options.wait).await
    }

    /// Acquire the key only if it is free now; otherwise [`LockError::Busy`] with the
    /// holder's remaining TTL.
    pub async fn try_acquire(&self) -> Result<Lease, LockError> {
        self.acquire_with(Some(Duration::ZERO)).await
    }

    /// [`acquire`](Self::acquire), decided synchronously when the backend can (the
    /// in-process [`MemoryBackend`](crate::MemoryBackend) handed to [`LockEngine::new`]: a
    /// free key, or a refusal that needs no wait); `None` when the backend cannot, or the
    /// caller must wait: then `acquire` it. No future is made or boxed, so a middleware's
    /// uncontended request allocates none for its lock.
    ///
    /// ```
    /// use tower_lock_engine::LockEngine;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_lock_engine::LockError> {
    /// let engine = LockEngine::in_memory();
    /// let lock = engine.lock("k");
    /// let lease = match lock.acquire_now() {
    ///     Some(decided) => decided?,
    ///     None => lock.acquire().await?,
    /// };
    /// lease.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn acquire_now(&self) -> Option<Result<Lease, LockError>> {
        let synchronous = self.engine.shared.synchronous.as_deref()?;
        let (req, started) = match self.request(self.options.wait) {
            Ok(prepared) => prepared,
            Err(e) => return Some(Err(e)),
        };
        let grant = synchronous.acquire_now(&req, started)?;
        // Decided without waiting: it waited for nothing (and reads no clock to say so).
        Some(grant.map(|grant| self.lease(req, grant, Duration::ZERO)))
    }

    /// The backend's request for an acquisition waiting up to `wait`, and when it started.
    fn request(&self, wait: Option<Duration>) -> Result<(AcquireRequest, Instant), LockError> {
        let key = self.key()?.clone();
        options::check_ttl(self.options.ttl)?;
        if let Mode::Shared { limit } = self.mode {
            if limit == 0 {
                return Err(LockError::InvalidValue("a shared limit must be at least 1"));
            }
            if !self.engine.shared.backend.has_shared_mode() {
                return Err(LockError::Unsupported("shared leases"));
            }
        }
        // The in-process backend's tokens never leave the process: a thread's generator
        // serves them, not a system call each.
        let token = match (&self.token, &self.engine.shared.synchronous) {
            (Some(token), _) => token.clone(),
            (None, Some(_)) => Token::random_local(),
            (None, None) => Token::random(),
        };
        let started = Instant::now();
        // A wait the clock cannot represent is a wait without limit.
        let wait = wait.filter(|w| started.checked_add(*w).is_some());
        let req = AcquireRequest {
            key,
            mode: self.mode,
            token,
            ttl: self.options.ttl,
            wait,
            fifo: self.options.fifo,
            max_waiters: self.options.max_waiters,
            label: self
                .label
                .clone()
                .or_else(|| self.engine.shared.label.clone()),
            line: Default::default(),
        };
        Ok((req, started))
    }

    /// The lease of a granted `req`.
    fn lease(&self, req: AcquireRequest, grant: Grant, waited: Duration) -> Lease {
        tracing::trace!(key = %req.key, mode = ?req.mode, fence = grant.fence.get(), ?waited, "lease acquired");
        Lease::new(
            self.engine.shared.clone(),
            req,
            grant,
            waited,
            self.options.auto_renew,
        )
    }

    /// Wait for this engine's calls of `req`'s key that must reach the backend first: its
    /// releases begun and not yet answered, and, for a FIFO request, the first attempts of
    /// the FIFO acquires called before this one. A waiting FIFO `req` takes its place in
    /// that line now, as it is called (a try never queues, so it takes none), and keeps it
    /// until the backend has queued it ([`AcquireRequest::leave_line`]) or the acquire
    /// ends.
    ///
    /// A FIFO acquire that merely waited for a release to land would lose its place: an
    /// acquire called after it (the releasing caller itself, asking again at once) finds
    /// nothing in flight any more and reaches the backend first.
    async fn in_line(&self, req: &mut AcquireRequest) {
        let shared = &self.engine.shared;
        // Only FIFO promises an order: lining up costs a burst of same-key acquires from
        // this node one first attempt each, one after the other.
        if !req.fifo {
            return shared.releasing.landed(&req.key).await;
        }
        let (earlier, place) = shared.releasing.line_up(&req.key);
        if req.wait == Some(Duration::ZERO) {
            drop(place);
        } else {
            req.line = crate::releasing::Line::holding(place);
        }
        earlier.await;
    }

    async fn acquire_with(&self, wait: Option<Duration>) -> Result<Lease, LockError> {
        let (mut req, started) = self.request(wait)?;
        // Decided on the spot if the backend can: no boxed backend future.
        if let Some(synchronous) = self.engine.shared.synchronous.as_deref()
            && let Some(grant) = synchronous.acquire_now(&req, started)
        {
            return grant.map(|grant| self.lease(req, grant, Duration::ZERO));
        }
        // This engine's own release of the key, begun and not yet answered, lands first;
        // for a FIFO acquire, so do the first attempts of this engine's earlier FIFO
        // acquires of the key.
        self.in_line(&mut req).await;
        let span = tracing::trace_span!("lock.acquire", key = %req.key, fifo = self.options.fifo);
        let mut retried = false;
        loop {
            // The backend takes its request by value; the lease needs the key and token back.
            let grant = self
                .engine
                .shared
                .backend
                .acquire(req.clone())
                .instrument(span.clone())
                .await;
            req.leave_line();
            let grant = match grant {
                Ok(grant) => grant,
                // A retry (below) of a wait with a limit, which ran out: the whole wait
                // timed out, as far as the caller is concerned.
                Err(LockError::Busy { retry_after } | LockError::TimedOut { retry_after, .. })
                    if retried && wait.is_some_and(|w| !w.is_zero()) =>
                {
                    return Err(LockError::TimedOut {
                        waited: started.elapsed(),
                        retry_after,
                    });
                }
                Err(e) => return Err(e),
            };
            // A grant whose validity ran out before it got here (this task's runtime
            // stalled past a hand-off's claim, say) may be someone else's key by now: a
            // lease already lost is never handed out. Ask again with the same token: if the
            // key is still ours, that is re-entry and confirms a full lease; if not, the
            // wait goes on within what is left of its limit.
            let ttl = self.options.ttl;
            let valid = grant.valid_for.map_or(ttl, |v| v.min(ttl));
            // Nor is one the backend no longer vouches for (it was reset since).
            if Instant::now() < options::expires_by(grant.granted_at, valid)
                && self.engine.shared.vouches_for(grant.granted_at)
            {
                return Ok(self.lease(req, grant, started.elapsed()));
            }
            let left = wait.map(|w| w.saturating_sub(started.elapsed()));
            if retried && left.is_some_and(|l| l.is_zero()) {
                // Asked again, ran out again, and the wait is spent: the key is ours on the
                // backend (this token) until its TTL runs out, so it is given back now.
                // Never re-entered for ever: re-entry always grants, whatever the wait.
                let _ = self
                    .engine
                    .shared
                    .backend
                    .release(&req.key, &req.token, req.mode)
                    .await;
                tracing::debug!(key = %req.key, "grants kept running out before acquire returned; the wait is spent");
                return Err(match wait {
                    Some(w) if w.is_zero() => LockError::Busy { retry_after: None },
                    _ => LockError::TimedOut {
                        waited: started.elapsed(),
                        retry_after: None,
                    },
                });
            }
            tracing::debug!(key = %req.key, "grant ran out before acquire returned; asking again");
            req.wait = left;
            retried = true;
            // Never spin: a backend that answers at its first poll (in process) would keep
            // this thread from running anything else, the task that would confirm the
            // lease or free the key included.
            tokio::task::yield_now().await;
        }
    }

    /// [`acquire`](Self::acquire), unless a record is stored under the key (see
    /// [`RecordBackend`](crate::RecordBackend)): then that record, and nothing is held. A
    /// lease means no record was stored when the key was granted. One round trip for a free
    /// key or a stored record on a backend that decides both at once (Redis); otherwise
    /// the record is read, the key acquired, and the record read again.
    ///
    /// Errors as [`acquire`](Self::acquire)'s, and [`LockError::Unsupported`] for a backend
    /// without records, or a shared handle (records live beside the key's lock).
    pub async fn acquire_or_record(&self) -> Result<Acquired, LockError> {
        let backend = &self.engine.shared.backend;
        let Some(records) = backend.capabilities().records else {
            return Err(LockError::Unsupported("records"));
        };
        if self.mode.is_shared() {
            return Err(LockError::Unsupported("records of shared leases"));
        }
        let key = self.key()?;
        let (req, started) = self.request(self.options.wait)?;
        // This engine's own completion of the key lands first: a retry gets its record.
        self.engine.shared.releasing.landed(&req.key).await;
        match records.acquire_or_record(req.clone()).await {
            Ok(GrantOrRecord::Record(record)) => return Ok(Acquired::Record(record)),
            Ok(GrantOrRecord::Grant(grant)) => {
                let valid = grant
                    .valid_for
                    .map_or(self.options.ttl, |v| v.min(self.options.ttl));
                if Instant::now() < options::expires_by(grant.granted_at, valid)
                    && self.engine.shared.vouches_for(grant.granted_at)
                {
                    return Ok(Acquired::Lease(self.lease(req, grant, started.elapsed())));
                }
                // Ran out before it got here: asked again below (re-entry if still ours).
            }
            Err(LockError::Unsupported(_)) => {
                if let Some(record) = records.record(key).await? {
                    return Ok(Acquired::Record(record));
                }
            }
            Err(e) => return Err(e),
        }
        // The same token: a grant that is still ours is re-entry.
        let lease = self.clone().token(req.token).acquire().await?;
        match records.record(key).await {
            Ok(None) => Ok(Acquired::Lease(lease)),
            Ok(Some(record)) => {
                let _ = lease.release().await;
                Ok(Acquired::Record(record))
            }
            Err(e) => {
                let _ = lease.release().await;
                Err(e)
            }
        }
    }

    /// `true` if anyone holds the key now, in either mode.
    pub async fn locked(&self) -> Result<bool, LockError> {
        Ok(!self.holders().await?.is_empty())
    }

    /// Who holds the key now (token, remaining TTL and mode), in either mode: the first of
    /// its holders; `None` if nobody.
    pub async fn holder(&self) -> Result<Option<Holder>, LockError> {
        Ok(self.holders().await?.into_iter().next())
    }

    /// Everyone who holds the key now, in either mode: the lock's holder, or every shared
    /// holder.
    pub async fn holders(&self) -> Result<Vec<Holder>, LockError> {
        let key = self.key()?;
        if self.mode.is_shared() && !self.engine.shared.backend.has_shared_mode() {
            return Err(LockError::Unsupported("shared leases"));
        }
        // What this node reads follows what it did: its releases of the key begun before
        // the read land first (they may take another connection than the read).
        self.engine.shared.releasing.landed(key).await;
        self.engine.shared.backend.holders(key).await
    }

    /// The key's status (its first holder, in either mode), judged against this handle's
    /// TTL as the expected bound.
    pub async fn status(&self) -> Result<LockStatus, LockError> {
        Ok(LockStatus::from_holder(
            self.holder().await?,
            self.options.ttl,
        ))
    }

    /// How many callers wait for the key now, in either mode (one queue).
    pub async fn waiters(&self) -> Result<usize, LockError> {
        let key = self.key()?;
        if self.mode.is_shared() && !self.engine.shared.backend.has_shared_mode() {
            return Err(LockError::Unsupported("shared leases"));
        }
        self.engine.shared.releasing.landed(key).await;
        self.engine.shared.backend.waiters(key).await
    }
}

#[cfg(test)]
mod tests;
