//! The lease's process-local machinery under the interleavings that break exclusion: a
//! blocked runtime, a cancelled release, a renewal that lands after `extend_to`, a renewal
//! in flight at release. The in-process backend runs underneath, behind hooks that hold a
//! chosen call (`tower_lock_test_support::scripted`), so each interleaving happens every run.

use std::{
    sync::{Arc, atomic::Ordering, mpsc},
    thread,
    time::Duration,
};

use tokio::time::{Instant, timeout};
use tower_lock::{Lease, LockEngine};
use tower_lock_test_support::scripted::Scripted;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Takes the engine's first lease on a runtime of its own, then blocks that runtime (a
/// blocking handler on an actix worker) until `unblock` is dropped.
fn block_the_first_runtime(engine: &LockEngine) -> (thread::JoinHandle<()>, mpsc::Sender<()>) {
    let (started_tx, started_rx) = mpsc::channel();
    let (unblock_tx, unblock_rx) = mpsc::channel::<()>();
    let engine = engine.clone();
    let worker = thread::spawn(move || {
        runtime().block_on(async move {
            let lease = engine.lock("first").acquire().await.unwrap();
            started_tx.send(()).unwrap();
            // Blocks the runtime's only thread: nothing else on it runs meanwhile.
            let _ = unblock_rx.recv();
            lease.release().await.unwrap();
        });
    });
    started_rx.recv().unwrap();
    (worker, unblock_tx)
}

#[test]
fn leases_are_renewed_while_the_runtime_that_took_the_first_lease_is_blocked() {
    let engine = LockEngine::in_memory();
    let (worker, unblock) = block_the_first_runtime(&engine);
    runtime().block_on(async {
        let lease = engine
            .lock("other")
            .ttl(Duration::from_millis(150))
            .acquire()
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(!lease.is_lost(), "the lease was reported lost");
        assert!(lease.owned().await.unwrap(), "the lease was not renewed");
        lease.release().await.unwrap();
    });
    drop(unblock);
    worker.join().unwrap();
}

#[test]
fn lost_fires_at_the_deadline_while_the_runtime_that_took_the_first_lease_is_blocked() {
    let engine = LockEngine::in_memory();
    let (worker, unblock) = block_the_first_runtime(&engine);
    runtime().block_on(async {
        let started = Instant::now();
        let lease = engine
            .lock("other")
            .ttl(Duration::from_millis(150))
            .auto_renew(false)
            .acquire()
            .await
            .unwrap();
        timeout(Duration::from_millis(1_000), lease.lost())
            .await
            .expect("lost() at the validity deadline, whatever the other runtime does");
        // Less the millisecond a server's clock may round a command's time down by.
        assert!(started.elapsed() >= Duration::from_millis(149));
    });
    drop(unblock);
    worker.join().unwrap();
}

