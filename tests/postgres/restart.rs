//! The backend on a cluster of the test's own, crashed (immediate shutdown) and restarted
//! under a holder and a waiter: every failure is a documented error within its bound,
//! nothing hangs, and the waiter is granted only once the holder released or was told its
//! lease was lost.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::time::{Instant, timeout};
use tower_lock::engine::{BackendErrorKind, LockEngine, LockError, postgres::PostgresBackend};
use tower_lock_test_support::postgres::PostgresServer;

/// A failure the engine documents for a backend that is down: unavailable, timed out, or a
/// wait that ended.
fn documented(e: &LockError) -> bool {
    match e {
        LockError::Backend(b) => {
            matches!(
                b.kind(),
                BackendErrorKind::Unavailable | BackendErrorKind::Timeout
            )
        }
        LockError::TimedOut { .. } => true,
        _ => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_and_restart_under_a_holder_and_a_waiter_never_makes_two_holders() {
    let server = Arc::new(
        tokio::task::spawn_blocking(PostgresServer::start)
            .await
            .unwrap(),
    );
    let builder = PostgresBackend::builder(server.url())
        .schema("faults")
        .command_timeout(Duration::from_millis(500));
    builder.migrate().await.unwrap();
    let engine = LockEngine::new(builder.build().await.unwrap());
    let holder = engine
        .lock("k")
        .ttl(Duration::from_secs(3))
        .acquire()
        .await
        .unwrap();
    // When the holder stopped holding as far as it knows: lost, or its release begun.
    let holder_end: Arc<Mutex<Option<Instant>>> = Arc::default();
    {
        let (lost, end) = (holder.lost(), holder_end.clone());
        tokio::spawn(async move {
            lost.await;
            end.lock().unwrap().get_or_insert_with(Instant::now);
        });
    }
    let waiter = {
        let lock = engine
            .lock("k")
            .ttl(Duration::from_secs(3))
            .wait(Duration::from_secs(20));
        tokio::spawn(async move {
            let result = lock.acquire().await;
            (result, Instant::now())
        })
    };
    let give_up = Instant::now() + Duration::from_secs(10);
    while engine.lock("k").waiters().await.unwrap() != 1 {
        assert!(Instant::now() < give_up, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }

    let down = server.clone();
    tokio::task::spawn_blocking(move || down.kill())
        .await
        .unwrap();
    // Down: a call fails with a documented error, within its bound.
    let asked = Instant::now();
    let err = engine.lock("other").try_acquire().await.unwrap_err();
    assert!(documented(&err), "{err:?}");
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "took {:?}",
        asked.elapsed()
    );

    let up = server.clone();
    tokio::task::spawn_blocking(move || up.restart())
        .await
        .unwrap();
    // The holder gives the key back (or finds it was told it lost it).
    holder_end.lock().unwrap().get_or_insert_with(Instant::now);
    if let Err(e) = holder.release().await {
        assert!(
            documented(&e) || matches!(e, LockError::Expired | LockError::NotOwned),
            "{e:?}"
        );
    }
    let (result, granted_at) = timeout(Duration::from_secs(30), waiter)
        .await
        .expect("the waiter ends")
        .unwrap();
    match result {
        Ok(lease) => {
            let end = holder_end.lock().unwrap().expect("the holder ended");
            assert!(
                granted_at >= end,
                "the waiter was granted while the holder's lease was still reported valid"
            );
            lease.release().await.unwrap();
        }
        Err(e) => assert!(documented(&e), "{e:?}"),
    }
    // Nothing is stuck: the key is taken again within a lease TTL.
    let again = engine
        .lock("k")
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("the key is free again after the restart");
    again.release().await.unwrap();
}
