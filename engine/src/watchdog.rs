//! The per-engine renewal task: renews live leases in batches and marks a lease lost when
//! its validity deadline passes unconfirmed.

use std::{
    sync::{Arc, Mutex, Weak, atomic::Ordering},
    time::Duration,
};

use tokio::{sync::Notify, time::Instant};

use super::{
    LockError, Renewal, Resets,
    lease::{LeaseState, renew_interval},
    lock_engine::EngineShared,
    options::{after, expires_by},
    runtime,
};

mod schedule;

use schedule::WatchState;

/// How much earlier than due a renewal may be sent, to join a batch going out anyway.
const RENEW_AHEAD: Duration = Duration::from_millis(20);

/// The engine's single renewal task and its schedule of live leases.
///
/// Leases are kept in a map by id and, by the instant they next need attention (renewal
/// or validity deadline), in an ordered set: a wake pops only the leases that are due, so
/// it costs O(due · log n), not a scan of every live lease. The task runs on the engine's
/// own runtime ([`runtime`]), never on a runtime the user owns.
///
/// A new lease is not filed at once: registering pushes it on a list of incoming leases,
/// which the task files when the earliest of them is due. Most leases (an in-process
/// request's) are released long before that, and then cost the watchdog one push and
/// nothing at their release: no map, no ordered set, no second lock (see
/// [`Watchdog::release`]). The state of such a lease, once nothing refers to it, is kept
/// for a new lease ([`Watchdog::register_new`]): no allocation per lease either.
pub(crate) struct Watchdog {
    inner: Arc<WatchInner>,
}

struct WatchInner {
    state: Mutex<WatchState>,
    wake: Notify,
}

impl Watchdog {
    pub(crate) fn new() -> Self {
        Self {
            inner: Arc::new(WatchInner {
                state: Mutex::new(WatchState::default()),
                wake: Notify::new(),
            }),
        }
    }

    pub(super) fn register(&self, engine: &Arc<EngineShared>, lease: Arc<LeaseState>) -> u64 {
        let due = lease.times.lock().unwrap().due();
        let mut st = self.inner.state.lock().unwrap();
        self.add(engine, &mut st, lease, due)
    }

    /// Register a new lease of state `lease`: its shared state (the state of a finished
    /// lease reused when one is spare, so that a short-lived lease allocates nothing) and
    /// its id.
    pub(super) fn register_new(
        &self,
        engine: &Arc<EngineShared>,
        mut lease: LeaseState,
    ) -> (Arc<LeaseState>, u64) {
        let due = lease.times.get_mut().unwrap().due();
        let mut st = self.inner.state.lock().unwrap();
        let state = match st.spare.pop() {
            Some(mut spare) => {
                *Arc::get_mut(&mut spare).expect("a spare lease state is not shared") = lease;
                spare
            }
            None => Arc::new(lease),
        };
        let id = self.add(engine, &mut st, state.clone(), due);
        (state, id)
    }

    /// Put `lease` on the incoming list under the lock `st`; start or wake the task if it
    /// must look by `due`. Returns the lease's id.
    fn add(
        &self,
        engine: &Arc<EngineShared>,
        st: &mut std::sync::MutexGuard<'_, WatchState>,
        lease: Arc<LeaseState>,
        due: Instant,
    ) -> u64 {
        let id = st.next_id;
        st.next_id += 1;
        let wake = st.add(lease, id, due);
        if !st.started {
            // Under the lock, so that concurrent first leases start one task.
            st.started = true;
            st.scheduled = Some(due);
            let resets = engine.resets.clone().unwrap_or_default();
            runtime::handle().spawn(run(Arc::downgrade(engine), self.inner.clone(), resets));
        } else if wake {
            // Only wake the task when this lease is due before the task's own next look:
            // the common short-lived lease then costs one push, not a task wake-up. The
            // task looks by `due` now (it reads the schedule again when it wakes).
            st.scheduled = Some(due);
            self.inner.wake.notify_one();
        }
        id
    }

