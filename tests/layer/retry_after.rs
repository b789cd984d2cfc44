//! `Retry-After` of a contended request: the 95th percentile of the layer's recent hold
//! times (before any, the fallback: 1 s unless set), less what the holder has already held
//! the key when it is one of the layer's requests on this node, bounded by the holder's
//! remaining lease, in whole seconds rounded to the nearest, never 0.
//!
//! Hold times are measured on tokio's clock, paused here and advanced by hand; each holder
//! is taken after the holds, so its remaining lease is its TTL.

use std::time::Duration;

use tower_lock::{Lease, LockEngine, LockLayer, key::HeaderKey};
use tower_lock_core::{Outcome, RequestLocker};

fn req(key: &str) -> http::Request<()> {
    http::Request::post("/jobs")
        .header("x-k", key)
        .body(())
        .unwrap()
}

fn locker(engine: &LockEngine) -> RequestLocker {
    LockLayer::builder(engine.clone())
        .key(HeaderKey::new("x-k"))
        .build_locker()
        .unwrap()
}

/// Hold `value`'s key for `held` (tokio time), `n` times, through the locker.
async fn holds(locker: &RequestLocker, value: &str, held: Duration, n: usize) {
    for _ in 0..n {
        let Outcome::Locked(guard) = locker.acquire(&req(value)).await else {
            panic!("{value} is free");
        };
        tokio::time::advance(held).await;
        guard.release().await;
    }
}

/// Another holder of `value`'s key, with a lease of `ttl`.
async fn holder(engine: &LockEngine, locker: &RequestLocker, value: &str, ttl: Duration) -> Lease {
    let key = locker.key_for(value).unwrap();
    engine.lock_on(key).ttl(ttl).try_acquire().await.unwrap()
}

async fn retry_after(locker: &RequestLocker, value: &str) -> u64 {
    match locker.acquire(&req(value)).await {
        Outcome::Rejected(rejection) => rejection.retry_after().expect("Retry-After"),
        other => panic!("expected a rejection, got {other:?}"),
    }
}

/// Before the layer has seen a hold (after every deploy), the remaining lease (30 s by
/// default) would tell every client that honours `Retry-After` to wait half a minute for
/// a handler that takes a second: the answer is the short fallback instead.
#[tokio::test(start_paused = true)]
async fn without_observed_holds_the_fallback_is_the_answer_never_the_lease() {
    let engine = LockEngine::in_memory();
    let locker = locker(&engine);
    let _held = holder(&engine, &locker, "a", Duration::from_secs(30)).await;
    assert_eq!(retry_after(&locker, "a").await, 1);
    // A layer that declares a longer fallback gets it, still bounded by the lease.
    let slow = LockLayer::builder(engine.clone())
        .key(HeaderKey::new("x-k"))
        .retry_after_fallback(Duration::from_secs(5))
        .build_locker()
        .unwrap();
    let _held = holder(&engine, &slow, "b", Duration::from_secs(30)).await;
    assert_eq!(retry_after(&slow, "b").await, 5);
    let _short = holder(&engine, &slow, "c", Duration::from_secs(2)).await;
    assert_eq!(retry_after(&slow, "c").await, 2);
}

#[tokio::test(start_paused = true)]
async fn observed_holds_shorten_it_to_their_95th_percentile() {
    let engine = LockEngine::in_memory();
    let locker = locker(&engine);
    // 19 holds of 2 s and one of 20 s: the 95th percentile is 2 s.
    holds(&locker, "x", Duration::from_secs(2), 19).await;
    holds(&locker, "x", Duration::from_secs(20), 1).await;
    let _held = holder(&engine, &locker, "a", Duration::from_secs(30)).await;
    assert_eq!(retry_after(&locker, "a").await, 2);
    // Seconds are rounded to the nearest: 2.5 s holds answer 3, 2.003 s holds 2.
    holds(&locker, "x", Duration::from_millis(2_500), 128).await;
    let _held = holder(&engine, &locker, "b", Duration::from_secs(30)).await;
    assert_eq!(retry_after(&locker, "b").await, 3);
    holds(&locker, "x", Duration::from_millis(2_003), 128).await;
    let _held = holder(&engine, &locker, "c", Duration::from_secs(30)).await;
    assert_eq!(retry_after(&locker, "c").await, 2);
}

