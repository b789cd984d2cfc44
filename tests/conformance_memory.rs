//! The conformance suite on the in-process backend, on the real clock (the engine keeps
//! time for leases on its own thread, which a paused test clock does not drive).

mod support;

use std::{future::Future, pin::Pin, sync::Arc, time::Duration};

use support::conformance::Harness;
use tower_lock::{LockEngine, MemoryBackend, engine::Backend};

struct Memory {
    backend: Arc<MemoryBackend>,
    engine: LockEngine,
}

async fn memory() -> Memory {
    let backend = Arc::new(MemoryBackend::new());
    let engine = LockEngine::from_arc(backend.clone());
    Memory { backend, engine }
}

impl Harness for Memory {
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
            let n = self.backend.key_count();
            (0..n).map(|i| format!("entry {i}")).collect()
        })
    }
}

conformance_tests!(
    timed = #[tokio::test(flavor = "multi_thread", worker_threads = 2)],
    concurrent = #[tokio::test(flavor = "multi_thread", worker_threads = 4)],
    harness = memory(),
);
