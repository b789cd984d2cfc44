//! [`ReplayAdapter`]: what a framework does for the replay protocol (read the request body,
//! call the handler, convert a response, wrap a body, spawn), so that the protocol itself
//! is written once, in [`ReplayFuture`](super::ReplayFuture).

use std::{
    borrow::Cow,
    future::Future,
    task::{Context, Poll},
};

use bytes::Bytes;
use http::{HeaderMap, StatusCode};

use super::{CapturingBody, ChunkSource, Leftover};
use crate::{key::RequestView, lease_info::LeaseInfo};

/// One step of reading a request body ([`ReplayAdapter::poll_body`]).
#[derive(Debug)]
pub enum BodyRead {
    /// Body bytes: fingerprinted, and passed on to the handler.
    Data(Bytes),
    /// Something that is not body data (trailers): neither fingerprinted nor passed on.
    Skip,
    /// The end of the body.
    End,
    /// The body failed before its end: the request is answered `400`.
    Failed,
}

/// One request of a framework, as the replay protocol drives it. A framework implements
/// it once (for a value holding its request and its inner service) and hands each request
/// to [`ReplayLocker::serve`](super::ReplayLocker::serve); the protocol (which requests are
/// covered, the bounded body read and its fingerprint, the decision, keeping the handler
/// running when its client leaves, capturing and storing the response) is the core's.
///
/// The methods on `self` are about the request, in the order the protocol may call them:
/// [`view`](Self::view), then [`poll_body`](Self::poll_body) until the body ends, then one
/// of [`pass`](Self::pass), [`call`](Self::call) or [`respond`](Self::respond). The
/// associated functions are about the handler's response and the framework's runtime.
pub trait ReplayAdapter: Sized {
    /// The handler's response.
    type Response;
    /// Its body, as the core reads it while it captures it.
    type Chunks: ChunkSource;
    /// The handler's error: passes through (and stores nothing).
    type Error;
    /// The handler's call.
    type Call: Future<Output = Result<Self::Response, Self::Error>>;
    /// What the middleware answers with.
    type Output;
    /// An answer that is not the handler's (a rejection or a replay) on its way.
    type Respond: Future<Output = Self::Output>;

    /// Show the request to `look` (key extraction, fingerprint, rejection responses).
    fn view<R>(&self, look: impl FnOnce(&dyn RequestView) -> R) -> R;

    /// The least number of bytes the request body is known to have (its declared length),
    /// so that a body over the limit is refused before it is read. Default: 0.
    fn body_size_hint(&self) -> u64 {
        0
    }

    /// The next step of reading the request body.
    fn poll_body(&mut self, cx: &mut Context<'_>) -> Poll<BodyRead>;

    /// Call the handler with the request as it came, its body unread: the request is not
    /// covered (a method the layer does not lock, or no key under the pass-through policy).
    fn pass(self) -> Self::Call;

    /// Call the handler with the body read (`body`, whole), and `lease` in the request
    /// extensions when the request runs under its key.
    fn call(self, body: Bytes, lease: Option<LeaseInfo>) -> Self::Call;

    /// Answer with `response` (a rejection or a stored response) instead of the handler.
    fn respond(self, response: http::Response<Bytes>) -> Self::Respond;

    /// Whether `response` carries the [`NotStored`](crate::NotStored) mark.
    fn is_marked_not_stored(response: &Self::Response) -> bool;

    /// The status of `response`.
    fn status(response: &Self::Response) -> StatusCode;

    /// The headers of `response`, as `http` 1 headers.
    fn headers(response: &Self::Response) -> Cow<'_, HeaderMap>;

    /// Whether `response` has no body to send (the server will never poll it): its record
    /// is then stored before it is handed over.
    fn has_no_body(response: &Self::Response) -> bool;

    /// The body of `response`, to be read into its record after its client left.
    fn into_chunks(response: Self::Response) -> Self::Chunks;

    /// `response` as the middleware's answer, its body untouched.
    fn plain(response: Self::Response) -> Self::Output;

    /// `response` as the middleware's answer, its body captured for replay: `capture`
    /// turns the body's chunks into the [`CapturingBody`] the framework's body type wraps.
    fn capturing(
        response: Self::Response,
        capture: impl FnOnce(Self::Chunks) -> CapturingBody<Self::Chunks>,
    ) -> Self::Output;

    /// Run `work` to its end on the framework's runtime: the handler's work, left behind
    /// by a client that went away, belongs there.
    fn spawn(work: Leftover<Self>);
}
