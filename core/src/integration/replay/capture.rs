//! [`Capture`]: a response being captured for replay, up to the atomic step that stores it
//! and releases its key.

use std::{fmt, future::Future, pin::Pin, time::Duration};

use bytes::{Bytes, BytesMut};
use http::StatusCode;

use super::{Chunk, Completion, record_codec};
use crate::engine::{LockError, Record, runtime::Detachable};

/// A response being captured for replay: feed it the body's data with
/// [`data`](Self::data), then [`finish`](Self::finish) at the end of the body. Dropping it
/// unfinished (the body panicked) releases the key and stores nothing.
#[must_use = "dropping it unfinished releases the key and stores nothing"]
pub(crate) struct Capture {
    completion: Completion,
    state: State,
}

/// What a [`Capture`] keeps of the response.
pub(super) enum State {
    /// Nothing to keep: release at the end.
    Release,
    Keep {
        status: StatusCode,
        meta: Bytes,
        body: BytesMut,
        /// A gRPC response whose status comes in its trailers: they decide whether it is
        /// stored, and without them (a body that ended without a status) it is not.
        by_trailers: bool,
    },
    /// Completed, but over a limit: keep only that it completed, and its status.
    NotKept { status: StatusCode },
    /// A gRPC response whose status comes in its trailers, over the body limit: nothing of
    /// it is kept, but its trailers still decide between "completed, not stored" (a lasting
    /// status) and no record at all (a "try again", as for a `503`). Without them (the body
    /// failed, or was cut off) it has no status, and nothing is recorded.
    AwaitTrailers { status: StatusCode },
}

