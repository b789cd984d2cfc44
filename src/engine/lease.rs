//! [`Lease`], the RAII guard of an acquisition, and the per-engine renewal watchdog.

use std::{
    collections::HashMap,
    fmt,
    sync::{
        Arc, Mutex, Weak,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::{sync::Notify, time::Instant};

use super::{EngineShared, ExtendMode, Fence, Grant, LockError, LockKey, Renewal, Token};

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
#[derive(Debug, Default)]
struct Lost {
    set: AtomicBool,
    notify: Notify,
}

impl Lost {
    fn is_set(&self) -> bool {
        self.set.load(Ordering::Acquire)
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
    times: Mutex<LeaseTimes>,
}

#[derive(Clone, Copy)]
struct LeaseTimes {
    /// Past this instant the backend may have expired the lease.
    deadline: Instant,
    /// When the next renewal is due (`None` while one is in flight).
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

    fn confirmed(&self, since: Instant, ttl: Duration) {
        let mut t = self.times.lock().unwrap();
        t.deadline = t.deadline.max(since + ttl);
        t.renew_at = self.auto_renew.then(|| since + renew_interval(ttl));
    }

    fn mark_lost(&self, why: &'static str) {
        if !self.lost.is_set() {
            tracing::warn!(key = %self.key, reason = why, "lease lost");
            self.lost.set();
        }
    }
}

fn renew_interval(ttl: Duration) -> Duration {
    ttl / 3
}

/// The engine's single renewal task and its registry of live leases.
pub(crate) struct Watchdog {
    inner: Arc<WatchInner>,
}

struct WatchInner {
    state: Mutex<WatchState>,
    wake: Notify,
}

struct WatchState {
    leases: HashMap<u64, Arc<LeaseState>>,
    next_id: u64,
    /// The renewal task. Restarted when it has ended: it runs on the runtime of the first
    /// lease, which may shut down before the engine does (an actix worker, a test).
    task: Option<tokio::task::JoinHandle<()>>,
    /// When the task will next look at the registry by itself.
    scheduled: Option<Instant>,
}

impl Watchdog {
    pub(crate) fn new() -> Self {
        Watchdog {
            inner: Arc::new(WatchInner {
                state: Mutex::new(WatchState {
                    leases: HashMap::new(),
                    next_id: 0,
                    task: None,
                    scheduled: None,
                }),
                wake: Notify::new(),
            }),
        }
    }

    fn register(&self, engine: &Arc<EngineShared>, lease: Arc<LeaseState>) -> u64 {
        let due = lease.times.lock().unwrap().due();
        let mut st = self.inner.state.lock().unwrap();
        let id = st.next_id;
        st.next_id += 1;
        st.leases.insert(id, lease);
        if st
            .task
            .as_ref()
            .is_none_or(tokio::task::JoinHandle::is_finished)
        {
            // Spawned under the lock, so that concurrent first leases start one task.
            st.task = Some(tokio::spawn(run(
                Arc::downgrade(engine),
                self.inner.clone(),
            )));
        } else if st.scheduled.is_none_or(|s| due < s) {
            // Only wake the task when this lease is due before the task's own next look:
            // the common short-lived lease then costs one map insert, not a task wake-up.
            drop(st);
            self.inner.wake.notify_one();
        }
        id
    }

    fn unregister(&self, id: u64) {
        self.inner.state.lock().unwrap().leases.remove(&id);
    }

    fn reschedule(&self) {
        self.inner.wake.notify_one();
    }
}

/// The renewal loop: one per engine, started with the first lease. It holds no strong
/// reference to the engine while it sleeps, so dropping the engine ends it.
async fn run(engine: Weak<EngineShared>, inner: Arc<WatchInner>) {
    loop {
        let now = Instant::now();
        let mut due: Vec<Arc<LeaseState>> = Vec::new();
        let next = {
            let mut st = inner.state.lock().unwrap();
            st.leases.retain(|_, lease| {
                let mut t = lease.times.lock().unwrap();
                if lease.lost.is_set() {
                    return false;
                }
                if t.deadline <= now {
                    drop(t);
                    lease.mark_lost("validity deadline passed without a confirmed renewal");
                    return false;
                }
                if t.renew_at.is_some_and(|r| r <= now) {
                    t.renew_at = None;
                    due.push(lease.clone());
                }
                true
            });
            let next = st
                .leases
                .values()
                .map(|l| l.times.lock().unwrap().due())
                .min();
            st.scheduled = next;
            if next.is_none() && due.is_empty() && engine.strong_count() == 0 {
                return;
            }
            next
        };
        if !due.is_empty() {
            let Some(shared) = engine.upgrade() else {
                return;
            };
            renew_batch(&shared, &due, now).await;
            drop(shared);
            continue;
        }
        match next {
            Some(at) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(at) => {}
                    _ = inner.wake.notified() => {}
                }
            }
            None => {
                if engine.strong_count() == 0 {
                    if inner.state.lock().unwrap().leases.is_empty() {
                        return;
                    }
                    continue;
                }
                // Idle: wait for a registration, but look again now and then so the task
                // ends soon after its engine is dropped.
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                    _ = inner.wake.notified() => {}
                }
            }
        }
    }
}

