//! The conformance suite: every backend must pass these cases unchanged.
//!
//! A backend plugs in with a [`Harness`] (a fresh engine per case, a time unit, and a way
//! to list what the backend still keeps) and one `conformance_tests!` invocation in its
//! own test file; see `tests/conformance_memory.rs`. The harnesses of this repository's
//! backends are here too ([`memory`], [`core_only`], and `redis` with the `redis` feature).

// The cases are public for the macros' sake; each one's name is its specification.
#![allow(missing_docs)]

use std::{
    future::Future,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

mod harness;
mod records;

pub use records::*;

#[cfg(feature = "redis")]
pub use harness::redis;
#[cfg(feature = "redis-cluster")]
pub use harness::redis_cluster;
pub use harness::{BackendHarness, core_only, memory};

use tokio::time::{Instant, sleep, timeout};
use tower_lock::{
    LockEngine, LockError, Token,
    engine::{Backend, Compare, LockKey, LockStatus, MAX_TTL, MutexError},
};

/// What a backend provides to run the suite.
pub trait Harness: Send + Sync + 'static {
    /// The engine under test. Each case gets a harness of its own, so keys never collide.
    fn engine(&self) -> LockEngine;
    /// The engine's backend, for the cases that act behind a holder's back.
    fn backend(&self) -> Arc<dyn Backend>;
    /// The time unit for TTL cases: short on a real clock, anything on a paused one.
    fn unit(&self) -> Duration;
    /// Keys (or other state) the backend still keeps for this harness.
    fn residue(&self) -> Pin<Box<dyn Future<Output = Vec<String>> + Send + '_>>;
}

/// Instantiate the core cases only: what every backend must pass, whatever optional
/// capabilities it has (see `tests/conformance_core_only.rs`).
#[macro_export]
macro_rules! core_conformance_tests {
    (timed = #[$timed:meta], concurrent = #[$conc:meta], harness = $make:expr $(,)?) => {
        $crate::conformance_tests!(@cases [$timed] $make;
            fifo_grants_in_arrival_order_with_zero_overtakes,
            try_acquire_under_contention_is_busy_with_retry_after,
            only_one_of_simultaneous_tries_wins,
            acquire_times_out_after_wait_limit,
            release_by_non_owner_is_refused,
            late_release_after_expiry_is_reported_and_not_applied,
            extend_adds_or_replaces_and_reacquire_resets,
            fences_strictly_increase_per_key,
            watchdog_keeps_lease_past_its_ttl,
            lost_fires_when_the_lease_is_gone,
            lost_fires_at_the_deadline_without_renewal,
            cancelled_waiters_leave_no_residue,
            timed_out_waiters_leave_no_residue,
            max_waiters_is_enforced,
            drop_releases_without_waiting_for_the_ttl,
            same_token_reenters_and_refreshes,
            expired_holder_is_replaced_by_a_waiter,
            invalid_keys_are_refused,
            locked_and_owned_report_state,
            key_mutex_releases_on_every_exit_path,
            key_mutex_reports_held_not_held_and_expiry,
            a_stale_waiter_dropped_late_leaves_the_next_holder_alone,
            a_waiter_is_granted_when_a_shorter_successor_lease_expires,
            huge_durations_never_panic,
        );
        $crate::conformance_tests!(@cases [$conc] $make;
            mutual_exclusion_many_tasks_many_iterations,
            fifo_mutual_exclusion_many_tasks_many_iterations,
        );
    };
}

/// Instantiate every conformance case as a test: the core cases and the capability cases
/// (admin operations, numeric compare-and-set, lock pools, records).
///
/// `timed` is the test attribute for cases about TTLs and ordering; `concurrent` the one
/// for many-task cases; `harness` an async expression building a fresh harness.
#[macro_export]
macro_rules! conformance_tests {
    (timed = #[$timed:meta], concurrent = #[$conc:meta], harness = $make:expr $(,)?) => {
        $crate::core_conformance_tests!(timed = #[$timed], concurrent = #[$conc], harness = $make);
        $crate::conformance_tests!(@cases [$timed] $make;
            status_tells_free_locked_reserved_and_no_expiry,
            admin_force_release_hands_the_key_to_the_next_waiter,
            numeric_compare_and_set_follows_each_comparison,
            numeric_values_expire_and_delete,
            numeric_ttls_past_the_maximum_are_refused,
            pool_membership_and_health,
            a_record_appears_with_the_release_for_the_holder_only,
            a_lapsed_holder_writes_no_record_and_keeps_the_next_holder,
            a_waiter_granted_by_a_completion_finds_the_record,
            records_expire_after_their_retention,
            a_record_or_tombstone_is_deleted_by_key_and_the_lock_is_left_alone,
        );
    };
    (@cases [$attr:meta] $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[$attr]
            async fn $case() {
                let harness = $make.await;
                $crate::conformance::bounded($crate::conformance::$case(&harness)).await;
            }
        )*
    };
}