    pub(super) fn unregister(&self, id: u64) {
        self.inner.state.lock().unwrap().remove(id);
    }

    /// Lease `id` is being released (its `released` flag is set): take it off the
    /// schedule. A lease still on the incoming list costs nothing here: it is dropped when
    /// the list is filed or compacted.
    pub(super) fn release(&self, id: u64, lease: &LeaseState) {
        // Read after `released` was set (SeqCst both, against `file_incoming`'s order).
        if lease.filed.load(Ordering::SeqCst) {
            self.unregister(id);
        }
    }

    /// The lease's times changed: file it where it is now due.
    pub(super) fn reschedule(&self, id: u64, lease: &LeaseState) {
        let due = lease.times.lock().unwrap().due();
        let mut st = self.inner.state.lock().unwrap();
        let wake = if st.leases.contains_key(&id) {
            st.file(id, due)
        } else {
            // Still incoming (or gone): the list must be filed by then.
            if st.incoming_due.is_none_or(|d| due < d) {
                st.incoming_due = Some(due);
            }
            st.scheduled.is_none_or(|s| due < s)
        };
        drop(st);
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
/// to the engine while it sleeps, so dropping the engine ends it. A backend reset
/// (`resets`; never, for a backend that reports none) wakes it to mark lost every lease
/// granted before it.
async fn run(engine: Weak<EngineShared>, inner: Arc<WatchInner>, resets: Resets) {
    // The last reset acted on, and how many revocations.
    let mut reported = 0;
    let mut revoked = 0;
    loop {
        // Registered before the schedule is read, so a registration in between wakes us;
        // likewise a reset.
        let woken = inner.wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let reset = resets.notified();
        tokio::pin!(reset);
        reset.as_mut().enable();
        let now = Instant::now();
        let mut due: Vec<Due> = Vec::new();
        // Renewals due a little later go out with this batch: one wake and one backend
        // call serve many leases. Deadlines are never judged early.
        let horizon = now + RENEW_AHEAD;
        let mut not_yet: Vec<(Instant, u64)> = Vec::new();
        let next = {
            let mut st = inner.state.lock().unwrap();
            if st.incoming_due.is_some_and(|d| d <= horizon) {
                st.file_incoming();
            }
            if resets.last_nanos() > reported {
                reported = resets.last_nanos();
                lose_unvouched(&mut st, &resets);
            }
            if resets.revocations() > revoked {
                revoked = resets.revocations();
                let leases = lose_revoked(&mut st, &resets);
                if !leases.is_empty()
                    && let Some(shared) = engine.upgrade()
                {
                    tokio::spawn(give_back(shared, leases));
                }
            }
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
            let next = match (st.queue.first().map(|&(at, _)| at), st.incoming_due) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
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
            // A batch in flight must not hold up deadlines of other leases. One batch for
            // both modes: each renewal names its lease's mode.
            tokio::spawn(renew_batch(shared, inner.clone(), due, now));
        }
        match next {
            Some(at) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(at) => {}
                    _ = &mut woken => {}
                    _ = &mut reset => {}
                }
            }
            None => {
                // Idle: wait for a registration, but look again now and then so the task
                // ends soon after its engine is dropped.
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                    _ = &mut woken => {}
                    _ = &mut reset => {}
                }
            }
        }
    }
}

/// After a backend reset: every lease granted before it is lost, at once (it may be gone
/// from the server, whose key another node may be granted the moment it answers). A scan
/// of every lease, but only when the backend was reset.
fn lose_unvouched(st: &mut WatchState, resets: &Resets) {
    // Incoming leases too; they are dropped from the list when it is filed.
    for (lease, _) in &st.incoming {
        if !resets.vouch_for(lease.granted_at) {
            lease.mark_lost("the backend was reset after the lease was granted");
        }
    }
    let unvouched: Vec<u64> = st
        .leases
        .iter()
        .filter(|(_, (lease, _))| !resets.vouch_for(lease.granted_at))
        .map(|(&id, _)| id)
        .collect();
    for id in unvouched {
        if let Some((lease, _)) = st.leases.get(&id).cloned() {
            st.remove(id);
            lease.mark_lost("the backend was reset after the lease was granted");
        }
    }
}

