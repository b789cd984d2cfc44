//! [`ReplayFuture`]: the replay protocol for one request, written once for every framework:
//! the key, the bounded body read with its fingerprint, the decision, the handler kept
//! running, the response captured (or, with no body to send, stored at once).

use std::{
    fmt,
    future::Future,
    pin::Pin,
    task::{Context, Poll, ready},
};

use bytes::Bytes;
use pin_project_lite::pin_project;

use super::{
    BodyRead, CapturingBody, KeepRunning, Leftover, ReplayAdapter, ReplayDecision, ReplayLocker,
    collected::Collected, content_coding::AcceptedCodings, fingerprint::Fingerprinter,
};
use crate::{engine::BoxFuture, engine::LockKey, reject::Rejection};

pin_project! {
    /// One request under idempotency replay, from [`ReplayLocker::serve`]: resolves to the
    /// middleware's answer, or the handler's error.
    ///
    /// Dropping it (the client went away) gives up a read or a wait; a handler that is
    /// already running under its key runs on ([`Leftover`]), so that its response is stored.
    #[must_use = "futures do nothing unless polled"]
    pub struct ReplayFuture<A: ReplayAdapter> {
        #[pin]
        state: State<A>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<A: ReplayAdapter> {
        // Not covered: the handler runs with the request as it came.
        Pass { #[pin] call: A::Call },
        // An answer that is not the handler's: a rejection or a replay.
        Respond { #[pin] respond: A::Respond },
        // The body is read and fingerprinted before the lock: the key is not held while a
        // slow client uploads.
        Reading { reading: Option<Reading<A>> },
        Deciding {
            adapter: Option<A>,
            replay: ReplayLocker,
            body: Bytes,
            decide: BoxFuture<'static, ReplayDecision>,
        },
        // The lock passed the request through: it runs unlocked and stores nothing.
        Unlocked { #[pin] call: A::Call },
        Running { running: KeepRunning<A> },
        // No body to send: the server may never poll it, so the record is stored first.
        Storing {
            store: BoxFuture<'static, ()>,
            response: Option<A::Response>,
        },
        Done,
    }
}

/// The request while its body is read.
struct Reading<A> {
    adapter: A,
    replay: ReplayLocker,
    key: LockKey,
    fingerprint: Fingerprinter,
    data: Collected,
    /// The declared length (within the limit), reserved at once: no regrowing copies.
    expected: usize,
}

impl<A: ReplayAdapter> ReplayFuture<A> {
    pub(super) fn new(replay: &ReplayLocker, adapter: A) -> Self {
        let state = match adapter.view(|req| replay.key(req)) {
            Ok(None) => State::Pass {
                call: adapter.pass(),
            },
            Err(rejection) => respond(replay, adapter, rejection),
            Ok(Some(key)) => {
                let declared = adapter.body_size_hint();
                if declared > replay.max_request_body() as u64 {
                    let rejection = replay.too_large();
                    if replay.locker().is_dry_run() {
                        replay.locker().would_have(&rejection);
                        State::Pass {
                            call: adapter.pass(),
                        }
                    } else {
                        respond(replay, adapter, rejection)
                    }
                } else {
                    let fingerprint = adapter.view(|req| replay.fingerprinter(req));
                    State::Reading {
                        reading: Some(Reading {
                            adapter,
                            replay: replay.clone(),
                            key,
                            fingerprint,
                            data: Collected::default(),
                            expected: usize::try_from(declared).unwrap_or(0),
                        }),
                    }
                }
            }
        };
        Self { state }
    }
}

/// Answer `rejection` instead of calling the handler.
fn respond<A: ReplayAdapter>(replay: &ReplayLocker, adapter: A, rejection: Rejection) -> State<A> {
    let response = adapter.view(|req| replay.respond(rejection, req));
    State::Respond {
        respond: adapter.respond(response),
    }
}

impl<A: ReplayAdapter> fmt::Debug for ReplayFuture<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Pass { .. } => "pass",
            State::Respond { .. } => "respond",
            State::Reading { .. } => "reading",
            State::Deciding { .. } => "deciding",
            State::Unlocked { .. } => "unlocked",
            State::Running { .. } => "running",
            State::Storing { .. } => "storing",
            State::Done => "done",
        };
        f.debug_struct("ReplayFuture")
            .field("state", &state)
            .finish()
    }
}

impl<A: ReplayAdapter> Future for ReplayFuture<A> {
    type Output = Result<A::Output, A::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            let next = match state.as_mut().project() {
                StateProj::Pass { call } | StateProj::Unlocked { call } => {
                    let response = ready!(call.poll(cx));
                    state.set(State::Done);
                    return Poll::Ready(response.map(A::plain));
                }
                StateProj::Respond { respond } => {
                    let output = ready!(respond.poll(cx));
                    state.set(State::Done);
                    return Poll::Ready(Ok(output));
                }
                StateProj::Reading { reading } => {
                    let read = reading.as_mut().expect("polled after completion");
                    let result = ready!(read.poll_read(cx));
                    let read = reading.take().expect("polled after completion");
                    match result {
                        Ok(()) => read.decide(),
                        Err(rejection) => respond(&read.replay, read.adapter, rejection),
                    }
                }
                StateProj::Deciding {
                    adapter,
                    replay,
                    body,
                    decide,
                } => {
                    let decision = ready!(decide.as_mut().poll(cx));
                    let adapter = adapter.take().expect("polled after completion");
                    decided(replay, adapter, std::mem::take(body), decision)
                }
                StateProj::Running { running } => {
                    let (response, completion) = match ready!(Pin::new(running).poll(cx)) {
                        Ok(ran) => ran,
                        Err(error) => {
                            state.set(State::Done);
                            return Poll::Ready(Err(error));
                        }
                    };
                    let capture = completion.capture_response::<A>(&response);
                    if A::has_no_body(&response) {
                        State::Storing {
                            store: Box::pin(capture.finish()),
                            response: Some(response),
                        }
                    } else {
                        state.set(State::Done);
                        let output = A::capturing(response, |chunks| {
                            CapturingBody::new(chunks, capture, Leftover::<A>::spawn_drain)
                        });
                        return Poll::Ready(Ok(output));
                    }
                }
                StateProj::Storing { store, response } => {
                    ready!(store.as_mut().poll(cx));
                    let response = response.take().expect("polled after completion");
                    state.set(State::Done);
                    return Poll::Ready(Ok(A::plain(response)));
                }
                StateProj::Done => panic!("ReplayFuture polled after completion"),
            };
            state.set(next);
        }
    }
}

