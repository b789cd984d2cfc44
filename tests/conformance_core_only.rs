//! The core conformance cases on a backend that implements the core `Backend` trait only
//! (the in-process backend behind a wrapper that reports no optional capability): what a
//! third backend (etcd, Postgres advisory locks) has to pass. Its missing capabilities are
//! a typed `Unsupported`, never a silent no-op.

mod support;

use std::{future::Future, pin::Pin, sync::Arc, time::Duration};

use support::{conformance::Harness, scripted::Scripted};
use tower_lock::{
    LockEngine, LockError, Token,
    engine::{Backend, Compare},
};

struct CoreOnly {
    backend: Arc<Scripted>,
    engine: LockEngine,
}

async fn core_only() -> CoreOnly {
    let backend = Arc::new(Scripted::core_only());
    let engine = LockEngine::from_arc(backend.clone());
    CoreOnly { backend, engine }
}

impl Harness for CoreOnly {
    fn engine(&self) -> LockEngine {
        self.engine.clone()
    }

    fn backend(&self) -> Arc<dyn Backend> {
        self.backend.clone()
    }

    fn unit(&self) -> Duration {
        Duration::from_millis(100)
    }

    fn residue(&self) -> Pin<Box<dyn Future<Output = Vec<String>> + Send + '_>> {
        Box::pin(async move {
            let n = self.backend.inner.key_count();
            (0..n).map(|i| format!("entry {i}")).collect()
        })
    }
}

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
    assert_eq!(h.backend.inner.key_count(), 0, "nothing was stored");
    // The lock itself works.
    let lease = engine.lock("k").acquire().await.unwrap();
    lease.release().await.unwrap();
}
