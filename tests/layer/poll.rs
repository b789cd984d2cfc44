//! The layer at the poll level: tower-test mocks for the inner service, tokio's paused
//! clock for the waiting logic, `poll_ready` / `call` driven by hand.

use std::time::Duration;

use http::{HeaderName, Request, Response, StatusCode};
use http_body_util::BodyExt;
use tokio_test::{assert_pending, assert_ready, assert_ready_ok, task};
use tower_lock::{
    ConfigError, IdempotencyLayer, LeaseInfo, LockEngine, LockLayer, MissingKeyPolicy,
    ReleasePoint,
    key::{GlobalKey, HeaderKey, KeyExtractor},
};
use tower_lock_core::Outcome;
use tower_test::mock;

type Req = Request<String>;
type Res = Response<String>;

fn req(key: &str) -> Req {
    Request::builder()
        .uri("/x")
        .header("x-key", key)
        .body(String::new())
        .unwrap()
}

fn header_key() -> HeaderKey {
    HeaderKey::new(HeaderName::from_static("x-key"))
}

fn builder(engine: &LockEngine) -> tower_lock::LockLayerBuilder {
    // These tests are about the lease's life, not the method filter: the safe methods
    // they send (a plain `GET`, a `HEAD`) are named, so that they are locked.
    LockLayer::builder(engine.clone())
        .key(header_key())
        .methods(["GET", "HEAD", "POST"])
}

/// The lock key of a request with `x-key: <value>` to a layer made by [`builder`].
fn lock_key(value: &str) -> String {
    tower_lock::key::encode("", header_key().kind(), value)
}

