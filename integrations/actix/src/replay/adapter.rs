//! [`ActixAdapter`]: an actix request and the service behind the middleware, as the replay
//! protocol of the core drives them ([`ReplayAdapter`]).

use std::{
    borrow::Cow,
    fmt,
    pin::Pin,
    rc::Rc,
    task::{Context, Poll, ready},
};

use actix_web::{
    Error, HttpMessage,
    body::{BodySize, EitherBody, MessageBody},
    dev::{Payload, Service, ServiceRequest, ServiceResponse},
};
use bytes::Bytes;
use futures_core::Stream;
use tower_lock::NotStored;
use tower_lock_core::{
    BodyRead, CapturingBody, LeaseInfo, Leftover, ReplayAdapter, key::RequestView,
};

use super::body::{ActixChunks, ReplayBody};
use crate::{
    ActixRequest,
    http_conversion::{http_headers, to_actix_response},
    middleware::LocalBoxFuture,
    unread_body::discard_small_body,
};

/// One request to a [`ReplayMiddlewareService`](super::ReplayMiddlewareService) and the
/// service to call with it, shown to the core's replay protocol. Not nameable outside this
/// crate: it appears only in the middleware's future type.
pub struct ActixAdapter<S, B> {
    service: Rc<S>,
    req: ServiceRequest,
    /// The request body, once reading it has begun.
    payload: Option<Payload>,
    _body: std::marker::PhantomData<fn() -> B>,
}

impl<S, B> ActixAdapter<S, B> {
    pub(super) fn new(service: Rc<S>, req: ServiceRequest) -> Self {
        Self {
            service,
            req,
            payload: None,
            _body: std::marker::PhantomData,
        }
    }
}

impl<S, B> fmt::Debug for ActixAdapter<S, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ActixAdapter")
            .field("method", self.req.method())
            .field("path", &self.req.path())
            .finish_non_exhaustive()
    }
}

impl<S, B> ReplayAdapter for ActixAdapter<S, B>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<B>;
    type Chunks = ActixChunks<B>;
    type Error = Error;
    type Call = S::Future;
    type Output = ServiceResponse<EitherBody<ReplayBody<B>>>;
    type Respond = LocalBoxFuture<Self::Output>;

    fn view<R>(&self, look: impl FnOnce(&dyn RequestView) -> R) -> R {
        look(&ActixRequest::from(&self.req))
    }

    fn poll_body(&mut self, cx: &mut Context<'_>) -> Poll<BodyRead> {
        let payload = self.payload.get_or_insert_with(|| self.req.take_payload());
        Poll::Ready(match ready!(Pin::new(payload).poll_next(cx)) {
            Some(Ok(data)) => BodyRead::Data(data),
            Some(Err(_)) => BodyRead::Failed,
            None => BodyRead::End,
        })
    }

    fn pass(self) -> S::Future {
        self.service.call(self.req)
    }

    fn call(mut self, body: Bytes, lease: Option<LeaseInfo>) -> S::Future {
        self.req.set_payload(Payload::from(body));
        if let Some(lease) = lease {
            self.req.extensions_mut().insert(lease);
        }
        self.service.call(self.req)
    }

    fn respond(mut self, response: http::Response<Bytes>) -> Self::Respond {
        Box::pin(async move {
            if self.payload.is_none() {
                // Refused before its body was read: actix closes a connection whose
                // request body was left unread, so read a small one (see the crate docs).
                discard_small_body(&mut self.req).await;
            }
            self.req
                .into_response(to_actix_response(response))
                .map_into_right_body()
        })
    }

    fn is_marked_not_stored(response: &ServiceResponse<B>) -> bool {
        response
            .response()
            .extensions()
            .get::<NotStored>()
            .is_some()
    }

    fn status(response: &ServiceResponse<B>) -> http::StatusCode {
        http::StatusCode::from_u16(response.status().as_u16())
            .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR)
    }

    fn headers(response: &ServiceResponse<B>) -> Cow<'_, http::HeaderMap> {
        Cow::Owned(http_headers(response.headers()))
    }

    fn has_no_body(response: &ServiceResponse<B>) -> bool {
        // actix never polls a body it must not send.
        matches!(
            response.response().body().size(),
            BodySize::None | BodySize::Sized(0)
        )
    }

    fn into_chunks(response: ServiceResponse<B>) -> ActixChunks<B> {
        ActixChunks::new(response.into_body())
    }

    fn plain(response: ServiceResponse<B>) -> Self::Output {
        response.map_body(|_, body| EitherBody::left(ReplayBody::plain(body)))
    }

    fn capturing(
        response: ServiceResponse<B>,
        capture: impl FnOnce(ActixChunks<B>) -> CapturingBody<ActixChunks<B>>,
    ) -> Self::Output {
        response.map_body(|_, body| {
            EitherBody::left(ReplayBody::capturing(capture(ActixChunks::new(body))))
        })
    }

    /// The handler's work stays on the worker that ran it (actix futures are not `Send`).
    fn spawn(work: Leftover<Self>) {
        drop(actix_web::rt::spawn(work));
    }
}