#[test]
fn leases_are_renewed_after_the_runtime_that_took_the_first_lease_shut_down() {
    let engine = LockEngine::in_memory();
    runtime().block_on(async {
        let lease = engine.lock("first").acquire().await.unwrap();
        // Dropped with its runtime, unreleased: its release must not need that runtime.
        std::mem::forget(lease.lost_signal());
        drop(lease);
    });
    runtime().block_on(async {
        let lease = engine
            .lock("other")
            .ttl(Duration::from_millis(150))
            .acquire()
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(lease.owned().await.unwrap(), "the lease was not renewed");
        lease.release().await.unwrap();
        let first = engine
            .lock("first")
            .wait(Duration::from_secs(2))
            .acquire()
            .await;
        assert!(
            first.is_ok(),
            "the lease dropped with its runtime was never released"
        );
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_cancelled_before_its_command_went_out_still_releases() {
    let backend = Arc::new(Scripted::default());
    let engine = LockEngine::from_arc(backend.clone());
    let lease = engine
        .lock("k")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    backend.release.hold();
    // The caller gives up while the release waits to go out (a pool reconnecting, say).
    let cancelled = timeout(Duration::from_millis(20), lease.release()).await;
    assert!(
        cancelled.is_err(),
        "the release was held, so the caller timed out"
    );
    backend.release.open();
    let next = engine
        .lock("k")
        .wait(Duration::from_secs(3))
        .acquire()
        .await
        .expect("the cancelled release finished in the background, long before the 30 s TTL");
    next.release().await.unwrap();
    assert_eq!(backend.inner.key_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_mutex_run_cancelled_during_its_release_still_releases() {
    let backend = Arc::new(Scripted::default());
    let engine = LockEngine::from_arc(backend.clone());
    let mutex = engine.mutex("m");
    backend.release.hold();
    let run = mutex.run(|| async { 7 });
    let cancelled = timeout(Duration::from_millis(50), run).await;
    assert!(
        cancelled.is_err(),
        "the release was held, so the caller timed out"
    );
    backend.release.open();
    let next = engine
        .lock("m")
        .wait(Duration::from_secs(3))
        .acquire()
        .await
        .expect("the release begun by run() finished in the background");
    next.release().await.unwrap();
}

/// A lease of `ttl` on "k" whose first renewal is held at the backend's hook, on its way.
async fn lease_with_a_renewal_in_flight(ttl: Duration) -> (Arc<Scripted>, LockEngine, Lease) {
    let backend = Arc::new(Scripted::default());
    let engine = LockEngine::from_arc(backend.clone());
    backend.renew.hold();
    let lease = engine.lock("k").ttl(ttl).acquire().await.unwrap();
    backend.renew.entered(1).await;
    (backend, engine, lease)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_landing_after_extend_to_never_outlives_the_local_deadline() {
    let (backend, engine, lease) = lease_with_a_renewal_in_flight(Duration::from_millis(300)).await;
    // The watchdog's renewal (carrying the old 300 ms TTL) is on its way...
    // ...when the holder asks for more time, and gets it confirmed.
    lease.extend_to(Duration::from_secs(3)).await.unwrap();
    // The old renewal lands after it; every later renewal fails (a partition).
    backend.fail_renewals.store(true, Ordering::SeqCst);
    backend.renew.open();
    backend.renew.completed(1).await;
    let other = engine
        .lock("k")
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("the key frees up once the lease runs out on the backend");
    // By the time another caller holds the key, the old holder must know it lost it.
    timeout(Duration::from_millis(50), lease.lost())
        .await
        .expect("lost() fired after another caller already held the key");
    other.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_in_flight_at_release_does_not_report_the_lease_lost() {
    let (backend, _engine, lease) = lease_with_a_renewal_in_flight(Duration::from_millis(90)).await;
    let signal = lease.lost_signal();
    lease.release().await.unwrap();
    // The renewal lands after the release and finds the key gone: that is the release,
    // not a lost lease.
    backend.renew.open();
    backend.renew.completed(1).await;
    let fired = timeout(Duration::from_millis(200), signal.lost()).await;
    assert!(
        fired.is_err(),
        "a normally released lease was reported lost"
    );
}

/// A waiter queued from a runtime that then blocks (a blocking handler on an actix worker)
/// is handed the key for a claim period, not for its whole lease: the waiter behind it, on
/// a healthy runtime, is granted the key once the claim ran out, not after the blocked
/// waiter's TTL (as on Redis, whose hand-offs carry the same claim).
#[test]
fn a_hand_off_to_a_waiter_on_a_blocked_runtime_holds_the_key_for_a_claim_only() {
    let engine = LockEngine::in_memory();
    let healthy = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let holder = healthy.block_on(engine.lock("k").acquire()).unwrap();
    // Runtime A, one worker: its waiter queues, then the worker blocks.
    let a = runtime_with_one_worker();
    let stuck = {
        let lock = engine
            .lock("k")
            .fifo(true)
            .ttl(Duration::from_secs(60))
            .wait(Duration::from_secs(120));
        a.spawn(async move { lock.acquire().await })
    };
    healthy.block_on(until_waiters(&engine, 1));
    let (unblock, blocked_until) = mpsc::channel::<()>();
    let (entered, inside) = mpsc::channel::<()>();
    a.spawn(async move {
        entered.send(()).unwrap();
        // A blocking call in A's only worker: the waiter there is never polled meanwhile.
        let _ = blocked_until.recv();
    });
    inside.recv().unwrap();
    healthy.block_on(async {
        let behind = {
            let lock = engine.lock("k").fifo(true).wait(Duration::from_secs(20));
            tokio::spawn(async move { lock.acquire().await })
        };
        until_waiters(&engine, 2).await;
        let released = Instant::now();
        holder.release().await.unwrap();
        let lease = behind
            .await
            .unwrap()
            .expect("the waiter behind is granted the key");
        let waited = released.elapsed();
        assert!(
            waited < Duration::from_secs(6),
            "the key was held for a waiter on a blocked runtime for {waited:?} (its TTL: 60 s)"
        );
        lease.release().await.unwrap();
    });
    drop(unblock);
    // The blocked waiter's grant ran out before it could take it: it asks again and gets
    // the key, now free.
    let again = healthy
        .block_on(async { timeout(Duration::from_secs(10), stuck).await })
        .expect("the first waiter ends")
        .unwrap()
        .expect("and is granted the key");
    healthy.block_on(again.release()).unwrap();
    a.shutdown_background();
}

fn runtime_with_one_worker() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

async fn until_waiters(engine: &LockEngine, n: usize) {
    let give_up = Instant::now() + Duration::from_secs(10);
    while engine.lock("k").waiters().await.unwrap() != n {
        assert!(Instant::now() < give_up, "never saw {n} waiters");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// A lease released while valid is never reported lost afterwards, not even once the
/// validity deadline it had passes; one released after its deadline passed stays lost.
#[test]
fn a_lease_released_while_valid_never_reads_lost_and_one_released_late_stays_lost() {
    let engine = LockEngine::in_memory();
    runtime().block_on(async {
        let ttl = Duration::from_millis(100);
        let lease = engine
            .lock("valid")
            .ttl(ttl)
            .auto_renew(false)
            .acquire()
            .await
            .unwrap();
        let signal = lease.lost_signal();
        let deadline = lease.valid_until();
        lease.release().await.unwrap();
        tokio::time::sleep_until(deadline + Duration::from_millis(20)).await;
        assert!(
            !signal.is_lost(),
            "released while valid, read lost after its deadline"
        );
        assert!(
            timeout(Duration::from_millis(100), signal.lost())
                .await
                .is_err(),
            "lost() resolved for a lease released while valid"
        );

        let late = engine
            .lock("late")
            .ttl(ttl)
            .auto_renew(false)
            .acquire()
            .await
            .unwrap();
        let signal = late.lost_signal();
        tokio::time::sleep_until(late.valid_until() + Duration::from_millis(20)).await;
        assert!(signal.is_lost());
        let _ = late.release().await;
        assert!(
            signal.is_lost(),
            "lost before its release, read valid after it"
        );
        timeout(Duration::from_millis(100), signal.lost())
            .await
            .expect("lost() resolves for a lease lost before its release");
    });
}
