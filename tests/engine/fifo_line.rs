//! A node's FIFO acquires of a key reach the backend in the order they were called, even
//! when the first has to wait for this node's own release of the key to land: the acquire
//! called after it (the releasing caller asking again at once) must not pass it.

use std::{future::Future, pin::Pin, sync::Arc, task::Poll, time::Duration};

use tower_lock::LockEngine;
use tower_lock_test_support::scripted::Scripted;

/// Rounds per backend flavour: the order must hold every time, whatever the scheduling.
const ROUNDS: usize = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_acquire_waiting_for_the_nodes_release_keeps_its_place_before_a_later_one() {
    for core_only in [false, true] {
        for round in 0..ROUNDS {
            let backend = Arc::new(if core_only {
                Scripted::core_only()
            } else {
                Scripted::default()
            });
            let engine = LockEngine::from_arc(backend.clone());
            let lock = engine.lock("k").fifo(true).wait(Duration::from_secs(10));
            let held = lock.acquire().await.unwrap();
            // The holder's release is in flight (sent, not answered).
            backend.release.hold();
            let release = tokio::spawn(held.release());
            backend.release.entered(1).await;
            // Called now: it must let that release land first, and keeps its place.
            let mut earlier = Box::pin(lock.acquire());
            assert!(
                polled(&mut earlier).await.is_pending(),
                "round {round}: went before the release landed"
            );
            backend.release.open();
            release.await.unwrap().unwrap();
            // The key is free and nothing is in flight any more: an acquire called now
            // (the releasing caller, asking again) still comes second.
            let mut later = Box::pin(lock.acquire());
            if let Poll::Ready(granted) = polled(&mut later).await {
                panic!(
                    "round {round} (core only: {core_only}): an acquire called later was \
                     answered first ({:?})",
                    granted.map(|l| l.fence())
                );
            }
            let first = earlier.await.unwrap();
            let first_fence = first.fence();
            first.release().await.unwrap();
            let second = later.await.unwrap();
            assert!(
                second.fence() > first_fence,
                "round {round}: fences out of grant order"
            );
            second.release().await.unwrap();
        }
    }
}

/// Poll `f` once, with this task's waker: where it stands after its first steps.
async fn polled<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
    std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *f).poll(cx))).await
}
