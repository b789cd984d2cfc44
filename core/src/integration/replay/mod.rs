//! The framework-neutral core of idempotency replay, which the tower `IdempotencyLayer`
//! and the actix-web `ReplayMiddleware` share: the protocol written once.
//!
//! A framework implements [`ReplayAdapter`] (read the request body, call the handler,
//! convert a response, wrap a body, spawn) and hands each request to
//! [`ReplayLocker::serve`]; the [`ReplayFuture`] it gets owns the sequence: the key, the
//! bounded body read with its fingerprint, the decision (replay a stored response, refuse
//! the request, or run it under its key), the handler kept running if its client leaves
//! ([`Leftover`]), and its response captured as it streams out ([`CapturingBody`], over
//! the framework's [`ChunkSource`]), stored in the step that releases the key.

mod adapter;
mod canonical_json;
mod capture;
mod capturing_body;
mod chunks;
mod collected;
mod completion;
mod content_coding;
mod decision;
mod drain;
pub(crate) mod fingerprint;
mod future;
mod keep_running;
mod leftover;
pub(crate) mod options;
mod record_codec;
mod record_summary;
mod replay_locker;
mod replayed_trailers;
pub(crate) mod scope;
mod trailers_policy;

pub use adapter::{BodyRead, ReplayAdapter};
use capture::Capture;
pub use capturing_body::CapturingBody;
pub use chunks::{Chunk, ChunkSource};
use completion::Completion;
#[doc(hidden)]
pub use content_coding::AcceptedCodings;
pub(crate) use decision::ReplayDecision;
use drain::Drain;
pub use future::ReplayFuture;
use keep_running::KeepRunning;
pub use leftover::Leftover;
pub use record_summary::RecordSummary;
pub use replay_locker::ReplayLocker;
pub use replayed_trailers::ReplayedTrailers;