/// Run a case with a time bound, so a broken backend fails the case instead of hanging it.
pub async fn bounded(case: impl Future<Output = ()>) {
    timeout(Duration::from_secs(120), case)
        .await
        .expect("conformance case did not finish within 120 s");
}

pub(crate) async fn assert_no_residue(h: &impl Harness) {
    // Dropped leases release in a spawned task: allow it a moment to land.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let left = h.residue().await;
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "backend kept state: {left:?}");
        sleep(Duration::from_millis(5)).await;
    }
}

/// Wait until `n` callers are queued for `key` (observable backend state, no event to await).
pub(crate) async fn until_waiters(engine: &LockEngine, key: &str, n: usize) {
    let lock = engine.lock(key);
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        if lock.waiters().await.unwrap() == n {
            return;
        }
        assert!(Instant::now() < give_up, "never saw {n} waiters on {key}");
        tokio::task::yield_now().await;
        sleep(Duration::from_millis(1)).await;
    }
}

async fn remaining(engine: &LockEngine, key: &str) -> Duration {
    engine
        .lock(key)
        .holder()
        .await
        .unwrap()
        .expect("key is held")
        .ttl
        .expect("key has a TTL")
}

async fn exclusion_rounds(h: &impl Harness, fifo: bool) {
    const TASKS: usize = 8;
    const ITERATIONS: usize = 40;
    const ROUNDS: usize = 3;
    let engine = h.engine();
    for round in 0..ROUNDS {
        let key = format!("exclusion-{round}");
        let inside = Arc::new(AtomicBool::new(false));
        let violations = Arc::new(AtomicUsize::new(0));
        // Deliberately racy read-modify-write: only mutual exclusion keeps it exact.
        let counter = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for _ in 0..TASKS {
            let (engine, key) = (engine.clone(), key.clone());
            let (inside, violations, counter) =
                (inside.clone(), violations.clone(), counter.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..ITERATIONS {
                    let lease = engine
                        .lock(&key)
                        .fifo(fifo)
                        .ttl(Duration::from_secs(10))
                        .acquire()
                        .await
                        .expect("acquire");
                    if inside.swap(true, Ordering::SeqCst) {
                        violations.fetch_add(1, Ordering::SeqCst);
                    }
                    let v = counter.load(Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    counter.store(v + 1, Ordering::SeqCst);
                    inside.store(false, Ordering::SeqCst);
                    lease.release().await.expect("release");
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(
            violations.load(Ordering::SeqCst),
            0,
            "overlapping critical sections"
        );
        assert_eq!(counter.load(Ordering::SeqCst), (TASKS * ITERATIONS) as u64);
    }
    assert_no_residue(h).await;
}

pub async fn mutual_exclusion_many_tasks_many_iterations(h: &impl Harness) {
    exclusion_rounds(h, false).await;
}

pub async fn fifo_mutual_exclusion_many_tasks_many_iterations(h: &impl Harness) {
    exclusion_rounds(h, true).await;
}

pub async fn fifo_grants_in_arrival_order_with_zero_overtakes(h: &impl Harness) {
    const WAITERS: usize = 8;
    let engine = h.engine();
    for round in 0..3 {
        let key = format!("fifo-{round}");
        let holder = engine.lock(&key).fifo(true).acquire().await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..WAITERS {
            let (e, k, order) = (engine.clone(), key.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let lease = e.lock(&k).fifo(true).acquire().await.unwrap();
                order.lock().unwrap().push(i);
                lease.release().await.unwrap();
            }));
            // Arrival order is only defined once the waiter is queued.
            until_waiters(&engine, &key, i + 1).await;
        }
        holder.release().await.unwrap();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), (0..WAITERS).collect::<Vec<_>>());
    }
    assert_no_residue(h).await;
}

pub async fn try_acquire_under_contention_is_busy_with_retry_after(h: &impl Harness) {
    let engine = h.engine();
    let ttl = h.unit() * 10;
    let lease = engine.lock("busy").ttl(ttl).acquire().await.unwrap();
    match engine.lock("busy").try_acquire().await {
        Err(LockError::Busy {
            retry_after: Some(r),
        }) => {
            assert!(
                r <= ttl && r > ttl / 2,
                "retry_after {r:?} for a TTL of {ttl:?}"
            )
        }
        other => panic!("expected Busy with retry_after, got {other:?}"),
    }
    lease.release().await.unwrap();
    let again = engine
        .lock("busy")
        .try_acquire()
        .await
        .expect("free after release");
    again.release().await.unwrap();
    assert_no_residue(h).await;
}