async fn body_json(res: Response<tower_lock::LockedBody<String>>) -> serde_json::Value {
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

/// Let spawned tasks (background releases) run.
async fn settle() {
    for _ in 0..5 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn poll_ready_delegates_to_the_inner_service() {
    let layer = builder(&LockEngine::in_memory()).build().unwrap();
    let (mut service, mut handle) = mock::spawn_layer::<Req, Res, _>(layer);
    handle.allow(0);
    assert_pending!(service.poll_ready());
    handle.allow(1);
    assert_ready_ok!(service.poll_ready());
}

#[tokio::test(start_paused = true)]
async fn lease_info_is_in_the_extensions_and_the_inner_error_is_unchanged() {
    let engine = LockEngine::in_memory();
    let (mut service, mut handle) =
        mock::spawn_layer::<Req, Res, _>(builder(&engine).build().unwrap());
    assert_ready_ok!(service.poll_ready());
    let mut fut = task::spawn(service.call(req("k")));
    assert_pending!(fut.poll());
    let (request, send) = handle.next_request().await.unwrap();
    let info = request
        .extensions()
        .get::<LeaseInfo>()
        .expect("lease info")
        .clone();
    assert_eq!(info.key().as_str(), "/header=x-key/k");
    assert!(!info.is_lost() && !info.is_degraded());
    send.send_error("inner failure");
    let err = assert_ready!(fut.poll()).unwrap_err();
    assert_eq!(err.to_string(), "inner failure");
    drop(fut);
    settle().await;
    assert!(!engine.lock(lock_key("k")).locked().await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn waiter_is_answered_429_when_its_wait_limit_passes() {
    let engine = LockEngine::in_memory();
    let layer = builder(&engine)
        .wait(Duration::from_secs(5))
        .build()
        .unwrap();
    let (mut service, mut handle) = mock::spawn_layer::<Req, Res, _>(layer);

    assert_ready_ok!(service.poll_ready());
    let mut holder = task::spawn(service.call(req("k")));
    assert_pending!(holder.poll());
    let (_request, _send) = handle.next_request().await.unwrap();

    assert_ready_ok!(service.poll_ready());
    let mut waiter = task::spawn(service.call(req("k")));
    assert_pending!(waiter.poll());
    tokio::time::advance(Duration::from_millis(4_999)).await;
    assert_pending!(waiter.poll());
    tokio::time::advance(Duration::from_millis(2)).await;
    let res = assert_ready_ok!(waiter.poll());
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = res.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry >= 1);
    assert_eq!(
        body_json(res).await["type"],
        "urn:tower-lock:problem:wait-timed-out"
    );
    // The waiter never reached the inner service.
    assert!(handle.poll_request().is_pending());
}

#[tokio::test(start_paused = true)]
async fn waiter_runs_once_the_holders_body_is_finished() {
    let engine = LockEngine::in_memory();
    let layer = builder(&engine)
        .wait(Duration::from_secs(5))
        .build()
        .unwrap();
    let (mut service, mut handle) = mock::spawn_layer::<Req, Res, _>(layer);

    assert_ready_ok!(service.poll_ready());
    let mut holder = task::spawn(service.call(req("k")));
    assert_pending!(holder.poll());
    let (_, send) = handle.next_request().await.unwrap();

    assert_ready_ok!(service.poll_ready());
    let mut waiter = task::spawn(service.call(req("k")));
    assert_pending!(waiter.poll());

    send.send_response(Response::new("holder body".to_owned()));
    let res = assert_ready_ok!(holder.poll());
    // The holder's response is out but its body is not finished: still locked.
    settle().await;
    assert_pending!(waiter.poll());
    assert!(handle.poll_request().is_pending());

    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "holder body");
    settle().await;
    assert!(waiter.is_woken());
    assert_pending!(waiter.poll());
    let (request, _send) = handle.next_request().await.unwrap();
    assert!(request.extensions().get::<LeaseInfo>().is_some());
}

#[tokio::test(start_paused = true)]
async fn waiters_are_served_in_arrival_order_under_fifo() {
    let engine = LockEngine::in_memory();
    let layer = builder(&engine)
        .wait(Duration::from_secs(60))
        .fifo(true)
        .build()
        .unwrap();
    let (mut service, mut handle) = mock::spawn_layer::<Req, Res, _>(layer);
    let mut futs = Vec::new();
    for i in 0..4 {
        assert_ready_ok!(service.poll_ready());
        let mut r = req("k");
        r.headers_mut()
            .insert("x-seq", i.to_string().parse().unwrap());
        let mut fut = task::spawn(service.call(r));
        assert_pending!(fut.poll());
        futs.push(fut);
    }
    for expected in 0..4 {
        let (request, send) = handle.next_request().await.unwrap();
        assert_eq!(request.headers()["x-seq"], expected.to_string().as_str());
        send.send_response(Response::new(String::new()));
        let res = assert_ready_ok!(futs[expected].poll());
        drop(res);
        settle().await;
        for fut in futs.iter_mut().skip(expected + 1) {
            let _ = fut.poll();
        }
    }
}

#[tokio::test(start_paused = true)]
async fn release_on_response_ready_frees_the_key_before_the_body_is_read() {
    let engine = LockEngine::in_memory();
    let layer = builder(&engine)
        .release_at(ReleasePoint::ResponseReady)
        .build()
        .unwrap();
    let (mut service, mut handle) = mock::spawn_layer::<Req, Res, _>(layer);
    assert_ready_ok!(service.poll_ready());
    let mut fut = task::spawn(service.call(req("k")));
    assert_pending!(fut.poll());
    let (_, send) = handle.next_request().await.unwrap();
    send.send_response(Response::new("unread".to_owned()));
    let res = assert_ready_ok!(fut.poll());
    settle().await;
    assert!(!engine.lock(lock_key("k")).locked().await.unwrap());
    drop(res);
}

#[tokio::test(start_paused = true)]
async fn switching_protocols_releases_when_the_response_is_returned() {
    let engine = LockEngine::in_memory();
    let (mut service, mut handle) =
        mock::spawn_layer::<Req, Res, _>(builder(&engine).build().unwrap());
    assert_ready_ok!(service.poll_ready());
    let mut fut = task::spawn(service.call(req("k")));
    assert_pending!(fut.poll());
    let (_, send) = handle.next_request().await.unwrap();
    let mut upgrade = Response::new(String::new());
    *upgrade.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    send.send_response(upgrade);
    let res = assert_ready_ok!(fut.poll());
    settle().await;
    assert!(!engine.lock(lock_key("k")).locked().await.unwrap());
    drop(res);
}

/// A body that is empty by its exact size hint only: it does not say it has ended, and a
/// server that trusts the hint never polls it.
struct ZeroLengthBody;

impl http_body::Body for ZeroLengthBody {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::task::Poll::Ready(None)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(0)
    }
}

/// The lock on `k` after one request (`method`) answered by `response`, while the caller
/// still holds the response with its body unread.
async fn locked_while_the_response_is_unread<B>(method: &str, response: Response<B>) -> bool
where
    B: http_body::Body + Send + 'static,
{
    let engine = LockEngine::in_memory();
    let (mut service, mut handle) =
        mock::spawn_layer::<Req, Response<B>, _>(builder(&engine).build().unwrap());
    assert_ready_ok!(service.poll_ready());
    let mut request = req("k");
    *request.method_mut() = method.parse().unwrap();
    let mut fut = task::spawn(service.call(request));
    assert_pending!(fut.poll());
    let (_, send) = handle.next_request().await.unwrap();
    send.send_response(response);
    let res = assert_ready_ok!(fut.poll());
    // No settling: the release must already be done when the response is returned.
    let locked = engine.lock(lock_key("k")).locked().await.unwrap();
    drop(res);
    locked
}

fn response<B>(status: StatusCode, body: B) -> Response<B> {
    let mut res = Response::new(body);
    *res.status_mut() = status;
    res
}

#[tokio::test(start_paused = true)]
async fn bodiless_responses_are_released_before_they_are_returned() {
    let cases = [
        ("GET", StatusCode::NO_CONTENT, ""),
        ("GET", StatusCode::NOT_MODIFIED, ""),
        ("GET", StatusCode::OK, ""),
        ("HEAD", StatusCode::OK, "the body a GET would have"),
    ];
    for (method, status, body) in cases {
        let res = response(status, body.to_owned());
        assert!(
            !locked_while_the_response_is_unread(method, res).await,
            "{method} answered {status}"
        );
    }
    let res = response(StatusCode::OK, ZeroLengthBody);
    assert!(!locked_while_the_response_is_unread("GET", res).await);
    // A body to send keeps the key until it ends.
    let res = response(StatusCode::OK, "unread".to_owned());
    assert!(locked_while_the_response_is_unread("GET", res).await);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_response_future_gives_up_the_wait_and_the_lease() {
    let engine = LockEngine::in_memory();
    let layer = builder(&engine)
        .wait(Duration::from_secs(60))
        .build()
        .unwrap();
    let (mut service, mut handle) = mock::spawn_layer::<Req, Res, _>(layer);
    assert_ready_ok!(service.poll_ready());
    let mut holder = task::spawn(service.call(req("k")));
    assert_pending!(holder.poll());
    let _inflight = handle.next_request().await.unwrap();
    assert_ready_ok!(service.poll_ready());
    let mut waiter = task::spawn(service.call(req("k")));
    assert_pending!(waiter.poll());
    assert_eq!(engine.lock(lock_key("k")).waiters().await.unwrap(), 1);

    drop(waiter);
    assert_eq!(engine.lock(lock_key("k")).waiters().await.unwrap(), 0);
    drop(holder);
    settle().await;
    assert!(!engine.lock(lock_key("k")).locked().await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn a_response_future_dropped_before_its_first_poll_leaves_no_lock_behind() {
    // On the in-process engine a free key is granted in `call` itself: the lease lives in
    // the response future from then on, polled or not.
    let engine = LockEngine::in_memory();
    let layer = builder(&engine)
        .wait(Duration::from_secs(60))
        .build()
        .unwrap();
    let (mut service, _handle) = mock::spawn_layer::<Req, Res, _>(layer);
    assert_ready_ok!(service.poll_ready());
    let unpolled = service.call(req("k"));
    assert!(engine.lock(lock_key("k")).locked().await.unwrap());
    drop(unpolled);
    assert!(!engine.lock(lock_key("k")).locked().await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn missing_key_passes_through_without_lease_info() {
    let layer = builder(&LockEngine::in_memory())
        .on_missing_key(MissingKeyPolicy::PassThrough)
        .build()
        .unwrap();
    let (mut service, mut handle) = mock::spawn_layer::<Req, Res, _>(layer.clone());
    assert_ready_ok!(service.poll_ready());
    let mut fut = task::spawn(service.call(Request::new(String::new())));
    assert_pending!(fut.poll());
    let (request, send) = handle.next_request().await.unwrap();
    assert!(request.extensions().get::<LeaseInfo>().is_none());
    send.send_response(Response::new(String::new()));
    assert_eq!(assert_ready_ok!(fut.poll()).status(), StatusCode::OK);
    assert_eq!(layer.metrics().snapshot().unlocked, 1);
}

#[tokio::test(start_paused = true)]
async fn metrics_count_acquisitions_rejections_and_hold_time() {
    let engine = LockEngine::in_memory();
    let layer = builder(&engine).build().unwrap();
    let (mut service, mut handle) = mock::spawn_layer::<Req, Res, _>(layer.clone());
    assert_ready_ok!(service.poll_ready());
    let mut holder = task::spawn(service.call(req("k")));
    assert_pending!(holder.poll());
    let (_, send) = handle.next_request().await.unwrap();
    assert_ready_ok!(service.poll_ready());
    let res = service.call(req("k")).await.unwrap();
    assert_eq!(res.status(), StatusCode::LOCKED);

    tokio::time::advance(Duration::from_millis(30)).await;
    send.send_response(Response::new(String::new()));
    drop(assert_ready_ok!(holder.poll()));
    let snap = layer.metrics().snapshot();
    assert_eq!(snap.acquired, 1);
    assert_eq!(snap.rejected.locked, 1);
    assert_eq!(snap.rejected.total(), 1);
    assert_eq!(snap.contended, 1);
    assert_eq!(snap.hold.count, 1);
    assert!(snap.hold.sum >= Duration::from_millis(30));
}

#[test]
fn misconfiguration_fails_at_build_time() {
    let engine = LockEngine::in_memory();
    assert_eq!(
        LockLayer::builder(engine.clone()).build().unwrap_err(),
        ConfigError::NoKeyExtractor
    );
    assert_eq!(
        builder(&engine).fifo(true).build().unwrap_err(),
        ConfigError::NeedsWait("fifo")
    );
    assert_eq!(
        builder(&engine).max_waiters(3).build().unwrap_err(),
        ConfigError::NeedsWait("max_waiters")
    );
    assert_eq!(
        builder(&engine).ttl(Duration::ZERO).build().unwrap_err(),
        ConfigError::ZeroTtl
    );
    assert_eq!(
        IdempotencyLayer::builder(engine.clone())
            .without_replay()
            .wait(Duration::from_secs(1))
            .build()
            .unwrap_err(),
        ConfigError::IdempotencyWait
    );
    assert!(matches!(
        builder(&engine)
            .namespace("bad\nnamespace")
            .build()
            .unwrap_err(),
        ConfigError::Namespace(_)
    ));
}

#[test]
fn a_zero_waiter_limit_or_a_ttl_under_a_millisecond_fails_at_build_time() {
    let engine = LockEngine::in_memory();
    let waiting = || builder(&engine).wait(Duration::from_secs(1));
    assert_eq!(
        waiting().max_waiters(0).build().unwrap_err(),
        ConfigError::ZeroMaxWaiters
    );
    assert_eq!(
        builder(&engine)
            .ttl(Duration::from_micros(999))
            .build()
            .unwrap_err(),
        ConfigError::TtlTooShort(Duration::from_micros(999))
    );
    assert_eq!(
        builder(&engine)
            .ttl(Duration::from_nanos(1))
            .build()
            .unwrap_err(),
        ConfigError::TtlTooShort(Duration::from_nanos(1))
    );
    // The smallest accepted values.
    assert!(waiting().max_waiters(1).build().is_ok());
    assert!(
        builder(&engine)
            .ttl(Duration::from_millis(1))
            .build()
            .is_ok()
    );
    // The last setting counts, as for every other option.
    assert!(
        builder(&engine)
            .ttl(Duration::from_micros(1))
            .ttl(Duration::from_secs(1))
            .build()
            .is_ok()
    );
}

#[tokio::test(start_paused = true)]
async fn one_layer_wrapping_two_services_shares_one_lock_table() {
    let layer = LockLayer::builder(LockEngine::in_memory())
        .key(GlobalKey::new("g"))
        .methods(["GET"])
        .build()
        .unwrap();
    let (mut a, mut handle_a) = mock::spawn_layer::<Req, Res, _>(layer.clone());
    let (mut b, _handle_b) = mock::spawn_layer::<Req, Res, _>(layer.clone());
    assert_ready_ok!(a.poll_ready());
    let mut held = task::spawn(a.call(req("ignored")));
    assert_pending!(held.poll());
    let _inflight = handle_a.next_request().await.unwrap();
    assert_ready_ok!(b.poll_ready());
    let res = b.call(req("ignored")).await.unwrap();
    assert_eq!(res.status(), StatusCode::LOCKED);
}

#[tokio::test(start_paused = true)]
async fn namespace_is_the_first_part_of_the_lock_key() {
    let engine = LockEngine::in_memory();
    let layer = builder(&engine).namespace("api").build().unwrap();
    assert_eq!(layer.locker().namespace(), "api");
    let (mut service, mut handle) = mock::spawn_layer::<Req, Res, _>(layer.clone());
    assert_ready_ok!(service.poll_ready());
    let mut fut = task::spawn(service.call(req("k")));
    assert_pending!(fut.poll());
    let (request, _send) = handle.next_request().await.unwrap();
    let key = request
        .extensions()
        .get::<LeaseInfo>()
        .unwrap()
        .key()
        .clone();
    assert_eq!(key.as_str(), "api/header=x-key/k");
    assert_eq!(layer.locker().key_for("k").unwrap(), key);
    assert!(engine.lock("api/header=x-key/k").locked().await.unwrap());
    assert!(!engine.lock(lock_key("k")).locked().await.unwrap());
}

/// On the real clock: the engine keeps lease time on its own runtime, which a paused
/// test clock does not drive.
#[tokio::test]
async fn handler_observes_a_lost_lease_through_its_lease_info() {
    let engine = LockEngine::in_memory();
    let layer = builder(&engine)
        .ttl(Duration::from_millis(300))
        .build()
        .unwrap();
    let (mut service, mut handle) = mock::spawn_layer::<Req, Res, _>(layer);
    assert_ready_ok!(service.poll_ready());
    let mut fut = task::spawn(service.call(req("k")));
    assert_pending!(fut.poll());
    let (request, _send) = handle.next_request().await.unwrap();
    let info = request.extensions().get::<LeaseInfo>().unwrap().clone();
    let signal = info.lost_signal();
    let mut lost = task::spawn(async move { signal.lost().await });
    assert_pending!(lost.poll());
    assert!(!info.is_lost());
    // An operator takes the key away; the first renewal (due at a third of the TTL) finds
    // the lease gone.
    assert!(
        engine
            .admin()
            .force_release(info.key().as_str())
            .await
            .unwrap()
    );
    tokio::time::timeout(Duration::from_secs(2), info.lost_signal().lost())
        .await
        .expect("the first renewal finds the lease gone");
    assert_ready!(lost.poll());
    assert!(info.is_lost());
}

#[tokio::test(start_paused = true)]
async fn over_long_key_is_answered_400_without_reaching_the_inner_service() {
    let layer = builder(&LockEngine::in_memory()).build().unwrap();
    let (mut service, mut handle) = mock::spawn_layer::<Req, Res, _>(layer);
    assert_ready_ok!(service.poll_ready());
    let res = service.call(req(&"k".repeat(600))).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    let problem = body_json(res).await;
    assert_eq!(problem["type"], "urn:tower-lock:problem:malformed-key");
    assert!(problem["detail"].as_str().unwrap().contains("512"));
    assert!(handle.poll_request().is_pending());
}

/// A request from some other framework: only what `RequestView` asks for.
struct ForeignRequest {
    headers: Vec<(&'static str, &'static [u8])>,
}

impl tower_lock::key::RequestView for ForeignRequest {
    fn method(&self) -> &str {
        "POST"
    }

    fn path(&self) -> &str {
        "/payments"
    }

    fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| *v)
    }
}

#[tokio::test(start_paused = true)]
async fn the_neutral_locker_serves_requests_of_other_frameworks() {
    let locker = IdempotencyLayer::builder(LockEngine::in_memory())
        .without_replay()
        .build_locker()
        .unwrap();
    let req = ForeignRequest {
        headers: vec![("idempotency-key", b"\"abc\"")],
    };
    let Outcome::Locked(held) = locker.acquire(&req).await else {
        panic!("first request gets the lock");
    };
    assert_eq!(held.info().key().as_str(), "/idempotency-key/abc");
    let Outcome::Rejected(rejection) = locker.acquire(&req).await else {
        panic!("duplicate in flight is rejected");
    };
    assert_eq!(rejection.status().as_u16(), 409);
    let headers = rejection.headers();
    assert!(headers.contains(&("content-type", "application/problem+json".to_owned())));
    assert!(headers.iter().any(|(n, v)| *n == "retry-after" && v != "0"));
    let body: serde_json::Value = serde_json::from_slice(&rejection.body()).unwrap();
    assert_eq!(body["status"], 409);

    drop(held);
    settle().await;
    assert!(matches!(locker.acquire(&req).await, Outcome::Locked(_)));
    let missing = ForeignRequest { headers: vec![] };
    let Outcome::Rejected(rejection) = locker.acquire(&missing).await else {
        panic!("a missing key is rejected");
    };
    assert_eq!(rejection.kind(), tower_lock::RejectionKind::MissingKey);
}
