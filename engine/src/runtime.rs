//! The engine's own runtime: one thread per process that keeps lease time (renewals,
//! validity deadlines) and finishes releases whose callers went away.
//!
//! Nothing here may depend on a runtime the user owns: a runtime that blocks (a blocking
//! handler on an actix worker) or shuts down (a worker restart, a short-lived runtime in a
//! test) would otherwise stop renewals, leave `lost()` silent past its deadline, or drop a
//! release half done, and another request would take a key whose holder still runs.
//!
//! The same runtime serves work that must outlive its caller in code built on the engine
//! (a middleware storing a response after its client left): [`detach`] it, or make it a
//! [`Detachable`] future that finishes even if it is dropped.
//!
//! ```
//! use tower_lock_engine::{LockEngine, runtime};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let engine = LockEngine::in_memory();
//! let lease = engine.lock("report").try_acquire().await.unwrap();
//! // Released even if the caller's runtime shuts down right after this line.
//! runtime::detach(async move {
//!     let _ = lease.release().await;
//! });
//! # }
//! ```

use std::{
    future::Future,
    pin::Pin,
    sync::OnceLock,
    task::{Context, Poll, Waker},
};

use tokio::runtime::{Builder, Handle, Runtime};

mod drivers;

/// The process-wide runtime of the engine: one worker thread, named `tower-lock`. Started
/// on first use; never shut down (a `static` is never dropped), so work spawned on it
/// always finishes.
pub fn handle() -> &'static Handle {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("tower-lock")
                .enable_all()
                .build()
                .expect("start the tower-lock engine thread")
        })
        .handle()
}

/// Start `op` now, on the caller's thread: if it completes on its first poll (an in-process
/// backend), that is the whole cost; otherwise it finishes on the engine's runtime. The
/// caller is not waited for and cannot cancel it, and its runtime may shut down or block
/// right after: nothing `op` does depends on it (its I/O goes out on the engine's own
/// connections, whose drivers run on the engine's runtime).
pub fn detach<F>(op: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    let mut op = Box::pin(op);
    let mut cx = Context::from_waker(Waker::noop());
    // Not the caller's runtime: a request handed to its connection would be written by a
    // driver that runtime owns, and lost if it shuts down (or delayed while it blocks)
    // before writing it.
    let _from = Origin::engine();
    let _in = handle().enter();
    if op.as_mut().poll(&mut cx).is_pending() {
        handle().spawn(op);
    }
}

/// [`detach`], but the first poll's Redis call goes out on the caller's runtime's
/// connection (when it has one), on the socket that runtime's next calls take: for a
/// release a response begins before handing over its last frame, so it reaches Redis
/// ahead of the client's next request for the key through any node (a hop to the engine's
/// thread could let that request overtake it). The rest finishes on the engine's runtime;
/// if the caller's runtime shuts down before its driver writes the call, the connection's
/// end sends the release again on the engine's own connections (a release by token may
/// run twice). A runtime serving that response and then blocking delays the release as it
/// delays the response. Not for work begun by user code that may outlive its runtime's
/// health: that is [`detach`].
#[doc(hidden)]
pub fn detach_in_order<F>(op: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    let mut op = Box::pin(op);
    let mut cx = Context::from_waker(Waker::noop());
    let _from = Origin::caller();
    let _in = handle().enter();
    if op.as_mut().poll(&mut cx).is_pending() {
        handle().spawn(op);
    }
}

/// The user runtime a [`Detachable`] was awaited from, while it is polled in place on its
/// caller's thread (the engine's runtime being the current one then): a Redis call it
/// makes goes out on that runtime's connection when it has one, with no hop to the
/// engine's thread, as the caller waits for it there. Work begun by [`detach`] (a release
/// on drop) records none: nobody waits for it, and it must not ride a connection whose
/// driver the caller's runtime owns (that runtime may shut down or block right after).
#[cfg(feature = "redis")]
pub(crate) struct Origin(Option<tokio::runtime::Id>);

#[cfg(feature = "redis")]
thread_local! {
    static ORIGIN: std::cell::Cell<Option<tokio::runtime::Id>> =
        const { std::cell::Cell::new(None) };
}

#[cfg(feature = "redis")]
impl Origin {
    /// Record the caller's runtime (if a user's) for the polls in this scope.
    pub(crate) fn caller() -> Self {
        let caller = Handle::try_current()
            .ok()
            .map(|h| h.id())
            .filter(|id| *id != handle().id());
        Self(ORIGIN.with(|o| o.replace(caller.or(o.get()))))
    }

    /// No user runtime for the polls in this scope: detached work uses the engine's own
    /// connections.
    pub(crate) fn engine() -> Self {
        Self(ORIGIN.with(|o| o.replace(None)))
    }