pub async fn only_one_of_simultaneous_tries_wins(h: &impl Harness) {
    let engine = h.engine();
    for round in 0..5 {
        let key = format!("race-{round}");
        let tries = (0..16).map(|_| {
            let engine = engine.clone();
            let key = key.clone();
            tokio::spawn(async move { engine.lock(&key).try_acquire().await })
        });
        let mut won = Vec::new();
        for t in tries.collect::<Vec<_>>() {
            match t.await.unwrap() {
                Ok(lease) => won.push(lease),
                Err(LockError::Busy { .. }) => {}
                Err(e) => panic!("unexpected {e:?}"),
            }
        }
        assert_eq!(won.len(), 1, "exactly one simultaneous try must win");
        won.pop().unwrap().release().await.unwrap();
    }
    assert_no_residue(h).await;
}

pub async fn acquire_times_out_after_wait_limit(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let lease = engine.lock("timeout").ttl(u * 50).acquire().await.unwrap();
    let started = Instant::now();
    let err = engine
        .lock("timeout")
        .wait(u * 2)
        .acquire()
        .await
        .unwrap_err();
    let waited = started.elapsed();
    assert!(matches!(err, LockError::TimedOut { .. }), "{err:?}");
    assert!(err.retry_after().is_some());
    assert!(
        waited >= u * 2 && waited < u * 2 + Duration::from_secs(1),
        "waited {waited:?}"
    );
    lease.release().await.unwrap();
    assert_no_residue(h).await;
}

pub async fn release_by_non_owner_is_refused(h: &impl Harness) {
    let engine = h.engine();
    let lease = engine.lock("owner").acquire().await.unwrap();
    let key = LockKey::new("owner").unwrap();
    let err = h
        .backend()
        .release(&key, &Token::random())
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::NotOwned), "{err:?}");
    assert!(
        lease.owned().await.unwrap(),
        "a refused release must not change the holder"
    );
    lease.release().await.unwrap();
    assert_no_residue(h).await;
}

pub async fn late_release_after_expiry_is_reported_and_not_applied(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    // Expired and nobody else took it: "already gone".
    let a = engine
        .lock("late")
        .ttl(u * 2)
        .auto_renew(false)
        .acquire()
        .await
        .unwrap();
    sleep(u * 4).await;
    assert!(matches!(a.release().await, Err(LockError::Expired)));
    // Expired and someone else holds it now: refused, and the new holder keeps it.
    let a = engine
        .lock("late")
        .ttl(u * 2)
        .auto_renew(false)
        .acquire()
        .await
        .unwrap();
    sleep(u * 4).await;
    let b = engine.lock("late").ttl(u * 50).try_acquire().await.unwrap();
    assert!(matches!(a.release().await, Err(LockError::NotOwned)));
    assert!(b.owned().await.unwrap());
    b.release().await.unwrap();
    assert_no_residue(h).await;
}

pub async fn extend_adds_or_replaces_and_reacquire_resets(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let lease = engine
        .lock("extend")
        .ttl(u * 10)
        .auto_renew(false)
        .acquire()
        .await
        .unwrap();
    let after_add = lease.extend(u * 10).await.unwrap();
    assert!(after_add > u * 15 && after_add <= u * 20, "{after_add:?}");
    let held = remaining(&engine, "extend").await;
    assert!(held > u * 15 && held <= u * 20, "{held:?}");
    let after_replace = lease.extend_to(u * 3).await.unwrap();
    assert!(
        after_replace <= u * 3 && after_replace > u * 2,
        "{after_replace:?}"
    );
    assert!(remaining(&engine, "extend").await <= u * 3);
    let after_reacquire = lease.reacquire().await.unwrap();
    assert!(
        after_reacquire <= u * 10 && after_reacquire > u * 9,
        "{after_reacquire:?}"
    );
    lease.release().await.unwrap();
    // Extending a lease that is gone is refused.
    let gone = engine
        .lock("extend")
        .ttl(u * 2)
        .auto_renew(false)
        .acquire()
        .await
        .unwrap();
    sleep(u * 4).await;
    assert!(matches!(gone.extend(u).await, Err(LockError::Expired)));
    assert!(matches!(gone.reacquire().await, Err(LockError::Expired)));
    drop(gone);
    assert_no_residue(h).await;
}