impl fmt::Debug for Capture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Release => "release",
            State::Keep { .. } => "keep",
            State::NotKept { .. } => "not kept",
            State::AwaitTrailers { .. } => "await trailers",
        };
        f.debug_struct("Capture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

impl Capture {
    pub(super) fn new(completion: Completion, state: State) -> Self {
        Self { completion, state }
    }

    /// Feed one chunk of the response body, as a [`ChunkSource`](super::ChunkSource) yields it.
    pub(super) fn feed(&mut self, chunk: Chunk<'_>) {
        match chunk {
            Chunk::Data(data) => self.data(data),
            Chunk::Trailers(trailers) => self.trailers(trailers),
            Chunk::Other => {}
        }
    }

    /// Whether more body is still worth reading for the record (`false` once nothing is
    /// kept, or the body passed the limit), or for the trailers that decide it (a gRPC
    /// response's status: read up to them whatever the body's size).
    pub(crate) fn wants_data(&self) -> bool {
        matches!(self.state, State::Keep { .. } | State::AwaitTrailers { .. })
    }

    /// A chunk of the response body.
    pub(crate) fn data(&mut self, chunk: &[u8]) {
        if let State::Keep {
            status,
            body,
            by_trailers,
            ..
        } = &mut self.state
        {
            if body.len() + chunk.len() > self.completion.replay.options.max_response_body {
                // Over the limit, but a gRPC status still to come decides whether the
                // request even completed: a "try again" in the trailers must release the
                // key with no record, however long the stream was.
                self.state = if *by_trailers {
                    State::AwaitTrailers { status: *status }
                } else {
                    State::NotKept { status: *status }
                };
            } else {
                body.extend_from_slice(chunk);
            }
        }
    }

    /// The response's trailers, which end its body: kept with it, so that its replay ends
    /// with them too. A gRPC response's trailers carry its status, which decides whether
    /// it is stored at all (a "try again" is not: the key is released, the retry runs).
    pub(crate) fn trailers(&mut self, trailers: &http::HeaderMap) {
        if let State::AwaitTrailers { status } = self.state {
            let code = crate::grpc::status(trailers).unwrap_or(2);
            self.state = if self
                .completion
                .replay
                .options
                .stores_grpc(code, status, trailers)
            {
                State::NotKept { status }
            } else {
                State::Release
            };
            return;
        }
        let State::Keep {
            status,
            meta,
            by_trailers,
            ..
        } = &mut self.state
        else {
            return;
        };
        let status = *status;
        let options = &self.completion.replay.options;
        if *by_trailers {
            let code = crate::grpc::status(trailers).unwrap_or(2);
            if !options.stores_grpc(code, status, trailers) {
                self.state = State::Release;
                return;
            }
            *by_trailers = false;
        }
        match record_codec::with_trailers(meta, trailers, options.max_response_headers) {
            Some(with) => *meta = with,
            None => self.state = State::NotKept { status },
        }
    }

    /// The rest of the body will not be read (its client left and the
    /// [drain time](super::ReplayLocker::max_drain_time) ran out, or it failed): what was to
    /// be kept is recorded as completed but not stored, so a retry is answered `409`
    /// `response-not-stored` rather than run a second time.
    ///
    /// Except a gRPC response whose status was still to come in its trailers: it has no
    /// status at all (its HTTP `200` is every gRPC response's, failures included), so the
    /// layer cannot tell a success from a "try again", and its client did not see one
    /// either (a gRPC client reports a stream without its status as a failure, not as a
    /// success). Nothing is recorded and the key is released, so the retry runs: the
    /// answer for an outcome nobody saw is another run, not `409` for the whole retention
    /// (a stream cut off is typically `CANCELLED` or `UNAVAILABLE`, which are retried).
    pub(crate) fn cut_off(&mut self) {
        match self.state {
            State::Keep {
                by_trailers: true, ..
            }
            | State::AwaitTrailers { .. } => self.state = State::Release,
            State::Keep { status, .. } => self.state = State::NotKept { status },
            State::Release | State::NotKept { .. } => {}
        }
    }

    /// How long the rest of the body is read once its client left.
    pub(crate) fn max_drain_time(&self) -> Duration {
        self.completion.replay.options.max_drain_time
    }

    /// The body is complete: store the record and release the key, in one atomic step.
    /// Begins in this call; finishes even if the returned future is dropped. A backend
    /// that refuses it for a moment is asked again while the lease lasts (see
    /// [`Lease::complete`](crate::engine::Lease::complete)). A holder whose lease ran out
    /// before this, or while the backend refused it, writes nothing (logged, and counted
    /// as `discarded` in the metrics).
    pub(crate) fn finish(self) -> impl Future<Output = ()> + Send + 'static {
        let Self { completion, state } = self;
        let Completion {
            guard,
            fingerprint,
            replay,
            ..
        } = completion;
        let record = match state {
            // Nothing to keep, or a gRPC response that ended without its status: nothing
            // to replay.
            State::Release
            | State::AwaitTrailers { .. }
            | State::Keep {
                by_trailers: true, ..
            } => None,
            State::Keep { meta, body, .. } => Some(Record::new(fingerprint, meta, body.freeze())),
            State::NotKept { status } => Some(Record::new(
                fingerprint,
                record_codec::encode_not_kept(status),
                Bytes::new(),
            )),
        };
        let op: Pin<Box<dyn Future<Output = ()> + Send>> = match record {
            None => Box::pin(guard.release()),
            Some(record) => {
                let key = guard.info().key().clone();
                let metrics = replay.locker.metrics();
                let complete = guard.complete(record, replay.options.retention);
                Box::pin(async move {
                    // Each message says what became of the key: a retry's fate follows.
                    match complete.await {
                        Ok(()) => {}
                        Err(LockError::NotOwned | LockError::Expired) => {
                            metrics.discarded();
                            tracing::warn!(%key, "the lease ran out before the response was stored: not stored; the key is no longer this request's, and a retry runs the request again");
                        }
                        Err(LockError::Backend(error)) if error.is_refusal() => {
                            metrics.discarded();
                            tracing::warn!(%key, %error, "the backend refused to store the response until the lease ran out: not stored; the key was not released, its TTL frees it, and a retry then runs the request again");
                        }
                        Err(error) => {
                            metrics.discarded();
                            tracing::warn!(%key, %error, "storing the response failed: not stored; the key is given back by token if the backend takes that, else its TTL frees it, and a retry then runs the request again");
                        }
                    }
                })
            }
        };
        let mut finish = Detachable::new(op);
        // Begin now: an in-process store completes on this first poll.
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let done = Pin::new(&mut finish).poll(&mut cx).is_ready();
        async move {
            if !done {
                finish.await;
            }
        }
    }
}