    /// The user runtime the operation being polled was started from, if any.
    pub(crate) fn get() -> Option<tokio::runtime::Id> {
        ORIGIN.with(std::cell::Cell::get)
    }
}

#[cfg(feature = "redis")]
impl Drop for Origin {
    fn drop(&mut self) {
        ORIGIN.with(|o| o.set(self.0));
    }
}

#[cfg(not(feature = "redis"))]
struct Origin;

#[cfg(not(feature = "redis"))]
impl Origin {
    fn caller() -> Self {
        Self
    }

    fn engine() -> Self {
        Self
    }
}

/// Run `op` with the engine's runtime as the current one at each of its polls: whatever it
/// spawns (a connection's driver task, a pool's connection makers) and whatever timer it
/// sets belongs to the engine's runtime, not the caller's. The caller still polls it, so
/// it is cancelled with the caller; only what it started outlives it.
///
/// Connections made while a user runtime is current would have their driver tasks on that
/// runtime: a call from another runtime would then hang while the first one blocks, and
/// fail with `broken pipe` once it shuts down.
#[cfg(feature = "redis")]
pub(crate) async fn on_engine<F: Future>(op: F) -> F::Output {
    let mut op = std::pin::pin!(op);
    std::future::poll_fn(|cx| {
        let _in = handle().enter();
        op.as_mut().poll(cx)
    })
    .await
}

/// `op`, polled with the engine's runtime as the current one if the caller's runtime lacks
/// a driver the engine needs (built without `enable_io` or `enable_time`): its sockets and
/// timers then belong to the engine's runtime, where tokio would otherwise panic ("IO is
/// disabled", "timers are disabled") inside the engine. A complete runtime polls `op` as it
/// is (its calls use connections of its own; see the Redis backend).
pub(crate) fn with_drivers<'a, T: 'a>(op: crate::BoxFuture<'a, T>) -> crate::BoxFuture<'a, T> {
    if drivers::current_has_all() {
        return op;
    }
    let mut op = op;
    Box::pin(std::future::poll_fn(move |cx| {
        let _in = handle().enter();
        op.as_mut().poll(cx)
    }))
}

/// A future that, once begun, finishes: polled in place while its caller waits, and handed
/// to the engine's runtime if the caller drops it before it completes.
///
/// It is polled inside the engine runtime's context, so the timers and connections it
/// creates belong to that runtime and survive the caller's.
///
/// ```
/// use tower_lock_engine::runtime::Detachable;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let (tx, rx) = tokio::sync::oneshot::channel();
/// let store = Detachable::new(async move {
///     tokio::time::sleep(std::time::Duration::from_millis(10)).await;
///     let _ = tx.send("stored");
/// });
/// drop(store); // the caller gave up: the work goes on on the engine's runtime
/// assert_eq!(rx.await.unwrap(), "stored");
/// assert_eq!(Detachable::ready(7).await, 7);
/// # }
/// ```
pub struct Detachable<T: Send + 'static> {
    op: Option<Pin<Box<dyn Future<Output = T> + Send + 'static>>>,
    /// The output of an operation already done in place (see [`Detachable::ready`]).
    done: Option<T>,
}

impl<T: Send + 'static> Detachable<T> {
    /// `op`, to be polled in place by whoever awaits it, and finished on the engine's
    /// runtime if it is dropped before it completes.
    pub fn new(op: impl Future<Output = T> + Send + 'static) -> Self {
        Self {
            op: Some(Box::pin(op)),
            done: None,
        }
    }

    /// An operation that already finished with `output` (the in-process backend's): ready
    /// at its first poll, nothing boxed.
    pub fn ready(output: T) -> Self {
        Self {
            op: None,
            done: Some(output),
        }
    }
}

impl<T: Send + 'static> std::fmt::Debug for Detachable<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Detachable")
            .field("finished", &self.op.is_none())
            .finish_non_exhaustive()
    }
}

// Nothing in it is pinned in place: the operation is boxed.
impl<T: Send + 'static> Unpin for Detachable<T> {}

impl<T: Send + 'static> Future for Detachable<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        if let Some(output) = self.done.take() {
            return Poll::Ready(output);
        }
        let op = self
            .op
            .as_mut()
            .expect("Detachable polled after completion");
        let _from = Origin::caller();
        let _in = handle().enter();
        let out = std::task::ready!(op.as_mut().poll(cx));
        self.op = None;
        Poll::Ready(out)
    }
}

impl<T: Send + 'static> Drop for Detachable<T> {
    fn drop(&mut self) {
        if let Some(op) = self.op.take() {
            handle().spawn(async move {
                op.await;
            });
        }
    }
}