/// A contender is told what is left of a usual hold: with 5 s holds, a holder (a request
/// of this layer on this node) that has run 3 s leaves about 2 s; one past the usual hold
/// leaves the minimum, 1 s. The same with the fallback standing in before any hold.
#[tokio::test(start_paused = true)]
async fn what_the_holder_already_had_is_taken_off() {
    let engine = LockEngine::in_memory();
    let locker = locker(&engine);
    holds(&locker, "x", Duration::from_secs(5), 20).await;
    let Outcome::Locked(guard) = locker.acquire(&req("a")).await else {
        panic!("a is free");
    };
    assert_eq!(retry_after(&locker, "a").await, 5);
    tokio::time::advance(Duration::from_secs(3)).await;
    assert_eq!(retry_after(&locker, "a").await, 2);
    tokio::time::advance(Duration::from_secs(4)).await;
    assert_eq!(retry_after(&locker, "a").await, 1);
    guard.release().await;
    // A holder that is not one of the layer's requests here: a whole usual hold.
    let _other = holder(&engine, &locker, "a", Duration::from_secs(30)).await;
    assert_eq!(retry_after(&locker, "a").await, 5);

    let fresh = LockLayer::builder(engine.clone())
        .key(HeaderKey::new("x-k"))
        .retry_after_fallback(Duration::from_secs(5))
        .build_locker()
        .unwrap();
    let Outcome::Locked(_guard) = fresh.acquire(&req("b")).await else {
        panic!("b is free");
    };
    tokio::time::advance(Duration::from_secs(3)).await;
    assert_eq!(retry_after(&fresh, "b").await, 2);
}

#[tokio::test(start_paused = true)]
async fn the_holders_remaining_lease_bounds_it() {
    let engine = LockEngine::in_memory();
    let locker = locker(&engine);
    holds(&locker, "x", Duration::from_secs(20), 3).await;
    let _long = holder(&engine, &locker, "a", Duration::from_secs(30)).await;
    let _short = holder(&engine, &locker, "b", Duration::from_secs(4)).await;
    assert_eq!(retry_after(&locker, "a").await, 20);
    assert_eq!(retry_after(&locker, "b").await, 4);
}

#[tokio::test(start_paused = true)]
async fn instant_holds_still_answer_at_least_one_second() {
    let engine = LockEngine::in_memory();
    let locker = locker(&engine);
    holds(&locker, "x", Duration::ZERO, 5).await;
    let _held = holder(&engine, &locker, "a", Duration::from_secs(30)).await;
    assert_eq!(retry_after(&locker, "a").await, 1);
}

/// Under permits, as under the lock: after one 2.5 s hold, a contender arriving 2 s into
/// the next is told what is left of it (1 s), not a whole usual hold (3 s), whether the
/// holder is the one permit of `permits(1)`, a writer behind `shared_for`, or the first of
/// two shared holders that fill `permits(2)`.
#[tokio::test(start_paused = true)]
async fn under_permits_what_the_holder_already_had_is_taken_off_too() {
    let engine = LockEngine::in_memory();
    let builder = || LockLayer::builder(engine.clone()).key(HeaderKey::new("x-k"));
    let layers = [
        ("lock", builder().build_locker().unwrap(), 1),
        (
            "permits(1)",
            builder().permits(1).build_locker().unwrap(),
            1,
        ),
        (
            "shared_for writer",
            builder().shared_for(["GET"]).build_locker().unwrap(),
            1,
        ),
        (
            "permits(2)",
            builder().permits(2).build_locker().unwrap(),
            2,
        ),
    ];
    for (name, locker, holders) in layers {
        holds(&locker, name, Duration::from_millis(2_500), 1).await;
        let mut guards = Vec::new();
        for _ in 0..holders {
            let Outcome::Locked(guard) = locker.acquire(&req(name)).await else {
                panic!("{name}: the key has a permit left");
            };
            guards.push(guard);
            // The first holder is the one whose hold ends first, as a usual hold goes.
            tokio::time::advance(Duration::from_millis(500)).await;
        }
        tokio::time::advance(Duration::from_millis(2_000 - 500 * holders as u64)).await;
        assert_eq!(retry_after(&locker, name).await, 1, "{name}");
        for guard in guards {
            guard.release().await;
        }
    }
}
