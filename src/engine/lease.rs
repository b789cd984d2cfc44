//! [`Lease`], the RAII guard of an acquisition, and the per-engine renewal watchdog.

use std::{
    collections::{BTreeSet, HashMap},
    fmt,
    sync::{
        Arc, Mutex, Weak,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::{sync::Notify, time::Instant};

use super::{
    EngineShared, ExtendMode, Fence, Grant, LockError, LockKey, MAX_TTL, Renewal, Token, background,
};

/// Resolves when a lease is lost: renewal failed or found the key gone, or the local
/// validity deadline passed without a confirmed renewal. Cheap to clone; a handler can
/// `select!` on it to stop work that is no longer protected.
#[derive(Clone, Debug)]
pub struct LostSignal(Arc<Lost>);

impl LostSignal {
    /// Wait until the lease is lost. Never resolves for a lease that is released normally.
    pub async fn lost(&self) {
        self.0.wait().await
    }

    /// `true` once the lease is lost.
    pub fn is_lost(&self) -> bool {
        self.0.is_set()
    }
}

/// A one-way flag with waiters. Every request clones it (into its `LeaseInfo`), so a clone
/// must be a plain reference count.
///
/// It also knows the lease's validity deadline, so that [`Lost::is_set`] is exact at any
/// instant, not only once the watchdog's timer has fired: a fenced write checked against
/// it cannot slip in between the deadline and the watchdog's wake-up.
#[derive(Debug)]
struct Lost {
    set: AtomicBool,
    /// The validity deadline, in nanoseconds since [`epoch`]; `u64::MAX`: none.
    deadline: AtomicU64,
    notify: Notify,
}

impl Default for Lost {
    fn default() -> Self {
        Lost {
            set: AtomicBool::new(false),
            deadline: AtomicU64::new(u64::MAX),
            notify: Notify::new(),
        }
    }
}

/// The origin of [`Lost::deadline`]: some instant before any lease.
fn epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn since_epoch(at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(epoch()).as_nanos()).unwrap_or(u64::MAX)
}

impl Lost {
    fn is_set(&self) -> bool {
        self.set.load(Ordering::Acquire)
            || since_epoch(Instant::now()) >= self.deadline.load(Ordering::Acquire)
    }

    fn valid_until(&self, deadline: Instant) {
        self.deadline
            .store(since_epoch(deadline), Ordering::Release);
    }

    fn set(&self) {
        self.set.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }

    async fn wait(&self) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            // Registered before the flag is read, so a `set` in between is not missed.
            notified.as_mut().enable();
            if self.is_set() {
                return;
            }
            notified.await;
        }
    }
}

/// What the watchdog and the [`Lease`] share about one live lease.
pub(crate) struct LeaseState {
    key: LockKey,
    token: Token,
    /// Lease length used by renewals, in nanoseconds (extend may change it).
    ttl_nanos: AtomicU64,
    /// The lease length it was acquired with; `reacquire` resets to it.
    configured_ttl: Duration,
    auto_renew: bool,
    lost: Arc<Lost>,
    /// Set when a release begins: from then on a renewal that finds the key gone is that
    /// release, not a lost lease.
    released: AtomicBool,
    /// Bumped when an extend begins. A renewal sent under an older epoch may have landed
    /// before or after the extend; it renews the lease but does not move its deadline.
    epoch: AtomicU64,
    times: Mutex<LeaseTimes>,
}

#[derive(Clone, Copy)]
struct LeaseTimes {
    /// Past this instant the backend may have expired the lease. Only ever an instant the
    /// backend confirmed: a send time plus a TTL the backend acknowledged.
    deadline: Instant,
    /// When the next renewal is due (`None` while one is in flight, or without auto-renew).
    renew_at: Option<Instant>,
}

impl LeaseTimes {
    /// When the watchdog must next look at the lease: its renewal, or its deadline.
    fn due(&self) -> Instant {
        self.renew_at
            .map_or(self.deadline, |r| r.min(self.deadline))
    }
}

impl LeaseState {
    fn ttl(&self) -> Duration {
        Duration::from_nanos(self.ttl_nanos.load(Ordering::Relaxed))
    }

    fn set_ttl(&self, ttl: Duration) {
        let nanos = u64::try_from(ttl.min(MAX_TTL).as_nanos()).unwrap_or(u64::MAX);
        self.ttl_nanos.store(nanos, Ordering::Relaxed);
    }

