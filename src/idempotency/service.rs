//! [`IdempotencyService`], the service an [`IdempotencyLayer`](super::IdempotencyLayer)
//! wraps around another: it reads and fingerprints the request body, asks the
//! [`ReplayLocker`] what to do, and runs the inner service under the replay core's
//! lifecycle ([`KeepRunning`], [`CapturingBody`](tower_lock_core::CapturingBody)).

use std::{
    pin::pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::BodyExt;
use tower_service::Service;

use super::{
    collected::Collected,
    future::{IdempotencyFuture, Output},
    http_chunks::{Handled, spawn},
    replay_body::ReplayBody,
    request_body::RequestBody,
};
use tower_lock_core::{KeepRunning, ReplayDecision, ReplayLocker};

use crate::engine::LockKey;

/// Runs the inner service at most once per idempotency key, and replays its stored
/// response to retries; see [`IdempotencyLayer`](super::IdempotencyLayer).
///
/// The inner service receives a [`RequestBody`]: the body the layer read to fingerprint
/// the request (or, for a method the layer does not cover, the original one). Axum's
/// routers and handlers accept it as they accept any body.
#[derive(Clone, Debug)]
pub struct IdempotencyService<S> {
    inner: S,
    replay: ReplayLocker,
}

impl<S> IdempotencyService<S> {
    pub(crate) fn new(inner: S, replay: ReplayLocker) -> Self {
        Self { inner, replay }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The framework-neutral core this service works with.
    pub fn replay_locker(&self) -> &ReplayLocker {
        &self.replay
    }
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for IdempotencyService<S>
where
    S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Body<Data = Bytes> + Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
{
    type Response = Response<ReplayBody<ResB>>;
    type Error = S::Error;
    type Future = IdempotencyFuture<S::Future, ResB, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        match self.replay.key(&req) {
            Ok(None) => IdempotencyFuture::pass(self.inner.call(req.map(RequestBody::streaming))),
            Err(rejection) => {
                let res = self.replay.respond(rejection, &req);
                IdempotencyFuture::ready(res.map(ReplayBody::full))
            }
            Ok(Some(key)) => {
                // The ready service is the one to call once the body is read and the key
                // is ours; leave a fresh clone behind.
                let clone = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, clone);
                IdempotencyFuture::boxed(Box::pin(run(ready, self.replay.clone(), key, req)))
            }
        }
    }
}

async fn run<S, ReqB, ResB>(
    mut service: S,
    replay: ReplayLocker,
    key: LockKey,
    req: Request<ReqB>,
) -> Output<ResB, S::Error>
where
    S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Body<Data = Bytes>,
    ResB: Body<Data = Bytes> + Send + 'static,
{
    let (parts, body) = req.into_parts();
    // The whole body, fingerprinted as it streams in, before the lock: the key is not
    // held while a slow client uploads.
    let limit = replay.max_request_body();
    let reject = |rejection| Ok(replay.respond(rejection, &parts).map(ReplayBody::full));
    if body.size_hint().lower() > limit as u64 {
        return reject(replay.too_large());
    }
    let mut fingerprint = replay.fingerprinter(&parts);
    // A declared length (within the limit) is reserved at once: no regrowing copies.
    let expected = usize::try_from(body.size_hint().lower()).unwrap_or(0);
    let mut data = Collected::default();
    let mut body = pin!(body);
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return reject(replay.unreadable());
        };
        // Request trailers are not part of the fingerprint (nor passed on).
        if let Ok(chunk) = frame.into_data() {
            if data.len() + chunk.len() > limit {
                return reject(replay.too_large());
            }
            fingerprint.update(&chunk);
            data.push(chunk, expected);
        }
    }
    let data = data.into_bytes();
    let fingerprint = fingerprint.finish(&parts, &data);
    match replay.begin(key, fingerprint).await {
        ReplayDecision::Replay(res) => Ok(res.map(ReplayBody::full)),
        ReplayDecision::Rejected(rejection) => reject(rejection),
        ReplayDecision::Unlocked => {
            let req = Request::from_parts(parts, RequestBody::buffered(data));
            Ok(service.call(req).await?.map(ReplayBody::plain))
        }
        ReplayDecision::Run(completion) => {
            let mut req = Request::from_parts(parts, RequestBody::buffered(data));
            req.extensions_mut().insert(completion.info().clone());
            let handler = service.call(req);
            let handler = async move { handler.await.map(Handled) };
            let (handled, completion) = KeepRunning::new(handler, completion, spawn).await?;
            let capture = completion.capture_response(&handled);
            let (parts, body) = handled.0.into_parts();
            if body.is_end_stream() {
                // No body to send: the server may never poll it, so store now.
                capture.finish().await;
                return Ok(Response::from_parts(parts, ReplayBody::plain(body)));
            }
            Ok(Response::from_parts(
                parts,
                ReplayBody::capturing(body, capture),
            ))
        }
    }
}