pub async fn fences_strictly_increase_per_key(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let mut last = None;
    for _ in 0..20 {
        let lease = engine.lock("fence").acquire().await.unwrap();
        assert!(last.is_none_or(|l| lease.fence() > l));
        last = Some(lease.fence());
        lease.release().await.unwrap();
    }
    // Across an expiry: the next holder's fence is higher than the stale holder's.
    let stale = engine
        .lock("fence")
        .ttl(u * 2)
        .auto_renew(false)
        .acquire()
        .await
        .unwrap();
    sleep(u * 4).await;
    let next = engine.lock("fence").try_acquire().await.unwrap();
    assert!(next.fence() > stale.fence());
    next.release().await.unwrap();
    drop(stale);
    // Under contention, in grant order.
    let fences = Arc::new(Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..6)
        .map(|_| {
            let (engine, fences) = (engine.clone(), fences.clone());
            tokio::spawn(async move {
                for _ in 0..5 {
                    let lease = engine.lock("fence").acquire().await.unwrap();
                    fences.lock().unwrap().push(lease.fence());
                    lease.release().await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let fences = fences.lock().unwrap().clone();
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    assert_no_residue(h).await;
}

pub async fn watchdog_keeps_lease_past_its_ttl(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let lease = engine.lock("renewed").ttl(u * 3).acquire().await.unwrap();
    sleep(u * 10).await;
    assert!(!lease.is_lost());
    assert!(
        lease.owned().await.unwrap(),
        "watchdog should have renewed the lease"
    );
    assert!(matches!(
        engine.lock("renewed").try_acquire().await,
        Err(LockError::Busy { .. })
    ));
    lease.release().await.unwrap();
    assert_no_residue(h).await;
}

pub async fn lost_fires_when_the_lease_is_gone(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let lease = engine.lock("lost").ttl(u * 3).acquire().await.unwrap();
    let signal = lease.lost_signal();
    assert!(!signal.is_lost());
    // Someone removes the key behind the holder's back.
    h.backend()
        .release(lease.key(), lease.token())
        .await
        .unwrap();
    timeout(u * 6, lease.lost())
        .await
        .expect("lost() should fire after the next renewal");
    assert!(signal.is_lost());
    drop(lease);
    assert_no_residue(h).await;
}

pub async fn lost_fires_at_the_deadline_without_renewal(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let started = Instant::now();
    let lease = engine
        .lock("deadline")
        .ttl(u * 3)
        .auto_renew(false)
        .acquire()
        .await
        .unwrap();
    timeout(u * 6, lease.lost())
        .await
        .expect("lost() at the validity deadline");
    assert!(started.elapsed() >= u * 3, "lost before the TTL ran out");
    drop(lease);
    assert_no_residue(h).await;
}

pub async fn cancelled_waiters_leave_no_residue(h: &impl Harness) {
    for fifo in [false, true] {
        let engine = h.engine();
        let holder = engine.lock("cancel").fifo(fifo).acquire().await.unwrap();
        let waiters: Vec<_> = (0..5)
            .map(|_| {
                let engine = engine.clone();
                tokio::spawn(async move { engine.lock("cancel").fifo(fifo).acquire().await })
            })
            .collect();
        until_waiters(&engine, "cancel", 5).await;
        for w in &waiters {
            w.abort();
        }
        for w in waiters {
            assert!(w.await.unwrap_err().is_cancelled());
        }
        until_waiters(&engine, "cancel", 0).await;
        holder.release().await.unwrap();
        // The key is free at once: no cancelled waiter was handed the lock.
        let next = engine
            .lock("cancel")
            .fifo(fifo)
            .try_acquire()
            .await
            .unwrap();
        next.release().await.unwrap();
        assert_no_residue(h).await;
    }
}

pub async fn timed_out_waiters_leave_no_residue(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let holder = engine.lock("waited").fifo(true).acquire().await.unwrap();
    let waiters: Vec<_> = (0..4)
        .map(|_| {
            let engine = engine.clone();
            tokio::spawn(
                async move { engine.lock("waited").fifo(true).wait(u * 2).acquire().await },
            )
        })
        .collect();
    for w in waiters {
        assert!(matches!(w.await.unwrap(), Err(LockError::TimedOut { .. })));
    }
    assert_eq!(engine.lock("waited").waiters().await.unwrap(), 0);
    holder.release().await.unwrap();
    assert_no_residue(h).await;
}

pub async fn max_waiters_is_enforced(h: &impl Harness) {
    let engine = h.engine();
    let holder = engine.lock("bounded").acquire().await.unwrap();
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let engine = engine.clone();
            tokio::spawn(async move {
                let lease = engine.lock("bounded").max_waiters(2).acquire().await?;
                lease.release().await
            })
        })
        .collect();
    until_waiters(&engine, "bounded", 2).await;
    let err = engine
        .lock("bounded")
        .max_waiters(2)
        .acquire()
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            LockError::QueueFull {
                retry_after: Some(_)
            }
        ),
        "{err:?}"
    );
    holder.release().await.unwrap();
    for w in waiters {
        w.await.unwrap().expect("queued waiters are served");
    }
    assert_no_residue(h).await;
}

pub async fn drop_releases_without_waiting_for_the_ttl(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let lease = engine.lock("dropped").ttl(u * 100).acquire().await.unwrap();
    drop(lease);
    // Well within the TTL: only the release on drop can free it this soon.
    let next = engine
        .lock("dropped")
        .wait(u * 5)
        .acquire()
        .await
        .expect("released on drop");
    next.release().await.unwrap();
    assert_no_residue(h).await;
}

pub async fn same_token_reenters_and_refreshes(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let me = Token::new("worker-1").unwrap();
    let first = engine
        .lock("reentrant")
        .token(me.clone())
        .ttl(u * 10)
        .acquire()
        .await
        .unwrap();
    sleep(u * 5).await;
    let second = engine
        .lock("reentrant")
        .token(me.clone())
        .ttl(u * 10)
        .try_acquire()
        .await
        .unwrap();
    assert_eq!(
        first.fence(),
        second.fence(),
        "re-entry is the same acquisition"
    );
    assert!(
        remaining(&engine, "reentrant").await > u * 9,
        "re-entry refreshes the TTL"
    );
    let other = Token::new("worker-2").unwrap();
    assert!(matches!(
        engine.lock("reentrant").token(other).try_acquire().await,
        Err(LockError::Busy { .. })
    ));
    second.release().await.unwrap();
    assert!(matches!(first.release().await, Err(LockError::Expired)));
    assert_no_residue(h).await;
}

pub async fn expired_holder_is_replaced_by_a_waiter(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let stale = engine
        .lock("expiry")
        .ttl(u * 3)
        .auto_renew(false)
        .acquire()
        .await
        .unwrap();
    let started = Instant::now();
    let next = engine
        .lock("expiry")
        .wait(u * 30)
        .acquire()
        .await
        .expect("granted at expiry");
    let waited = started.elapsed();
    assert!(
        waited >= u * 2 && waited < u * 3 + Duration::from_secs(1),
        "waited {waited:?}"
    );
    assert!(next.fence() > stale.fence());
    next.release().await.unwrap();
    drop(stale);
    assert_no_residue(h).await;
}

pub async fn invalid_keys_are_refused(h: &impl Harness) {
    let engine = h.engine();
    for bad in [String::new(), "x".repeat(10_000), "a\nb".to_string()] {
        let err = engine.lock(&bad).try_acquire().await.unwrap_err();
        assert!(matches!(err, LockError::InvalidKey(_)), "{bad:?}: {err:?}");
    }
    // Characters with meaning to Redis or to the engine's own layout are just data.
    let tricky = ["{tag}", "a:b:c", "}{", "*", "lock:queue", "\u{e9}t\u{e9}"];
    let leases: Vec<_> = {
        let mut v = Vec::new();
        for k in tricky {
            v.push(engine.lock(k).try_acquire().await.expect(k));
        }
        v
    };
    for (k, lease) in tricky.iter().zip(&leases) {
        assert_eq!(lease.key().as_str(), *k);
        assert!(engine.lock(k).locked().await.unwrap());
    }
    assert!(!engine.lock("{tag").locked().await.unwrap());
    for lease in leases {
        lease.release().await.unwrap();
    }
    assert_no_residue(h).await;
}

pub async fn locked_and_owned_report_state(h: &impl Harness) {
    let engine = h.engine();
    assert!(!engine.lock("state").locked().await.unwrap());
    let lease = engine.lock("state").acquire().await.unwrap();
    assert!(engine.lock("state").locked().await.unwrap());
    assert!(lease.owned().await.unwrap());
    let holder = engine.lock("state").holder().await.unwrap().unwrap();
    assert_eq!(&holder.token, lease.token());
    lease.release().await.unwrap();
    assert!(!engine.lock("state").locked().await.unwrap());
    assert_no_residue(h).await;
}

pub async fn status_tells_free_locked_reserved_and_no_expiry(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let lock = engine.lock("status").ttl(u * 10);
    assert_eq!(lock.status().await.unwrap(), LockStatus::Free);
    let lease = lock.acquire().await.unwrap();
    match lock.status().await.unwrap() {
        LockStatus::Locked { owner, ttl } => {
            assert_eq!(&owner, lease.token());
            assert!(ttl <= u * 10 && ttl > u * 5, "{ttl:?}");
        }
        other => panic!("expected Locked, got {other:?}"),
    }
    lease.release().await.unwrap();
    let admin = engine.admin();
    let down = Token::new("maintenance").unwrap();
    admin.set("status", &down, Some(u * 100)).await.unwrap();
    assert!(
        matches!(lock.status().await.unwrap(), LockStatus::Reserved { owner, .. } if owner == down)
    );
    assert!(matches!(
        lock.try_acquire().await,
        Err(LockError::Busy { .. })
    ));
    admin.set("status", &down, None).await.unwrap();
    assert_eq!(
        lock.status().await.unwrap(),
        LockStatus::NoExpiry {
            owner: down.clone()
        }
    );
    let holder = lock.holder().await.unwrap().unwrap();
    assert_eq!((holder.token, holder.ttl), (down, None));
    assert!(admin.force_release("status").await.unwrap());
    assert!(!admin.force_release("status").await.unwrap());
    assert_eq!(lock.status().await.unwrap(), LockStatus::Free);
    assert_no_residue(h).await;
}

pub async fn admin_force_release_hands_the_key_to_the_next_waiter(h: &impl Harness) {
    let engine = h.engine();
    let stuck = engine.lock("forced").acquire().await.unwrap();
    let waiter = {
        let engine = engine.clone();
        tokio::spawn(async move { engine.lock("forced").acquire().await })
    };
    until_waiters(&engine, "forced", 1).await;
    assert!(engine.admin().force_release("forced").await.unwrap());
    let next = waiter
        .await
        .unwrap()
        .expect("waiter gets the key after a forced release");
    assert!(next.fence() > stuck.fence());
    assert!(matches!(stuck.release().await, Err(LockError::NotOwned)));
    next.release().await.unwrap();
    assert_no_residue(h).await;
}

pub async fn numeric_compare_and_set_follows_each_comparison(h: &impl Harness) {
    let engine = h.engine();
    let n = engine.numeric("number").epsilon(0.01);
    // (comparison, given, applies when stored is 10)
    let table = [
        (Compare::Greater, 11.0, true),
        (Compare::Greater, 10.0, false),
        (Compare::Less, 9.0, true),
        (Compare::Less, 10.0, false),
        (Compare::GreaterOrEqual, 9.995, true),
        (Compare::GreaterOrEqual, 9.9, false),
        (Compare::LessOrEqual, 10.005, true),
        (Compare::LessOrEqual, 10.1, false),
        (Compare::Equal, 10.005, true),
        (Compare::Equal, 10.1, false),
        (Compare::NotEqual, 10.1, true),
        (Compare::NotEqual, 10.005, false),
    ];
    for (compare, given, applies) in table {
        // Start from exactly 10 (an absent key satisfies any comparison).
        assert!(n.get().await.unwrap().is_none());
        assert!(
            n.set_if(Compare::Greater, 10.0, None).await.unwrap(),
            "absent key satisfies"
        );
        assert_eq!(
            n.set_if(compare, given, None).await.unwrap(),
            applies,
            "{compare:?} {given} vs 10"
        );
        let expected = if applies { given } else { 10.0 };
        assert_eq!(
            n.get().await.unwrap(),
            Some(expected),
            "{compare:?} {given}"
        );
        // Compare-and-delete follows the same rule.
        n.delete_if(Compare::NotEqual, f64::MAX).await.unwrap();
        assert!(n.set_if(Compare::Greater, 10.0, None).await.unwrap());
        assert_eq!(
            n.delete_if(compare, given).await.unwrap(),
            applies,
            "delete {compare:?} {given}"
        );
        assert_eq!(n.get().await.unwrap().is_none(), applies);
        n.delete_if(Compare::NotEqual, f64::MAX).await.unwrap();
    }
    assert!(matches!(
        n.set_if(Compare::Greater, f64::NAN, None).await,
        Err(LockError::InvalidValue(_))
    ));
    assert_eq!(n.get().await.unwrap(), None);
    assert_no_residue(h).await;
}

pub async fn numeric_values_expire_and_delete(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let n = engine.numeric("expiring");
    assert!(n.set_if(Compare::Greater, 5.5, Some(u * 2)).await.unwrap());
    assert_eq!(n.get().await.unwrap(), Some(5.5));
    sleep(u * 4).await;
    assert_eq!(n.get().await.unwrap(), None, "the TTL removes the value");
    assert!(n.set_if(Compare::Less, -3.25, None).await.unwrap());
    assert!(!n.delete_if(Compare::Greater, -4.0).await.unwrap());
    assert!(n.delete_if(Compare::Less, -4.0).await.unwrap());
    assert_eq!(n.get().await.unwrap(), None);
    assert_no_residue(h).await;
}

/// A numeric value's TTL past [`MAX_TTL`] is refused with the same typed error on every
/// backend (never a protocol error of the store, never accepted), and nothing is stored;
/// `MAX_TTL` itself is accepted.
pub async fn numeric_ttls_past_the_maximum_are_refused(h: &impl Harness) {
    let engine = h.engine();
    let n = engine.numeric("huge-ttl");
    for ttl in [
        MAX_TTL + Duration::from_millis(1),
        Duration::from_millis(100_000_000_000_000_001),
        Duration::MAX,
    ] {
        let result = n.set_if(Compare::Greater, 1.0, Some(ttl)).await;
        assert!(
            matches!(result, Err(LockError::InvalidValue(_))),
            "a numeric TTL of {ttl:?}: {result:?}"
        );
    }
    assert_eq!(n.get().await.unwrap(), None);
    assert!(
        n.set_if(Compare::Greater, 1.0, Some(MAX_TTL))
            .await
            .unwrap()
    );
    assert!(n.delete_if(Compare::Equal, 1.0).await.unwrap());
    assert_no_residue(h).await;
}

pub async fn pool_membership_and_health(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let pool = engine.pool("workers").expected_ttl(u * 10);
    assert!(pool.is_empty().await.unwrap());
    assert_eq!(pool.add(["w:1", "w:2", "w:3"]).await.unwrap(), 3);
    assert_eq!(pool.add(["w:3", "w:4"]).await.unwrap(), 4);
    assert_eq!(pool.remove(["w:4", "w:missing"]).await.unwrap(), 3);
    assert!(pool.contains("w:2").await.unwrap());
    assert!(!pool.contains("w:4").await.unwrap());
    assert_eq!(pool.len().await.unwrap(), 3);
    let held = engine.lock("w:1").ttl(u * 10).acquire().await.unwrap();
    engine
        .admin()
        .set("w:2", &Token::new("down").unwrap(), Some(u * 100))
        .await
        .unwrap();
    let statuses = pool.statuses().await.unwrap();
    let names: Vec<&str> = statuses.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, ["w:1", "w:2", "w:3"]);
    assert!(matches!(statuses[0].1, LockStatus::Locked { .. }));
    assert!(matches!(statuses[1].1, LockStatus::Reserved { .. }));
    assert_eq!(statuses[2].1, LockStatus::Free);
    let health = pool.health().await.unwrap();
    assert_eq!((health.locked, health.free), (2, 1));
    assert_eq!(pool.replace(["w:a", "w:b"]).await.unwrap(), 2);
    let members: Vec<String> = pool
        .members()
        .await
        .unwrap()
        .iter()
        .map(|k| k.to_string())
        .collect();
    assert_eq!(members, ["w:a", "w:b"]);
    assert_eq!(pool.health().await.unwrap().free, 2);
    pool.clear().await.unwrap();
    assert!(pool.is_empty().await.unwrap());
    held.release().await.unwrap();
    engine.admin().force_release("w:2").await.unwrap();
    assert_no_residue(h).await;
}

