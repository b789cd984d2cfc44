//! [`Leftover`]: the work a request leaves behind when its client goes away, for the
//! framework's spawner.

use std::{
    fmt,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use super::{Drain, ReplayAdapter, keep_running::Abandoned};

/// The work a request under its idempotency key leaves behind when its client goes away:
/// a handler that runs to completion, or a response body read to its end, before the
/// response is stored and the key released. A framework runs it to its end on its own
/// runtime ([`ReplayAdapter::spawn`]); it does nothing unless polled.
#[must_use = "a leftover does nothing unless it is spawned: the key is released only at its end"]
pub struct Leftover<A: ReplayAdapter> {
    work: Work<A>,
}

enum Work<A: ReplayAdapter> {
    // Each boxed: the two differ in size by hundreds of bytes, and both are rare paths
    // (a client that left).
    /// The handler is still running.
    Abandoned(Box<Abandoned<A>>),
    /// The response body is being read.
    Drain(Box<Drain<A::Chunks>>),
}

impl<A: ReplayAdapter> Leftover<A> {
    pub(super) fn abandoned(abandoned: Abandoned<A>) -> Self {
        Self {
            work: Work::Abandoned(Box::new(abandoned)),
        }
    }

    /// The spawner of a [`CapturingBody`](super::CapturingBody)'s drain, as a function
    /// pointer (the body's type names no adapter).
    pub(super) fn spawn_drain(drain: Drain<A::Chunks>) {
        A::spawn(Self {
            work: Work::Drain(Box::new(drain)),
        });
    }
}

impl<A: ReplayAdapter> fmt::Debug for Leftover<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.work {
            Work::Abandoned(abandoned) => f.debug_tuple("Leftover").field(abandoned).finish(),
            Work::Drain(drain) => f.debug_tuple("Leftover").field(drain).finish(),
        }
    }
}

impl<A: ReplayAdapter> Future for Leftover<A> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match &mut self.work {
            Work::Abandoned(abandoned) => Pin::new(&mut **abandoned).poll(cx),
            Work::Drain(drain) => Pin::new(&mut **drain).poll(cx),
        }
    }
}
