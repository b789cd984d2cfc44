//! The framework-neutral core of idempotency replay, which the tower
//! `IdempotencyLayer` and the actix-web `ReplayMiddleware` share.
//!
//! A [`ReplayLocker`] decides for each request ([`ReplayDecision`]): replay a stored
//! response, refuse the request, or run it under its key with a [`Completion`]. The
//! lifecycle after that is written here once: the handler runs on if its client leaves
//! ([`KeepRunning`], [`Abandoned`]), its response is captured as it streams out
//! ([`Capture`], [`CapturingBody`]), and a body no client reads any more is drained into
//! the record ([`Drain`]). A framework shows the core its response through
//! [`ReplayResponse`] and [`ChunkSource`], and keeps only its body adapter, its spawner and
//! its header conversion.

mod canonical_json;
mod capture;
mod capturing_body;
mod chunks;
mod completion;
mod decision;
mod drain;
pub(crate) mod fingerprint;
mod keep_running;
mod locker;
pub(crate) mod options;
mod record_codec;
pub(crate) mod scope;

pub use capture::Capture;
pub use capturing_body::CapturingBody;
pub use chunks::{Chunk, ChunkSource, ReplayResponse};
pub use completion::Completion;
pub use decision::ReplayDecision;
pub use drain::Drain;
pub use keep_running::{Abandoned, KeepRunning};
pub use locker::ReplayLocker;
