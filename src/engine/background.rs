//! The engine's own runtime: one thread per process that keeps lease time (renewals,
//! validity deadlines) and finishes releases whose callers went away.
//!
//! Nothing here may depend on a runtime the user owns: a runtime that blocks (a blocking
//! handler on an actix worker) or shuts down (a worker restart, a short-lived runtime in a
//! test) would otherwise stop renewals, leave `lost()` silent past its deadline, or drop a
//! release half done, and another request would take a key whose holder still runs.

use std::{
    future::Future,
    pin::Pin,
    sync::OnceLock,
    task::{Context, Poll, Waker},
};

use tokio::runtime::{Builder, Handle, Runtime};

/// The process-wide runtime of the engine. Started on first use; never shut down (a
/// `static` is never dropped), so work handed to it always finishes.
pub(crate) fn handle() -> &'static Handle {
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
/// caller is not waited for and cannot cancel it.
pub(crate) fn detach<F>(op: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    let mut op = Box::pin(op);
    let mut cx = Context::from_waker(Waker::noop());
    let _in = handle().enter();
    if op.as_mut().poll(&mut cx).is_pending() {
        handle().spawn(op);
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

/// A future that, once begun, finishes: polled in place while its caller waits, and handed
/// to the engine's runtime if the caller drops it before it completes.
///
/// It is polled inside the engine runtime's context, so the timers and connections it
/// creates belong to that runtime and survive the caller's.
pub(crate) struct Finish<T: Send + 'static> {
    op: Option<Pin<Box<dyn Future<Output = T> + Send + 'static>>>,
    /// The output of an operation already done in place (see [`Finish::done`]).
    done: Option<T>,
}

impl<T: Send + 'static> Finish<T> {
    pub(crate) fn new(op: impl Future<Output = T> + Send + 'static) -> Self {
        Finish {
            op: Some(Box::pin(op)),
            done: None,
        }
    }

    /// An operation that already finished with `output` (the in-process backend's): ready
    /// at its first poll, nothing boxed.
    pub(crate) fn done(output: T) -> Self {
        Finish {
            op: None,
            done: Some(output),
        }
    }
}

// Nothing in it is pinned in place: the operation is boxed.
impl<T: Send + 'static> Unpin for Finish<T> {}

impl<T: Send + 'static> Future for Finish<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        if let Some(output) = self.done.take() {
            return Poll::Ready(output);
        }
        let op = self.op.as_mut().expect("Finish polled after completion");
        let _in = handle().enter();
        let out = std::task::ready!(op.as_mut().poll(cx));
        self.op = None;
        Poll::Ready(out)
    }
}

impl<T: Send + 'static> Drop for Finish<T> {
    fn drop(&mut self) {
        if let Some(op) = self.op.take() {
            handle().spawn(async move {
                op.await;
            });
        }
    }
}
