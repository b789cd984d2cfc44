//! [`IdempotencyService`], the service an [`IdempotencyLayer`](super::IdempotencyLayer)
//! wraps around another, and its future.

use std::{
    fmt,
    future::Future,
    panic::{self, AssertUnwindSafe},
    pin::{Pin, pin},
    task::{Context, Poll, ready},
};

use bytes::{Bytes, BytesMut};
use http::{Request, Response};
use http_body::Body;
use http_body_util::BodyExt;
use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower_service::Service;

use super::{
    NotStored,
    body::{ReplayBody, RequestBody},
    replay_locker::{Begin, Capture, Completion, ReplayLocker},
};
use crate::engine::{BoxFuture, LockKey, runtime};

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
        IdempotencyService { inner, replay }
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

type Output<ResB, E> = Result<Response<ReplayBody<ResB>>, E>;

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

pin_project! {
    /// The future of an [`IdempotencyService`] call.
    pub struct IdempotencyFuture<F, ResB, E> {
        #[pin]
        kind: FutureKind<F, ResB, E>,
    }
}

pin_project! {
    #[project = FutureKindProj]
    enum FutureKind<F, ResB, E> {
        // A request the layer does not cover.
        Pass { #[pin] future: F },
        // Read, fingerprint, decide, run, capture.
        Boxed { future: BoxFuture<'static, Output<ResB, E>> },
        Ready { response: Option<Response<ReplayBody<ResB>>> },
    }
}

impl<F, ResB, E> IdempotencyFuture<F, ResB, E> {
    fn pass(future: F) -> Self {
        IdempotencyFuture {
            kind: FutureKind::Pass { future },
        }
    }

    fn boxed(future: BoxFuture<'static, Output<ResB, E>>) -> Self {
        IdempotencyFuture {
            kind: FutureKind::Boxed { future },
        }
    }

    fn ready(response: Response<ReplayBody<ResB>>) -> Self {
        IdempotencyFuture {
            kind: FutureKind::Ready {
                response: Some(response),
            },
        }
    }
}

impl<F, ResB, E> fmt::Debug for IdempotencyFuture<F, ResB, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyFuture").finish_non_exhaustive()
    }
}

impl<F, ResB, E> Future for IdempotencyFuture<F, ResB, E>
where
    F: Future<Output = Result<Response<ResB>, E>>,
{
    type Output = Output<ResB, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            FutureKindProj::Pass { future } => {
                let res = ready!(future.poll(cx))?;
                Poll::Ready(Ok(res.map(ReplayBody::plain)))
            }
            FutureKindProj::Boxed { future } => future.as_mut().poll(cx),
            FutureKindProj::Ready { response } => {
                Poll::Ready(Ok(response.take().expect("polled after completion")))
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
        Begin::Replay(res) => Ok(res.map(ReplayBody::full)),
        Begin::Rejected(rejection) => reject(rejection),
        Begin::Unlocked => {
            let req = Request::from_parts(parts, RequestBody::buffered(data));
            Ok(service.call(req).await?.map(ReplayBody::plain))
        }
        Begin::Run(completion) => {
            let mut req = Request::from_parts(parts, RequestBody::buffered(data));
            req.extensions_mut().insert(completion.info().clone());
            let (res, completion) = KeepRunning::new(service.call(req), completion).await?;
            let (parts, body) = res.into_parts();
            let capture = capture(completion, &parts);
            if body.is_end_stream() {
                // No body to send: the server may never poll it, so store now.
                capture.finish().await;
                return Ok(Response::from_parts(parts, ReplayBody::plain(body)));
            }
            let body = ReplayBody::capturing(Box::pin(body), capture, drain::<ResB>);
            Ok(Response::from_parts(parts, body))
        }
    }
}

/// The capture of a response with this head: none for a response marked [`NotStored`].
fn capture(completion: Completion, head: &http::response::Parts) -> Capture {
    if head.extensions.get::<NotStored>().is_some() {
        completion.not_stored()
    } else {
        completion.capture(head.status, &head.headers)
    }
}

/// A request body read to its end: a body that arrives in one chunk (most do) is kept as
/// it is, without a copy.
#[derive(Default)]
enum Collected {
    #[default]
    Empty,
    One(Bytes),
    Many(BytesMut),
}

impl Collected {
    fn len(&self) -> usize {
        match self {
            Collected::Empty => 0,
            Collected::One(b) => b.len(),
            Collected::Many(b) => b.len(),
        }
    }

    /// Add `chunk`; `expected` is the body's declared length, if any (else 0).
    fn push(&mut self, chunk: Bytes, expected: usize) {
        *self = match std::mem::take(self) {
            Collected::Empty => Collected::One(chunk),
            Collected::One(first) => {
                let mut all = BytesMut::with_capacity(expected.max(first.len() + chunk.len()));
                all.extend_from_slice(&first);
                all.extend_from_slice(&chunk);
                Collected::Many(all)
            }
            Collected::Many(mut all) => {
                all.extend_from_slice(&chunk);
                Collected::Many(all)
            }
        };
    }

