//! [`LeaseInfo`]: what a handler may know about the lease it runs under.

use std::time::Duration;

use crate::engine::{Fence, LockKey, LostSignal};

/// What a handler may know about the lease it runs under; in the request extensions of
/// every locked request. Cheap to clone: one reference count (the lost signal, which
/// shares the lease's state, key included).
///
/// # In a dry run
///
/// A layer with `dry_run(true)` puts one in every request it would have locked, rejected
/// or made wait, so that a handler's extractor (`Locked`, `LockFence`,
/// `Extension<LeaseInfo>`) answers as it would under the enforcing layer: a dry run never
/// changes an answer. [`is_dry_run`](Self::is_dry_run) is then `true`, and the info is an
/// observation, not a lock: the key is the dry run's own (behind `%!dry-run/`), its fence
/// orders nothing another layer or storage knows (it is `0` for a request that got no
/// lease: one the layer would have answered `423`, `429`, `400`... or made wait), and a
/// request that got no lease has a lost signal that never fires. Storage that checks
/// fences must not be handed a dry run's.
#[derive(Clone)]
pub struct LeaseInfo {
    lost: LostSignal,
    fence: Fence,
    waited: Duration,
    degraded: bool,
    dry_run: bool,
}

impl std::fmt::Debug for LeaseInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseInfo")
            .field("key", self.key())
            .field("fence", &self.fence)
            .field("waited", &self.waited)
            .field("lost", &self.lost)
            .field("degraded", &self.degraded)
            .field("dry_run", &self.dry_run)
            .finish()
    }
}

impl LeaseInfo {
    pub(crate) fn new(
        fence: Fence,
        waited: Duration,
        lost: LostSignal,
        degraded: bool,
        dry_run: bool,
    ) -> Self {
        Self {
            lost,
            fence,
            waited,
            degraded,
            dry_run,
        }
    }

    /// A dry run's request that got no lease (it would have been rejected, or would have
    /// waited): `key` the dry run's key it would have locked (its mark alone when it has
    /// none), fence `0`, a lost signal that never fires.
    pub(crate) fn unheld_dry_run(key: LockKey) -> Self {
        Self::new(
            Fence::new(0),
            Duration::ZERO,
            LostSignal::never(key),
            false,
            true,
        )
    }

    /// The locked key: `<namespace>/<kind>/<value>` (see
    /// [`key`](crate::key#the-lock-key)).
    pub fn key(&self) -> &LockKey {
        self.lost.key()
    }

    /// The fencing token: pass it to storage so that it refuses writes from a holder
    /// whose lease has run out.
    pub fn fence(&self) -> Fence {
        self.fence
    }

    /// How long the request waited for the lock.
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// Resolves when the lease is lost (renewal failed or the key expired): the handler
    /// is no longer protected and should stop. The same as the engine's
    /// [`Lease::lost`](crate::engine::Lease::lost), so `lease.lost()` reads alike in a
    /// handler and beside the engine.
    ///
    /// ```no_run
    /// # async fn handler(lease: tower_lock_core::LeaseInfo) -> &'static str {
    /// tokio::select! {
    ///     () = lease.lost() => "lost the lease: stopped before writing",
    ///     () = std::future::pending::<()>() => "done", // the handler's work
    /// }
    /// # }
    /// ```
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let signal = self.lost.clone();
        async move { signal.lost().await }
    }

    /// A cloneable handle on the lost signal, for handing to other tasks.
    pub fn lost_signal(&self) -> LostSignal {
        self.lost.clone()
    }

    /// `true` once the lease is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.lost.is_lost()
    }

    /// [`is_lost`](Self::is_lost) as of `now`, an instant the caller has just read.
    pub(crate) fn is_lost_at(&self, now: tokio::time::Instant) -> bool {
        self.lost.is_lost_at(now)
    }

    /// `true` if the lock was taken on the in-process fallback engine because the backend
    /// failed (degrade policy): it excludes only requests on this node.
    pub fn is_degraded(&self) -> bool {
        self.degraded
    }

    /// `true` if the layer only observes (`dry_run(true)`): the request runs whether or not
    /// it got a lease, and this info locks nothing another layer meets (see [In a dry
    /// run](Self#in-a-dry-run)).
    pub fn is_dry_run(&self) -> bool {
        self.dry_run
    }
}