async fn renew_batch(shared: &EngineShared, due: &[Arc<LeaseState>], sent_at: Instant) {
    let batch: Vec<Renewal> = due
        .iter()
        .map(|l| Renewal {
            key: l.key.clone(),
            token: l.token.clone(),
            ttl: l.ttl(),
        })
        .collect();
    match shared.backend.renew(&batch).await {
        Ok(results) => {
            for ((lease, renewal), ok) in due.iter().zip(&batch).zip(results) {
                if ok {
                    lease.confirmed(sent_at, renewal.ttl);
                } else {
                    lease.mark_lost("renewal found the lease gone");
                }
            }
        }
        Err(error) => {
            tracing::warn!(%error, leases = due.len(), "lease renewal failed; retrying");
            let retry = Instant::now();
            for lease in due {
                let mut t = lease.times.lock().unwrap();
                let step =
                    (lease.ttl() / 10).clamp(Duration::from_millis(1), Duration::from_millis(500));
                t.renew_at = Some(retry + step);
            }
        }
    }
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
    released: AtomicBool,
    runtime: tokio::runtime::Handle,
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
            ttl_nanos: AtomicU64::new(ttl.as_nanos() as u64),
            configured_ttl: ttl,
            auto_renew,
            lost: Arc::default(),
            times: Mutex::new(LeaseTimes {
                deadline: grant.granted_at + ttl,
                renew_at: auto_renew.then(|| grant.granted_at + renew_interval(ttl)),
            }),
        });
        let id = engine.watchdog.register(&engine, state.clone());
        Lease {
            engine,
            state,
            id,
            fence: grant.fence,
            waited,
            released: AtomicBool::new(false),
            runtime: tokio::runtime::Handle::current(),
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

    /// Release the key. [`LockError::NotOwned`] or [`LockError::Expired`] mean the lease
    /// had already run out (another owner may hold the key): nothing was changed.
    pub async fn release(self) -> Result<(), LockError> {
        self.released.store(true, Ordering::Relaxed);
        self.engine.watchdog.unregister(self.id);
        let result = self
            .engine
            .backend
            .release(&self.state.key, &self.state.token)
            .await;
        tracing::trace!(key = %self.state.key, ok = result.is_ok(), "lock released");
        result
    }

    /// Add `by` to the remaining TTL. The new remaining TTL also becomes the length the
    /// watchdog renews to.
    pub async fn extend(&self, by: Duration) -> Result<Duration, LockError> {
        self.change_ttl(by, ExtendMode::Add).await
    }

    /// Replace the remaining TTL with `ttl` (also used for later renewals).
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
        let sent = Instant::now();
        let result = self
            .engine
            .backend
            .extend(&self.state.key, &self.state.token, d, mode)
            .await;
        match &result {
            Ok(remaining) => {
                self.state
                    .ttl_nanos
                    .store(remaining.as_nanos() as u64, Ordering::Relaxed);
                {
                    let mut t = self.state.times.lock().unwrap();
                    t.deadline = sent + *remaining;
                    t.renew_at = self
                        .state
                        .auto_renew
                        .then(|| sent + renew_interval(*remaining));
                }
                self.engine.watchdog.reschedule();
            }
            Err(LockError::NotOwned | LockError::Expired) => {
                self.state.mark_lost("extend found the lease gone");
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

impl Drop for Lease {
    fn drop(&mut self) {
        if self.released.load(Ordering::Relaxed) {
            return;
        }
        self.engine.watchdog.unregister(self.id);
        let engine = self.engine.clone();
        let key = self.state.key.clone();
        let token = self.state.token.clone();
        // Never block the dropping thread: the release runs as its own task. If the runtime
        // is gone, the TTL frees the key.
        self.runtime.spawn(async move {
            if let Err(error) = engine.backend.release(&key, &token).await {
                tracing::debug!(%key, %error, "release on drop did not apply");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::LockEngine;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// The renewal task starts on the first lease's runtime; when that runtime is gone,
    /// leases taken on another runtime must still be renewed.
    #[test]
    fn renewal_survives_the_runtime_that_started_it() {
        let engine = LockEngine::in_memory();
        let first = runtime();
        first.block_on(async {
            let lease = engine.lock("k").acquire().await.unwrap();
            lease.release().await.unwrap();
        });
        drop(first);
        runtime().block_on(async {
            let lease = engine
                .lock("k")
                .ttl(Duration::from_millis(150))
                .acquire()
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(500)).await;
            assert!(!lease.is_lost());
            assert!(lease.owned().await.unwrap(), "the lease was not renewed");
            lease.release().await.unwrap();
        });
    }
}
