//! A backend that runs the in-process backend underneath but lets a test hold or fail
//! chosen calls, to force the interleavings that a real backend produces only now and then
//! (a renewal that lands late, a release that has not gone out yet).
//!
//! ```ignore
//! let backend = Arc::new(Scripted::default());
//! let engine = LockEngine::from_arc(backend.clone());
//! backend.renew.hold();               // the next renewals wait at the hook
//! backend.renew.entered(1).await;     // one is waiting there now
//! backend.renew.open();               // let them land
//! ```

use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use tokio::sync::watch;
use tower_lock::{
    LockError, MemoryBackend, Token,
    engine::{
        AcquireRequest, Backend, BackendError, BackendErrorKind, BoxFuture, Capabilities,
        ExtendMode, Grant, Holder, LockKey, Mode, Renewal,
    },
};

/// A point calls pass through: open (the default), or held until the test opens it.
#[derive(Debug)]
pub struct Hook {
    held: watch::Sender<bool>,
    /// How many calls wait at the hook now.
    waiting: watch::Sender<usize>,
    /// How many calls have passed the hook and finished the real operation.
    done: watch::Sender<usize>,
}

impl Default for Hook {
    fn default() -> Self {
        Self {
            held: watch::Sender::new(false),
            waiting: watch::Sender::new(0),
            done: watch::Sender::new(0),
        }
    }
}

impl Hook {
    /// Calls from now on wait until [`Hook::open`].
    pub fn hold(&self) {
        self.held.send_replace(true);
    }

    /// Let waiting and later calls through.
    pub fn open(&self) {
        self.held.send_replace(false);
    }

    /// Wait until at least `n` calls wait at the hook.
    pub async fn entered(&self, n: usize) {
        let mut rx = self.waiting.subscribe();
        rx.wait_for(|w| *w >= n).await.unwrap();
    }

    /// Wait until at least `n` calls have completed the real operation.
    pub async fn completed(&self, n: usize) {
        let mut rx = self.done.subscribe();
        rx.wait_for(|d| *d >= n).await.unwrap();
    }

    async fn pass(&self) {
        let mut rx = self.held.subscribe();
        if !*rx.borrow_and_update() {
            return;
        }
        self.waiting.send_modify(|w| *w += 1);
        rx.wait_for(|held| !*held).await.unwrap();
        self.waiting.send_modify(|w| *w -= 1);
    }

    fn finished(&self) {
        self.done.send_modify(|d| *d += 1);
    }
}

/// The in-process backend with hooks on release and renew, and a switch that fails renewals.
#[derive(Debug, Default)]
pub struct Scripted {
    /// The in-process backend that does the work.
    pub inner: MemoryBackend,
    /// The hook renewals pass through.
    pub renew: Hook,
    /// The hook releases pass through.
    pub release: Hook,
    /// Renewals that arrive while this is set fail as a backend error (a partition).
    pub fail_renewals: AtomicBool,
    /// Acquisitions that arrive while this is set fail as a backend error (an outage).
    pub fail_acquires: AtomicBool,
    /// Report no optional capability: a backend that implements the core trait only.
    pub core_only: bool,
}

impl Scripted {
    /// The in-process backend seen through the core `Backend` trait only.
    pub fn core_only() -> Self {
        Self {
            core_only: true,
            ..Self::default()
        }
    }
}

fn partitioned<T>() -> Result<T, LockError> {
    Err(LockError::Backend(BackendError::new(
        BackendErrorKind::Unavailable,
        "partitioned (test backend)",
    )))
}

impl Backend for Scripted {
    fn acquire(&self, req: AcquireRequest) -> BoxFuture<'_, Result<Grant, LockError>> {
        if self.fail_acquires.load(Ordering::SeqCst) {
            return Box::pin(async { partitioned() });
        }
        self.inner.acquire(req)
    }

    fn release<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        mode: Mode,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(async move {
            self.release.pass().await;
            let result = self.inner.release(key, token, mode).await;
            self.release.finished();
            result
        })
    }

    fn extend<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        mode: Mode,
        ttl: Duration,
        how: ExtendMode,
    ) -> BoxFuture<'a, Result<Duration, LockError>> {
        self.inner.extend(key, token, mode, ttl, how)
    }

    fn renew<'a>(&'a self, leases: &'a [Renewal]) -> BoxFuture<'a, Result<Vec<bool>, LockError>> {
        Box::pin(async move {
            if self.fail_renewals.load(Ordering::SeqCst) {
                return partitioned();
            }
            self.renew.pass().await;
            let result = self.inner.renew(leases).await;
            self.renew.finished();
            result
        })
    }

    fn holders<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<Vec<Holder>, LockError>> {
        self.inner.holders(key)
    }

    fn waiters<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<usize, LockError>> {
        self.inner.waiters(key)
    }

    fn has_shared_mode(&self) -> bool {
        !self.core_only && self.inner.has_shared_mode()
    }

    fn capabilities(&self) -> Capabilities<'_> {
        if self.core_only {
            Capabilities::none()
        } else {
            self.inner.capabilities()
        }
    }
}