pub async fn key_mutex_releases_on_every_exit_path(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let m = engine.mutex("guarded");
    // Normal return.
    assert_eq!(m.run(|| async { 7 }).await.unwrap(), 7);
    assert!(!engine.lock("guarded").locked().await.unwrap());
    // An error returned by the closure is just its output: the key is released.
    let r: Result<(), &str> = m.run(|| async { Err("boom") }).await.unwrap();
    assert!(r.is_err());
    assert!(!engine.lock("guarded").locked().await.unwrap());
    // Panic inside the closure.
    let panicked = {
        let engine = engine.clone();
        tokio::spawn(async move {
            engine
                .mutex("guarded")
                .run(|| async { panic!("handler bug") })
                .await
        })
    };
    assert!(panicked.await.unwrap_err().is_panic());
    let after_panic = engine
        .lock("guarded")
        .ttl(u * 100)
        .wait(u * 5)
        .acquire()
        .await;
    after_panic
        .expect("released after a panic")
        .release()
        .await
        .unwrap();
    // Cancellation while the closure runs.
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let cancelled = {
        let engine = engine.clone();
        tokio::spawn(async move {
            engine
                .mutex("guarded")
                .run(|| async move {
                    started_tx.send(()).unwrap();
                    std::future::pending::<()>().await
                })
                .await
        })
    };
    started_rx.await.unwrap();
    assert!(engine.lock("guarded").locked().await.unwrap());
    cancelled.abort();
    assert!(cancelled.await.unwrap_err().is_cancelled());
    let after_cancel = engine.lock("guarded").wait(u * 5).acquire().await;
    after_cancel
        .expect("released after cancellation")
        .release()
        .await
        .unwrap();
    assert_no_residue(h).await;
}