/// After an admin's revocation (see [`Resets::revoke`]): the revoked leases are lost (each
/// already reads so) and taken off the schedule; returned, to be given back.
fn lose_revoked(st: &mut WatchState, resets: &Resets) -> Vec<Arc<LeaseState>> {
    let revoked =
        |lease: &LeaseState| resets.is_revoked(&lease.key, &lease.token, lease.granted_at);
    let mut out: Vec<Arc<LeaseState>> = st
        .incoming
        .iter()
        .filter(|(lease, _)| !lease.is_released() && revoked(lease))
        .map(|(lease, _)| lease.clone())
        .collect();
    let ids: Vec<u64> = st
        .leases
        .iter()
        .filter(|(_, (lease, _))| !lease.is_released() && revoked(lease))
        .map(|(&id, _)| id)
        .collect();
    for id in ids {
        if let Some((lease, _)) = st.leases.get(&id).cloned() {
            st.remove(id);
            out.push(lease);
        }
    }
    for lease in &out {
        lease.mark_lost("force-released by an admin");
    }
    out
}

/// Give the revoked `leases` back: their holder has been told (each reads lost), so the
/// key may now pass to the next waiter, which this release does. The admin's force
/// release waits for it (a while) rather than granting the key itself, so that the holder
/// learns first. The lease's own release, later, finds the key gone or another's.
async fn give_back(shared: Arc<EngineShared>, leases: Vec<Arc<LeaseState>>) {
    for lease in leases {
        if let Err(error) = shared
            .backend
            .release(&lease.key, &lease.token, lease.mode)
            .await
        {
            tracing::debug!(key = %lease.key, %error, "giving back a revoked lease failed");
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
            mode: d.lease.mode,
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
                        let deadline = t.deadline.max(expires_by(sent_at, renewal.ttl));
                        d.lease.set_deadline(&mut t, deadline);
                    }
                    if d.lease.auto_renew && t.renew_at.is_none() {
                        t.renew_at = Some(after(sent_at, renew_interval(renewal.ttl)));
                    }
                }
                watchdog.reschedule(d.id, &d.lease);
            }
        }
        Err(error) if matches!(&error, LockError::Backend(e) if e.is_busy()) => {
            // A server busy running a script keeps the leases and grants nobody anything
            // until it is done: try again soon, within each lease's confirmed validity
            // (past it, the lease is lost by its deadline as ever).
            tracing::debug!(%error, leases = due.len(), "lease renewal refused (busy); retrying");
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
        Err(error) => {
            // The server may have lost the leases (a restart, a failover) and granted their
            // keys to others already; it may also merely be slow. Nothing tells the two
            // apart in time, so the leases are lost now: told early is safe, told late is
            // not.
            tracing::warn!(%error, leases = due.len(), "lease renewal failed; the leases are lost");
            for d in &due {
                d.lease.mark_lost("renewal failed");
                watchdog.unregister(d.id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    /// Leases released before they are due are never filed, nor pile up; states are reused.
    #[tokio::test(flavor = "multi_thread")]
    async fn short_leases_are_never_filed_and_their_states_are_reused() {
        let engine = crate::LockEngine::in_memory();
        let lock = engine.lock("k");
        for _ in 0..10_000 {
            let lease = lock.acquire_now().expect("decided").expect("free");
            lease.release().await.expect("released");
        }
        let st = engine.shared.watchdog.inner.state.lock().unwrap();
        assert!(st.leases.is_empty() && st.queue.is_empty());
        assert!(st.incoming.len() <= super::schedule::MIN_COMPACT_AT && !st.spare.is_empty());
    }
}
