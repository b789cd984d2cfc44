//! [`RunsOn`]: a request that runs on to its commit after its client left, as the
//! engine-backed idempotency layer's does; the signal its framework's future and the
//! protocol's steps share.

use std::{
    fmt,
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use tokio::sync::Notify;

/// Whether a covered request's handler began (from then on a client that leaves does not
/// cancel it), and whether its client left. A framework's response future makes one,
/// hands a clone to the protocol's steps, and when it is dropped before its end (the
/// client left; or a `tower::timeout` outside the layer, which cannot be told apart)
/// calls [`client_left`](Self::client_left): `true` means the rest of the request must
/// run on a task of its own, to its commit or rollback.
///
/// Why the same as the engine-backed layer: a client whose timeout is shorter than the
/// handler would otherwise never succeed, and an effect the handler began (a call to a
/// card network) would be orphaned by a rollback. The bound is the engine-backed layer's
/// too: the handler runs to its end (a deadline inside the layer is the way to bound it),
/// and the response body is read for at most the layer's `max_drain_time` once the client
/// has left, counted from the later of its departure and the start of the body's read (a
/// client that left during the handler: from the handler's answer, as the engine-backed
/// layer's drain counts), then recorded as completed but not stored.
#[derive(Clone, Default)]
pub struct RunsOn {
    state: Arc<State>,
}

#[derive(Default)]
struct State {
    /// The key is claimed and the handler called.
    running: AtomicBool,
    /// The framework dropped the request's future.
    left: AtomicBool,
    /// Woken when `left` is set.
    notify: Notify,
}

impl fmt::Debug for RunsOn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunsOn")
            .field("running", &self.state.running.load(Ordering::Relaxed))
            .field("left", &self.state.left.load(Ordering::Relaxed))
            .finish()
    }
}

impl RunsOn {
    /// A request whose handler has not begun.
    pub fn new() -> Self {
        Self::default()
    }

    /// The key is the request's and its handler is about to be called: from now on a
    /// client that leaves does not cancel it. (Before, a drop cancels: a duplicate
    /// waiting for its claim, or a request body still being read, has done nothing.)
    pub fn begin(&self) {
        self.state.running.store(true, Ordering::Release);
    }

    /// The request's future was dropped before its end: whether the rest must run on (its
    /// handler began).
    pub fn client_left(&self) -> bool {
        self.state.left.store(true, Ordering::Release);
        self.state.notify.notify_waiters();
        self.state.running.load(Ordering::Acquire)
    }

    /// `future`'s output, or `None` once the client has been gone for `limit` first (never
    /// while the client is there).
    pub async fn unless_gone_for<F: Future>(
        &self,
        limit: Duration,
        future: F,
    ) -> Option<F::Output> {
        tokio::select! {
            biased;
            out = future => Some(out),
            () = self.gone_for(limit) => None,
        }
    }

    /// Resolves `limit` after the client left.
    async fn gone_for(&self, limit: Duration) {
        loop {
            let notified = self.state.notify.notified();
            tokio::pin!(notified);
            // Registered before the check: a departure after it wakes this waiter.
            notified.as_mut().enable();
            if self.state.left.load(Ordering::Acquire) {
                break;
            }
            notified.await;
        }
        tokio::time::sleep(limit).await;
    }
}