pub async fn key_mutex_reports_held_not_held_and_expiry(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let m = engine.mutex("manual");
    assert!(matches!(m.release().await, Err(MutexError::NotHeld)));
    m.acquire().await.unwrap();
    assert!(m.is_held());
    assert!(matches!(m.acquire().await, Err(MutexError::AlreadyHeld)));
    assert!(matches!(
        m.run(|| async {}).await,
        Err(MutexError::AlreadyHeld)
    ));
    m.release().await.unwrap();
    assert!(!m.is_held());
    assert!(matches!(m.release().await, Err(MutexError::NotHeld)));
    // The lease runs out while the closure works: the caller is told.
    let short = engine
        .mutex("manual")
        .with_lock(engine.lock("manual").ttl(u * 2).auto_renew(false));
    let out = short.run(|| sleep(u * 4)).await;
    assert!(
        matches!(out, Err(MutexError::ExpiredBeforeRelease)),
        "{out:?}"
    );
    assert_no_residue(h).await;
}

/// A waiter registers, is then left unpolled while the key passes it by (its grant runs
/// out, or an admin frees the key), another caller X takes the key, and only then is the
/// waiter's future dropped: X must still hold the key. (Every state change compares the
/// owner token, the clean-up of a dropped waiter included.)
pub async fn a_stale_waiter_dropped_late_leaves_the_next_holder_alone(h: &impl Harness) {
    let u = h.unit();
    for forced in [false, true] {
        let engine = h.engine();
        let first = engine.lock("stale").acquire().await.unwrap();
        let lock = engine.lock("stale").ttl(u).auto_renew(false);
        let mut waiter = tokio_test::task::spawn(async move { lock.acquire().await });
        assert!(
            waiter.poll().is_pending(),
            "the key is held: the waiter waits"
        );
        until_waiters(&engine, "stale", 1).await;
        first.release().await.unwrap();
        if forced {
            // Whoever holds it now (the unpolled waiter, on a hand-off backend) is thrown out;
            // a backend without admin operations runs the other variant only.
            if let Err(LockError::Unsupported(_)) = engine.admin().force_release("stale").await {
                drop(waiter);
                continue;
            }
        } else {
            // The waiter's grant (if it got one) runs out unseen.
            sleep(u * 3).await;
        }
        let x = engine
            .lock("stale")
            .wait(u * 20)
            .acquire()
            .await
            .expect("X takes the key the waiter never used");
        drop(waiter);
        assert!(
            x.owned().await.unwrap(),
            "dropping the stale waiter took X's key"
        );
        assert!(
            matches!(
                engine.lock("stale").try_acquire().await,
                Err(LockError::Busy { .. })
            ),
            "a third caller acquired while X holds the key (forced: {forced})"
        );
        x.release().await.unwrap();
        assert_no_residue(h).await;
    }
}

