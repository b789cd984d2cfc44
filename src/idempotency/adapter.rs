//! [`TowerAdapter`]: a tower request and its inner service, as the replay protocol of the
//! core drives them ([`ReplayAdapter`]).

use std::{
    borrow::Cow,
    fmt,
    future::{Ready, ready},
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode, request::Parts};
use http_body::Body;
use tower_lock_core::{
    BodyRead, CapturingBody, LeaseInfo, Leftover, ReplayAdapter, ReplayedTrailers, key::RequestView,
};
use tower_service::Service;

use super::{
    http_chunks::{HttpChunks, spawn},
    replay_body::ReplayBody,
    request_body::RequestBody,
};
use crate::NotStored;

/// One request to an [`IdempotencyService`](super::IdempotencyService) and the inner
/// service to call with it, shown to the core's replay protocol. Not nameable outside this
/// crate: it appears only in the bound of the service's [`ResponseFuture`](super::ResponseFuture).
pub struct TowerAdapter<S, ReqB> {
    /// The inner service, made ready before the request was called.
    service: S,
    parts: Parts,
    /// The body as it came, until it is read (or passed on unread).
    body: Option<ReqB>,
    /// The body being read (pinned in place on the heap once reading starts).
    reading: Option<Pin<Box<ReqB>>>,
}

impl<S, ReqB> TowerAdapter<S, ReqB> {
    pub(super) fn new(service: S, req: Request<ReqB>) -> Self {
        let (parts, body) = req.into_parts();
        Self {
            service,
            parts,
            body: Some(body),
            reading: None,
        }
    }
}

impl<S, ReqB> fmt::Debug for TowerAdapter<S, ReqB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TowerAdapter")
            .field("method", &self.parts.method)
            .field("uri", &self.parts.uri)
            .finish_non_exhaustive()
    }
}

impl<S, ReqB, ResB> ReplayAdapter for TowerAdapter<S, ReqB>
where
    S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Body<Data = Bytes> + Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
{
    type Response = Response<ResB>;
    type Chunks = HttpChunks<ResB>;
    type Error = S::Error;
    type Call = S::Future;
    type Output = Response<ReplayBody<ResB>>;
    type Respond = Ready<Self::Output>;

    fn view<R>(&self, look: impl FnOnce(&dyn RequestView) -> R) -> R {
        look(&self.parts)
    }

    fn body_size_hint(&self) -> u64 {
        self.body
            .as_ref()
            .map_or(0, |body| body.size_hint().lower())
    }

    fn poll_body(&mut self, cx: &mut Context<'_>) -> Poll<BodyRead> {
        if self.reading.is_none() {
            self.reading = self.body.take().map(Box::pin);
        }
        let Some(body) = self.reading.as_mut() else {
            return Poll::Ready(BodyRead::End);
        };
        Poll::Ready(match std::task::ready!(body.as_mut().poll_frame(cx)) {
            None => BodyRead::End,
            Some(Err(_)) => BodyRead::Failed,
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => BodyRead::Data(data),
                Err(_) => BodyRead::Skip,
            },
        })
    }

    fn pass(mut self) -> S::Future {
        let body = self.body.take().expect("the body is passed on unread");
        let req = Request::from_parts(self.parts, RequestBody::streaming(body));
        self.service.call(req)
    }

    fn call(mut self, body: Bytes, lease: Option<LeaseInfo>) -> S::Future {
        let mut req = Request::from_parts(self.parts, RequestBody::buffered(body));
        if let Some(lease) = lease {
            req.extensions_mut().insert(lease);
        }
        self.service.call(req)
    }

    fn respond(self, mut response: Response<Bytes>) -> Self::Respond {
        // A stored response's trailers (a gRPC status) follow its body.
        let trailers = response
            .extensions_mut()
            .remove::<ReplayedTrailers>()
            .map(|t| t.0);
        ready(response.map(|data| ReplayBody::replayed(data, trailers)))
    }

    fn is_marked_not_stored(response: &Response<ResB>) -> bool {
        response.extensions().get::<NotStored>().is_some()
    }

    fn status(response: &Response<ResB>) -> StatusCode {
        response.status()
    }

    fn headers(response: &Response<ResB>) -> Cow<'_, HeaderMap> {
        Cow::Borrowed(response.headers())
    }

    fn has_no_body(response: &Response<ResB>) -> bool {
        response.body().is_end_stream()
    }

    fn into_chunks(response: Response<ResB>) -> HttpChunks<ResB> {
        HttpChunks::new(response.into_body())
    }

    fn plain(response: Response<ResB>) -> Self::Output {
        response.map(ReplayBody::plain)
    }

    fn capturing(
        response: Response<ResB>,
        capture: impl FnOnce(HttpChunks<ResB>) -> CapturingBody<HttpChunks<ResB>>,
    ) -> Self::Output {
        response.map(|body| ReplayBody::capturing(capture(HttpChunks::new(body))))
    }

    fn spawn(work: Leftover<Self>) {
        spawn(work);
    }
}
