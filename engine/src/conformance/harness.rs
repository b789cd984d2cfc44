//! [`Harness`]: what a backend provides to run the suite; [`BackendHarness`], one for any
//! [`Backend`]; and the in-process backend's.

use std::{future::Future, pin::Pin, sync::Arc, time::Duration};

use crate::{Backend, LockEngine, MemoryBackend};

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

/// How a [`BackendHarness`] lists what its backend still keeps: keys or entries, empty
/// when nothing is left.
pub type Residue<B> = fn(&B) -> Pin<Box<dyn Future<Output = Vec<String>> + Send + '_>>;

/// A backend under test, the engine on it, the time unit of its TTL cases, and how to list
/// what it still keeps.
pub struct BackendHarness<B> {
    backend: Arc<B>,
    engine: LockEngine,
    unit: Duration,
    residue: Residue<B>,
}

impl<B: Backend> BackendHarness<B> {
    /// A harness over `backend` (the engine is [`LockEngine::from_arc`] on it, so no
    /// shortcut of the in-process backend is taken), whose TTL cases use `unit` as their
    /// time unit (comfortably above a round trip to the backend), and whose `residue`
    /// lists what the backend still keeps.
    pub fn new(backend: B, unit: Duration, residue: Residue<B>) -> Self {
        let backend = Arc::new(backend);
        let engine = LockEngine::from_arc(backend.clone());
        Self {
            backend,
            engine,
            unit,
            residue,
        }
    }

    /// The backend under test.
    pub fn backend_ref(&self) -> &B {
        &self.backend
    }
}

impl<B> std::fmt::Debug for BackendHarness<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackendHarness")
            .field("engine", &self.engine)
            .field("unit", &self.unit)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> Harness for BackendHarness<B> {
    fn engine(&self) -> LockEngine {
        self.engine.clone()
    }

    fn backend(&self) -> Arc<dyn Backend> {
        self.backend.clone()
    }

    fn unit(&self) -> Duration {
        self.unit
    }

    fn residue(&self) -> Pin<Box<dyn Future<Output = Vec<String>> + Send + '_>> {
        (self.residue)(&self.backend)
    }
}

/// `n` entries, named by number.
fn entries(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("entry {i}")).collect()
}

/// A fresh in-process backend, on the real clock (the engine keeps time for leases on its
/// own thread, which a paused test clock does not drive).
pub async fn memory() -> BackendHarness<MemoryBackend> {
    BackendHarness::new(MemoryBackend::new(), Duration::from_millis(100), |b| {
        Box::pin(async move { entries(b.key_count()) })
    })
}