/// After a hand-off to a holder with a shorter lease than the one a waiter first saw, the
/// waiter gets the key when that shorter lease runs out, not when the first one would have.
pub async fn a_waiter_is_granted_when_a_shorter_successor_lease_expires(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let first = engine
        .lock("successor")
        .ttl(u * 60)
        .auto_renew(false)
        .acquire()
        .await
        .unwrap();
    let spawn_waiter = |ttl: Duration, wait: Duration| {
        let lock = engine
            .lock("successor")
            .fifo(true)
            .ttl(ttl)
            .wait(wait)
            .auto_renew(false);
        tokio::spawn(async move { lock.acquire().await })
    };
    // The successor: a short lease it never renews nor releases.
    let successor = spawn_waiter(u * 2, u * 60);
    until_waiters(&engine, "successor", 1).await;
    let last = spawn_waiter(u * 3, u * 30);
    until_waiters(&engine, "successor", 2).await;
    first.release().await.unwrap();
    let successor = successor.await.unwrap().expect("the successor is next");
    let last = last
        .await
        .unwrap()
        .expect("granted once the successor's short lease ran out");
    assert!(last.fence() > successor.fence());
    assert!(
        last.waited() < u * 20,
        "waited {:?} for a lease of {:?}",
        last.waited(),
        u * 2
    );
    drop(successor);
    last.release().await.unwrap();
    assert_no_residue(h).await;
}