    fn is_released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }

    fn mark_lost(&self, why: &'static str) {
        if self.is_released() {
            return;
        }
        if !self.lost.set.load(Ordering::Acquire) {
            tracing::warn!(key = %self.key, reason = why, "lease lost");
            self.lost.set();
        }
    }

    /// Move the validity deadline (an instant the backend confirmed). Once a deadline has
    /// passed, the lease stays lost: a confirmation arriving after it changes nothing.
    fn set_deadline(&self, t: &mut LeaseTimes, deadline: Instant) -> bool {
        if self.lost.is_set() {
            return false;
        }
        t.deadline = deadline;
        self.lost.valid_until(deadline);
        true
    }
}

fn renew_interval(ttl: Duration) -> Duration {
    ttl / 3
}

/// How much earlier than due a renewal may be sent, to join a batch going out anyway.
const RENEW_AHEAD: Duration = Duration::from_millis(20);

/// The engine's single renewal task and its schedule of live leases.
///
/// Leases are kept in a map by id and, by the instant they next need attention (renewal
/// or validity deadline), in an ordered set: a wake pops only the leases that are due, so
/// it costs O(due · log n), not a scan of every live lease. The task runs on the engine's
/// own runtime ([`background`]), never on a runtime the user owns.
pub(crate) struct Watchdog {
    inner: Arc<WatchInner>,
}

struct WatchInner {
    state: Mutex<WatchState>,
    wake: Notify,
}

#[derive(Default)]
struct WatchState {
    /// Every registered lease, with the instant it is filed under in `queue`.
    leases: HashMap<u64, (Arc<LeaseState>, Instant)>,
    queue: BTreeSet<(Instant, u64)>,
    next_id: u64,
    started: bool,
    /// When the task will next look by itself (`None`: it waits for a registration).
    scheduled: Option<Instant>,
}

impl WatchState {
    /// File lease `id` under `at`, replacing where it was filed. Returns whether the task
    /// must be woken to look earlier than it planned.
    fn file(&mut self, id: u64, at: Instant) -> bool {
        let Some((_, filed)) = self.leases.get_mut(&id) else {
            return false;
        };
        let old = std::mem::replace(filed, at);
        self.queue.remove(&(old, id));
        self.queue.insert((at, id));
        self.scheduled.is_none_or(|s| at < s)
    }

    fn remove(&mut self, id: u64) {
        if let Some((_, at)) = self.leases.remove(&id) {
            self.queue.remove(&(at, id));
        }
    }
}

impl Watchdog {
    pub(crate) fn new() -> Self {
        Watchdog {
            inner: Arc::new(WatchInner {
                state: Mutex::new(WatchState::default()),
                wake: Notify::new(),
            }),
        }
    }

    fn register(&self, engine: &Arc<EngineShared>, lease: Arc<LeaseState>) -> u64 {
        let due = lease.times.lock().unwrap().due();
        let mut st = self.inner.state.lock().unwrap();
        let id = st.next_id;
        st.next_id += 1;
        st.leases.insert(id, (lease, due));
        st.queue.insert((due, id));
        if !st.started {
            // Under the lock, so that concurrent first leases start one task.
            st.started = true;
            background::handle().spawn(run(Arc::downgrade(engine), self.inner.clone()));
        } else if st.scheduled.is_none_or(|s| due < s) {
            // Only wake the task when this lease is due before the task's own next look:
            // the common short-lived lease then costs one insert, not a task wake-up.
            drop(st);
            self.inner.wake.notify_one();
        }
        id
    }

    fn unregister(&self, id: u64) {
        self.inner.state.lock().unwrap().remove(id);
    }

    /// The lease's times changed: file it where it is now due.
    fn reschedule(&self, id: u64, lease: &LeaseState) {
        let due = lease.times.lock().unwrap().due();
        let wake = self.inner.state.lock().unwrap().file(id, due);
        if wake {
            self.inner.wake.notify_one();
        }
    }
}

/// A lease whose renewal is being sent, with what it was sent under.
struct Due {
    id: u64,
    lease: Arc<LeaseState>,
    epoch: u64,
}

