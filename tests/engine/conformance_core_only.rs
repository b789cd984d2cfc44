//! The core conformance cases on a backend that implements the core `Backend` trait only
//! (the in-process backend behind a wrapper that reports no optional capability): what a
//! third backend (etcd, Postgres advisory locks) has to pass. Its missing capabilities are
//! a typed `Unsupported`, never a silent no-op.

use tower_lock::{LockError, Token, engine::Compare};
use tower_lock_test_support::{
    conformance::{Harness, core_only},
    core_conformance_tests,
};

core_conformance_tests!(
    timed = #[tokio::test(flavor = "multi_thread", worker_threads = 2)],
    concurrent = #[tokio::test(flavor = "multi_thread", worker_threads = 4)],
    harness = core_only(),
);

#[tokio::test]
async fn missing_capabilities_are_unsupported_and_change_nothing() {
    let h = core_only().await;
    let engine = h.engine();
    let unsupported = |r: Result<(), LockError>| matches!(r, Err(LockError::Unsupported(_)));
    let admin = engine.admin();
    let token = Token::new("maintenance").unwrap();
    assert!(unsupported(admin.set("k", &token, None).await));
    assert!(unsupported(admin.force_release("k").await.map(drop)));
    assert!(unsupported(engine.numeric("n").get().await.map(drop)));
    let set = engine
        .numeric("n")
        .set_if(Compare::Greater, 1.0, None)
        .await;
    assert!(unsupported(set.map(drop)));
    assert!(unsupported(engine.pool("p").add(["a"]).await.map(drop)));
    assert!(unsupported(engine.pool("p").members().await.map(drop)));
    assert!(unsupported(engine.pool("p").health().await.map(drop)));
    let permits = engine.lock("p").shared(2);
    assert!(unsupported(permits.acquire().await.map(drop)));
    assert!(unsupported(
        permits.clone().shared(1).try_acquire().await.map(drop)
    ));
    assert!(unsupported(permits.holders().await.map(drop)));
    assert!(unsupported(permits.waiters().await.map(drop)));
    assert_eq!(h.backend_ref().inner.key_count(), 0, "nothing was stored");
    // The lock itself works.
    let lease = engine.lock("k").acquire().await.unwrap();
    lease.release().await.unwrap();
}