/// Durations too long for the clock never panic: an unbounded wait is no limit, a TTL
/// or extension past the engine's maximum is refused with a typed error.
pub async fn huge_durations_never_panic(h: &impl Harness) {
    let engine = h.engine();
    let holder = engine.lock("huge").acquire().await.unwrap();
    let waiter = {
        let lock = engine.lock("huge").wait(Duration::MAX);
        tokio::spawn(async move { lock.acquire().await })
    };
    until_waiters(&engine, "huge", 1).await;
    holder.release().await.unwrap();
    let lease = waiter
        .await
        .expect("a wait of Duration::MAX does not panic")
        .expect("and is a wait without limit");
    for result in [
        lease.extend(Duration::MAX).await,
        lease.extend_to(Duration::MAX).await,
    ] {
        assert!(
            matches!(result, Err(LockError::InvalidValue(_))),
            "extend past the maximum TTL: {result:?}"
        );
    }
    assert!(lease.owned().await.unwrap());
    lease.release().await.unwrap();
    for ttl in [Duration::MAX, Duration::from_secs(u64::MAX / 4)] {
        let result = engine.lock("huge-ttl").ttl(ttl).acquire().await;
        assert!(
            matches!(result, Err(LockError::InvalidValue(_))),
            "a TTL of {ttl:?}: {result:?}"
        );
    }
    assert_no_residue(h).await;
}