/// The renewal loop: one per engine, on the engine's runtime. It holds no strong reference
/// to the engine while it sleeps, so dropping the engine ends it.
async fn run(engine: Weak<EngineShared>, inner: Arc<WatchInner>) {
    loop {
        // Registered before the schedule is read, so a registration in between wakes us.
        let woken = inner.wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let now = Instant::now();
        let mut due: Vec<Due> = Vec::new();
        // Renewals due a little later go out with this batch: one wake and one backend
        // call serve many leases. Deadlines are never judged early.
        let horizon = now + RENEW_AHEAD;
        let mut not_yet: Vec<(Instant, u64)> = Vec::new();
        let next = {
            let mut st = inner.state.lock().unwrap();
            while let Some(&(at, id)) = st.queue.first() {
                if at > horizon {
                    break;
                }
                st.queue.pop_first();
                let lease = st.leases[&id].0.clone();
                let mut t = lease.times.lock().unwrap();
                // The flag itself: `is_set` also reads the deadline, whose passing is what
                // this loop must turn into a wake-up for `lost()`.
                if lease.lost.set.load(Ordering::Acquire) || lease.is_released() {
                    drop(t);
                    st.leases.remove(&id);
                    continue;
                }
                if t.deadline <= now {
                    drop(t);
                    st.leases.remove(&id);
                    lease.mark_lost("validity deadline passed without a confirmed renewal");
                    continue;
                }
                if t.renew_at.is_none_or(|r| r > horizon) {
                    // Its deadline, not yet reached: look again then.
                    not_yet.push((at, id));
                    continue;
                }
                t.renew_at = None;
                due.push(Due {
                    id,
                    lease: lease.clone(),
                    epoch: lease.epoch.load(Ordering::Acquire),
                });
                // In flight, a lease is filed under its deadline: if the renewal never
                // comes back, it is marked lost right then.
                let at = t.due();
                drop(t);
                st.leases
                    .get_mut(&id)
                    .expect("popped lease is registered")
                    .1 = at;
                st.queue.insert((at, id));
            }
            st.queue.extend(not_yet);
            let next = st.queue.first().map(|&(at, _)| at);
            st.scheduled = next;
            if next.is_none() && engine.strong_count() == 0 {
                st.started = false;
                return;
            }
            next
        };
        if !due.is_empty() {
            let Some(shared) = engine.upgrade() else {
                return;
            };
            // A batch in flight must not hold up deadlines of other leases.
            tokio::spawn(renew_batch(shared, inner.clone(), due, now));
        }
        match next {
            Some(at) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(at) => {}
                    _ = &mut woken => {}
                }
            }
            None => {
                // Idle: wait for a registration, but look again now and then so the task
                // ends soon after its engine is dropped.
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                    _ = &mut woken => {}
                }
            }
        }
    }
}

async fn renew_batch(
    shared: Arc<EngineShared>,
    inner: Arc<WatchInner>,
    due: Vec<Due>,
    sent_at: Instant,
) {
    let batch: Vec<Renewal> = due
        .iter()
        .map(|d| Renewal {
            key: d.lease.key.clone(),
            token: d.lease.token.clone(),
            ttl: d.lease.ttl(),
        })
        .collect();
    let result = shared.backend.renew(&batch).await;
    drop(shared);
    let watchdog = Watchdog { inner };
    match result {
        Ok(results) => {
            for ((d, renewal), ok) in due.iter().zip(&batch).zip(results) {
                if d.lease.is_released() {
                    continue;
                }
                if !ok {
                    d.lease.mark_lost("renewal found the lease gone");
                    watchdog.unregister(d.id);
                    continue;
                }
                {
                    let mut t = d.lease.times.lock().unwrap();
                    if d.lease.epoch.load(Ordering::Acquire) == d.epoch {
                        // Renewals never shorten a lease on the backend, so the backend's
                        // expiry is at least the later of the two.
                        let deadline = t.deadline.max(after(sent_at, renewal.ttl));
                        d.lease.set_deadline(&mut t, deadline);
                    }
                    if d.lease.auto_renew && t.renew_at.is_none() {
                        t.renew_at = Some(after(sent_at, renew_interval(renewal.ttl)));
                    }
                }
                watchdog.reschedule(d.id, &d.lease);
            }
        }
        Err(error) => {
            tracing::warn!(%error, leases = due.len(), "lease renewal failed; retrying");
            let retry = Instant::now();
            for d in &due {
                {
                    let mut t = d.lease.times.lock().unwrap();
                    let step = (d.lease.ttl() / 10)
                        .clamp(Duration::from_millis(1), Duration::from_millis(500));
                    t.renew_at = Some(retry + step);
                }
                watchdog.reschedule(d.id, &d.lease);
            }
        }
    }
}