impl<A: ReplayAdapter> Reading<A> {
    /// Read the body to its end, fingerprinting it on the way; refused (`413`, or `400`
    /// for a body that failed) as soon as it is known to be.
    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Rejection>> {
        let limit = self.replay.max_request_body();
        loop {
            match ready!(self.adapter.poll_body(cx)) {
                BodyRead::Data(chunk) => {
                    if self.data.len() + chunk.len() > limit {
                        return Poll::Ready(Err(self.replay.too_large()));
                    }
                    self.fingerprint.update(&chunk);
                    self.data.push(chunk, self.expected);
                }
                // Request trailers are not part of the fingerprint (nor passed on).
                BodyRead::Skip => {}
                BodyRead::End => return Poll::Ready(Ok(())),
                BodyRead::Failed => return Poll::Ready(Err(self.replay.unreadable())),
            }
        }
    }

    /// The body is read: ask for the decision, with the request's fingerprint.
    fn decide(self) -> State<A> {
        let body = self.data.into_bytes();
        let fingerprint = self.fingerprint;
        let (fingerprint, accepted) = self
            .adapter
            .view(|req| (fingerprint.finish(req, &body), AcceptedCodings::of(req)));
        State::Deciding {
            decide: Box::pin(self.replay.begin(self.key, fingerprint, accepted)),
            adapter: Some(self.adapter),
            replay: self.replay,
            body,
        }
    }
}

/// What the decision calls for.
fn decided<A: ReplayAdapter>(
    replay: &ReplayLocker,
    adapter: A,
    body: Bytes,
    decision: ReplayDecision,
) -> State<A> {
    match decision {
        ReplayDecision::Replay(response) => State::Respond {
            respond: adapter.respond(response),
        },
        ReplayDecision::Rejected(rejection) => respond(replay, adapter, rejection),
        ReplayDecision::Unlocked(lease) => State::Unlocked {
            call: adapter.call(body, lease),
        },
        ReplayDecision::Run(completion) => {
            let lease = completion.info().clone();
            State::Running {
                running: KeepRunning::new(adapter.call(body, Some(lease)), completion),
            }
        }
    }
}
