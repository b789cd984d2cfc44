use std::time::Duration;

use crate::{LockEngine, LockError, altered::Altered};

/// A runtime of its own, for an acquire that might spin without yielding: shut down
/// without waiting for it (`shutdown_background`), it cannot keep the test from ending.
fn own_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A contended acquire with the shortest TTL (`ttl(1 ms)`, rounded up to the engine's
/// minimum) ends within its wait once the key is released, and leaves the key free.
#[test]
fn a_contended_acquire_with_the_shortest_ttl_ends_and_leaves_the_key_free() {
    let runtime = own_runtime();
    let engine = LockEngine::in_memory();
    let outcome = runtime.block_on(async {
        let a = engine
            .lock("k")
            .ttl(Duration::from_secs(5))
            .acquire()
            .await
            .unwrap();
        let waiter = engine
            .lock("k")
            .ttl(Duration::from_millis(1))
            .wait(Duration::from_secs(1));
        let b = tokio::spawn(async move { waiter.acquire().await });
        // B waits for the key (its wait is queued) before A lets it go.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        while engine.lock("k").waiters().await.unwrap() == 0 {
            assert!(tokio::time::Instant::now() < deadline, "B never waited");
            tokio::task::yield_now().await;
        }
        a.release().await.unwrap();
        let b = tokio::time::timeout(Duration::from_secs(3), b)
            .await
            .map(|joined| joined.unwrap());
        let Ok(b) = b else {
            return Err("B's acquire did not end within 3 s of the release");
        };
        match b {
            Ok(lease) => drop(lease),
            Err(LockError::TimedOut { .. }) => {}
            Err(e) => panic!("B: {e}"),
        }
        Ok(engine.lock("k").locked().await.unwrap())
    });
    runtime.shutdown_background();
    assert_eq!(outcome, Ok(false), "the key is left free");
}

/// Grants that keep running out are asked for again only while the wait allows, yielding
/// in between; then the acquire fails as a wait that ran out does, and the key is given
/// back.
#[test]
fn grants_that_keep_running_out_end_the_acquire_with_its_wait_and_leave_the_key_free() {
    let runtime = own_runtime();
    // Every grant has run out by the time it is returned (a claim of zero): what a caller
    // sees of grants that keep running out before they reach it.
    let engine = LockEngine::new(Altered {
        claim: Some(Duration::ZERO),
        ..Altered::default()
    });
    let outcome = runtime.block_on(async {
        // Spawned: an acquire that never yields would keep `block_on`'s own thread, and
        // the timeout with it.
        let lock = engine.lock("k").wait(Duration::from_millis(200));
        let waited = tokio::spawn(async move { lock.acquire().await });
        let Ok(waited) = tokio::time::timeout(Duration::from_secs(3), waited).await else {
            return Err("the acquire did not end within 3 s");
        };
        let waited = waited.unwrap();
        assert!(
            matches!(waited, Err(LockError::TimedOut { .. })),
            "{waited:?}"
        );
        assert!(!engine.lock("k").locked().await.unwrap(), "given back");
        let lock = engine.lock("k");
        let tried = tokio::spawn(async move { lock.try_acquire().await });
        let Ok(tried) = tokio::time::timeout(Duration::from_secs(3), tried).await else {
            return Err("the try did not end within 3 s");
        };
        let tried = tried.unwrap();
        assert!(matches!(tried, Err(LockError::Busy { .. })), "{tried:?}");
        Ok(engine.lock("k").locked().await.unwrap())
    });
    runtime.shutdown_background();
    assert_eq!(outcome, Ok(false), "the key is left free");
}

/// A handle's status sees every holder of its key, whatever mode the handle and the
/// holders are in (one space per key): `locked()`, `holder()`, `holders()` and `owned()`
/// agree from a lock handle and from shared ones, and `shared(n).exclusive()` is the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_sees_every_holder_whatever_the_handles_mode() {
    let engine = LockEngine::in_memory();
    let (lock, readers) = (engine.lock("doc"), engine.lock("doc").shared(3));
    let reader = readers.try_acquire().await.unwrap();
    for handle in [&lock, &readers, &engine.lock("doc").shared(1)] {
        assert!(handle.locked().await.unwrap());
        let holders = handle.holders().await.unwrap();
        assert_eq!(holders.len(), 1);
        assert_eq!(holders[0].token, *reader.token());
        assert!(holders[0].mode.is_shared() && !holders[0].mode.is_alone());
    }
    assert!(reader.owned().await.unwrap());
    let back = engine.lock("doc").shared(3).exclusive();
    assert_eq!(back.mode(), crate::Mode::Exclusive);
    assert!(matches!(
        back.try_acquire().await,
        Err(LockError::Busy { .. })
    ));
    reader.release().await.unwrap();
    let held = back.try_acquire().await.unwrap();
    let holder = readers.holder().await.unwrap().unwrap();
    assert_eq!(holder.mode, crate::Mode::Exclusive);
    assert_eq!(holder.token, *held.token());
    held.release().await.unwrap();
    assert!(!readers.locked().await.unwrap());
}