/// `at + d`, or a century later when that is past what the clock can represent.
pub(crate) fn after(at: Instant, d: Duration) -> Instant {
    at.checked_add(d)
        .or_else(|| at.checked_add(Duration::from_secs(100 * 365 * 24 * 60 * 60)))
        .unwrap_or(at)
}

/// An acquired lock: the RAII guard of one acquisition.
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
            .field("lost", &self.state.lost.is_set())
            .finish_non_exhaustive()
    }
}

impl Lease {
    pub(crate) fn new(
        engine: Arc<EngineShared>,
        key: LockKey,
        token: Token,
        grant: Grant,
        waited: Duration,
        ttl: Duration,
        auto_renew: bool,
    ) -> Self {
        let state = Arc::new(LeaseState {
            key,
            token,
            ttl_nanos: AtomicU64::new(0),
            configured_ttl: ttl,
            auto_renew,
            lost: Arc::default(),
            released: AtomicBool::new(false),
            epoch: AtomicU64::new(0),
            times: Mutex::new(LeaseTimes {
                deadline: after(grant.granted_at, ttl),
                renew_at: auto_renew.then(|| after(grant.granted_at, renew_interval(ttl))),
            }),
        });
        state.set_ttl(ttl);
        state.lost.valid_until(after(grant.granted_at, ttl));
        let id = engine.watchdog.register(&engine, state.clone());
        Lease {
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

    /// The lease length the watchdog renews to.
    pub fn ttl(&self) -> Duration {
        self.state.ttl()
    }

    /// Resolves when the lease is lost (see [`LostSignal`]).
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let lost = self.state.lost.clone();
        async move { lost.wait().await }
    }

    /// A cloneable handle on the lost signal, for handing to other tasks.
    pub fn lost_signal(&self) -> LostSignal {
        LostSignal(self.state.lost.clone())
    }

    /// `true` once the lease is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.state.lost.is_set()
    }

    /// Stop renewing, and return the backend release to run.
    fn begin_release(&mut self) -> impl Future<Output = Result<(), LockError>> + Send + 'static {
        self.handed_off = true;
        self.state.released.store(true, Ordering::Release);
        self.engine.watchdog.unregister(self.id);
        let engine = self.engine.clone();
        let state = self.state.clone();
        async move {
            let result = engine.backend.release(&state.key, &state.token).await;
            tracing::trace!(key = %state.key, ok = result.is_ok(), "lock released");
            result
        }
    }

    /// Release the key. [`LockError::NotOwned`] or [`LockError::Expired`] mean the lease
    /// had already run out (another owner may hold the key): nothing was changed.
    ///
    /// Cancellation-safe: once this future has been created, the release happens. If it
    /// is dropped before the backend answered, the release finishes in the background.
    pub fn release(mut self) -> impl Future<Output = Result<(), LockError>> + Send + 'static {
        background::Finish::new(self.begin_release())
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
        let result = self
            .engine
            .backend
            .extend(&self.state.key, &self.state.token, d, mode)
            .await;
        match &result {
            Ok(remaining) => {
                let remaining = (*remaining).min(MAX_TTL);
                self.state.set_ttl(remaining);
                {
                    let mut t = self.state.times.lock().unwrap();
                    self.state.set_deadline(&mut t, after(sent, remaining));
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
                let deadline = t.deadline.min(after(sent, d));
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
        let holder = self.engine.backend.holder(&self.state.key).await?;
        Ok(holder.is_some_and(|h| h.token == self.state.token))
    }
}

/// A TTL the engine accepts: at most [`MAX_TTL`].
pub(crate) fn check_ttl(ttl: Duration) -> Result<(), LockError> {
    if ttl > MAX_TTL {
        return Err(LockError::InvalidValue(
            "a lease TTL may be at most MAX_TTL (365 days)",
        ));
    }
    Ok(())
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.handed_off {
            return;
        }
        // Never block the dropping thread, and never depend on its runtime: the release
        // starts here and, if it needs a round trip, finishes on the engine's runtime.
        let release = self.begin_release();
        background::detach(async move {
            if let Err(error) = release.await {
                tracing::debug!(%error, "release on drop did not apply");
            }
        });
    }
}