    fn into_bytes(self) -> Bytes {
        match self {
            Collected::Empty => Bytes::new(),
            Collected::One(b) => b,
            Collected::Many(b) => b.freeze(),
        }
    }
}

/// The inner service's future and the request's completion. If dropped before the
/// response is there (the client went away), the handler is not cancelled: it runs on
/// to completion on a task, its response is captured and stored, and only then is the
/// key released, so the client's retry gets the replay.
struct KeepRunning<F, ResB, E>
where
    F: Future<Output = Result<Response<ResB>, E>> + Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
    E: Send + 'static,
{
    future: Option<Pin<Box<F>>>,
    completion: Option<Completion>,
}

impl<F, ResB, E> KeepRunning<F, ResB, E>
where
    F: Future<Output = Result<Response<ResB>, E>> + Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
    E: Send + 'static,
{
    fn new(future: F, completion: Completion) -> Self {
        KeepRunning {
            future: Some(Box::pin(future)),
            completion: Some(completion),
        }
    }
}

impl<F, ResB, E> Future for KeepRunning<F, ResB, E>
where
    F: Future<Output = Result<Response<ResB>, E>> + Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
    E: Send + 'static,
{
    type Output = Result<(Response<ResB>, Completion), E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let future = self.future.as_mut().expect("polled after completion");
        let out = match panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(poll) => ready!(poll),
            Err(panic) => {
                // The handler panicked: it cannot be kept running (a panicked future must
                // not be polled again). Release the key, store nothing, and let the panic
                // go on to cost this request alone.
                self.future = None;
                self.completion = None;
                panic::resume_unwind(panic)
            }
        };
        self.future = None;
        let completion = self.completion.take().expect("polled after completion");
        // An error of the inner service drops the completion: released, nothing stored.
        Poll::Ready(out.map(|res| (res, completion)))
    }
}

impl<F, ResB, E> Drop for KeepRunning<F, ResB, E>
where
    F: Future<Output = Result<Response<ResB>, E>> + Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
    E: Send + 'static,
{
    fn drop(&mut self) {
        let (Some(future), Some(completion)) = (self.future.take(), self.completion.take()) else {
            return;
        };
        spawn(async move {
            let Ok(res) = future.await else {
                return;
            };
            let (parts, body) = res.into_parts();
            drain_into(Box::pin(body), capture(completion, &parts)).await;
        });
    }
}

/// [`Drain`](super::body::Drain) for `B`: finish reading a body no client reads any more.
/// What is there already is read on the spot (so a whole body is stored before the drop
/// returns); the rest on a task, for at most the capture's drain time.
fn drain<B>(mut body: Pin<Box<B>>, mut capture: Capture)
where
    B: Body<Data = Bytes> + Send + 'static,
{
    let mut cx = Context::from_waker(std::task::Waker::noop());
    while capture.wants_data() {
        // User code, polled from a `Drop`: a panic here must not leave the drop (the
        // panic message is out; the capture is dropped, which releases the key).
        let Ok(frame) = panic::catch_unwind(AssertUnwindSafe(|| body.as_mut().poll_frame(&mut cx)))
        else {
            return;
        };
        match frame {
            Poll::Pending => {
                spawn(drain_into(body, capture));
                return;
            }
            Poll::Ready(None) => break,
            Poll::Ready(Some(Ok(frame))) => feed(&mut capture, frame),
            // Failed mid-stream: nothing stored, released (the capture is dropped).
            Poll::Ready(Some(Err(_))) => return,
        }
    }
    runtime::detach(capture.finish());
}

async fn drain_into<B>(mut body: Pin<Box<B>>, mut capture: Capture)
where
    B: Body<Data = Bytes>,
{
    let deadline = Instant::now() + capture.max_drain_time();
    // Read up to the limit: past it the response is known not to be kept.
    while capture.wants_data() {
        match tokio::time::timeout_at(deadline, body.frame()).await {
            // A body that does not end (a stream nobody reads any more) is cut off: the
            // request completed, its response is not stored, the key is released.
            Err(_) => {
                capture.cut_off();
                break;
            }
            Ok(None) => break,
            Ok(Some(Ok(frame))) => feed(&mut capture, frame),
            // Failed mid-stream: nothing stored, released (the capture is dropped).
            Ok(Some(Err(_))) => return,
        }
    }
    capture.finish().await;
}

fn feed(capture: &mut Capture, frame: http_body::Frame<Bytes>) {
    match frame.into_data() {
        Ok(chunk) => capture.data(&chunk),
        Err(frame) if frame.is_trailers() => capture.trailers(),
        Err(_) => {}
    }
}

/// The handler's work belongs to the application's runtime, where it was started; the
/// engine's own runtime only when there is none.
fn spawn<F>(future: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => drop(handle.spawn(future)),
        Err(_) => drop(runtime::handle().spawn(future)),
    }
}
