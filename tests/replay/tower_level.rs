//! Idempotency replay at the tower level, where a test controls what an HTTP server would
//! not let it: handler errors and panics, bodies that fail or carry trailers, a future
//! dropped at a chosen point, a lease taken away mid-request.

use std::{
    convert::Infallible,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use tokio::sync::oneshot;
use tower::{Service, ServiceExt, service_fn};
use tower_lock::{
    ConfigError, IdempotencyLayer, LockEngine, LockKey, LockLayer, idempotency::RequestBody,
    key::encode,
};
use tower_lock_test_support::scripted::Scripted;

type Body = BoxBody<Bytes, std::io::Error>;
type Req = Request<RequestBody<Full<Bytes>>>;

fn request(k: &str) -> Request<Full<Bytes>> {
    Request::post("/orders")
        .header("idempotency-key", format!("\"{k}\""))
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap()
}

fn lock_key(k: &str) -> LockKey {
    LockKey::new(encode("", "idempotency-key", k)).unwrap()
}

fn full(status: StatusCode, text: &'static str) -> Response<Body> {
    let mut res = Response::new(
        Full::new(Bytes::from_static(text.as_bytes()))
            .map_err(|never| match never {})
            .boxed(),
    );
    *res.status_mut() = status;
    res
}

fn layer(engine: &LockEngine) -> IdempotencyLayer {
    IdempotencyLayer::builder(engine.clone())
        .unscoped()
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_handler_error_stores_nothing_and_the_retry_runs() {
    let engine = LockEngine::in_memory();
    let runs = Arc::new(AtomicUsize::new(0));
    let svc = {
        let runs = runs.clone();
        service_fn(move |_req: Req| {
            let n = runs.fetch_add(1, Ordering::SeqCst);
            async move {
                if n == 0 {
                    Err("handler failed")
                } else {
                    Ok(full(StatusCode::CREATED, "made"))
                }
            }
        })
    };
    let mut svc = tower::ServiceBuilder::new()
        .layer(layer(&engine))
        .service(svc);
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(request("e"))
        .await
        .unwrap_err();
    assert_eq!(err, "handler failed");
    assert_eq!(engine.record(&lock_key("e")).await.unwrap(), None);
    let res = svc.ready().await.unwrap().call(request("e")).await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(runs.load(Ordering::SeqCst), 2, "the retry ran");
}

#[tokio::test]
async fn a_panicking_handler_stores_nothing_and_releases() {
    let engine = LockEngine::in_memory();
    let runs = Arc::new(AtomicUsize::new(0));
    let svc = {
        let runs = runs.clone();
        service_fn(move |_req: Req| {
            let n = runs.fetch_add(1, Ordering::SeqCst);
            async move {
                assert!(n > 0, "the handler panics on its first run");
                Ok::<_, Infallible>(full(StatusCode::CREATED, "made"))
            }
        })
    };
    let svc = tower::ServiceBuilder::new()
        .layer(layer(&engine))
        .service(svc);
    let first = tokio::spawn(svc.clone().oneshot(request("p")));
    assert!(first.await.unwrap_err().is_panic());
    let res = tokio::time::timeout(Duration::from_secs(5), svc.oneshot(request("p")))
        .await
        .expect("the key was released when the handler panicked")
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A body that yields `frames`, one per poll.
struct Frames(std::collections::VecDeque<Result<Frame<Bytes>, std::io::Error>>);

impl http_body::Body for Frames {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        std::task::Poll::Ready(self.0.pop_front())
    }
}

/// `retry` is answered `409 response-not-stored`, naming the status the request it retries
/// completed with.
async fn assert_not_stored<B>(retry: Response<B>, original: StatusCode)
where
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    assert_eq!(retry.status(), StatusCode::CONFLICT, "{original}");
    let body = retry.into_body().collect().await.unwrap().to_bytes();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        problem["type"],
        "urn:tower-lock:problem:response-not-stored"
    );
    assert_eq!(problem["original_status"], original.as_u16());
}

fn streamed(frames: Vec<Result<Frame<Bytes>, std::io::Error>>) -> Response<Body> {
    Response::new(Frames(frames.into()).boxed())
}

/// A body that fails mid-stream after a head whose status is stored (`201`): the request
/// completed (its handler ran), its response cannot be kept, so a retry is answered `409
/// response-not-stored` and never runs it a second time. Under a status that is never
/// stored (`500`) the key is released with nothing recorded, and the retry runs.
#[tokio::test]
async fn a_body_failing_mid_stream_is_recorded_as_completed_if_its_status_is_stored() {
    for (status, stored) in [
        (StatusCode::CREATED, true),
        (StatusCode::INTERNAL_SERVER_ERROR, false),
    ] {
        let engine = LockEngine::in_memory();
        let runs = Arc::new(AtomicUsize::new(0));
        let svc = {
            let runs = runs.clone();
            service_fn(move |_req: Req| {
                runs.fetch_add(1, Ordering::SeqCst);
                async move {
                    let mut res = streamed(vec![
                        Ok(Frame::data(Bytes::from_static(b"half"))),
                        Err(std::io::Error::other("the body broke")),
                    ]);
                    *res.status_mut() = status;
                    Ok::<_, Infallible>(res)
                }
            })
        };
        let svc = tower::ServiceBuilder::new()
            .layer(layer(&engine))
            .service(svc);
        let first = svc.clone().oneshot(request("b")).await.unwrap();
        assert!(first.into_body().collect().await.is_err());
        let retry = svc.clone().oneshot(request("b")).await.unwrap();
        if stored {
            assert_not_stored(retry, status).await;
            assert_eq!(runs.load(Ordering::SeqCst), 1, "{status}: never run twice");
        } else {
            assert!(retry.into_body().collect().await.is_err());
            assert_eq!(runs.load(Ordering::SeqCst), 2, "{status}: the retry ran");
            assert_eq!(engine.record(&lock_key("b")).await.unwrap(), None);
        }
    }
}

#[tokio::test]
async fn a_response_with_trailers_is_replayed_with_its_trailers() {
    let engine = LockEngine::in_memory();
    let runs = Arc::new(AtomicUsize::new(0));
    let svc = {
        let runs = runs.clone();
        service_fn(move |_req: Req| {
            runs.fetch_add(1, Ordering::SeqCst);
            let mut trailers = HeaderMap::new();
            trailers.insert("x-checksum", "1".parse().unwrap());
            async move {
                let mut res = streamed(vec![
                    Ok(Frame::data(Bytes::from_static(b"data"))),
                    Ok(Frame::trailers(trailers)),
                ]);
                *res.status_mut() = StatusCode::ACCEPTED;
                Ok::<_, Infallible>(res)
            }
        })
    };
    let svc = tower::ServiceBuilder::new()
        .layer(layer(&engine))
        .service(svc);
    let first = svc.clone().oneshot(request("t")).await.unwrap();
    let collected = first.into_body().collect().await.unwrap();
    assert!(
        collected.trailers().is_some(),
        "the client got the trailers"
    );
    let retry = svc.oneshot(request("t")).await.unwrap();
    assert_eq!(retry.status(), StatusCode::ACCEPTED);
    let replayed = retry.into_body().collect().await.unwrap();
    assert_eq!(replayed.trailers().unwrap()["x-checksum"], "1");
    assert_eq!(replayed.to_bytes(), "data");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "never run twice");
}

#[tokio::test]
async fn a_bodiless_response_is_stored_before_it_is_returned() {
    let engine = LockEngine::in_memory();
    let svc = service_fn(|_req: Req| async {
        let mut res = full(StatusCode::CREATED, "");
        res.headers_mut()
            .insert("location", "/orders/1".parse().unwrap());
        Ok::<_, Infallible>(res)
    });
    let svc = tower::ServiceBuilder::new()
        .layer(layer(&engine))
        .service(svc);
    // The body is never polled: a server sends no body for it.
    let res = svc.clone().oneshot(request("n")).await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    assert!(engine.record(&lock_key("n")).await.unwrap().is_some());
    let replay = svc.oneshot(request("n")).await.unwrap();
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.headers()["location"], "/orders/1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_dropped_mid_handler_lets_the_handler_finish_and_stores_its_response() {
    for _ in 0..20 {
        let engine = LockEngine::in_memory();
        let (entered_tx, entered) = oneshot::channel::<()>();
        let (finish, finish_rx) = oneshot::channel::<()>();
        let slots = Arc::new(std::sync::Mutex::new(Some((entered_tx, finish_rx))));
        let runs = Arc::new(AtomicUsize::new(0));
        let svc = {
            let (slots, runs) = (slots.clone(), runs.clone());
            service_fn(move |_req: Req| {
                let slot = slots.lock().unwrap().take();
                let runs = runs.clone();
                async move {
                    if let Some((entered, finish)) = slot {
                        entered.send(()).unwrap();
                        finish.await.unwrap();
                    }
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Infallible>(full(StatusCode::CREATED, "done once"))
                }
            })
        };
        let svc = tower::ServiceBuilder::new()
            .layer(layer(&engine))
            .service(svc);
        let call = tokio::spawn(svc.clone().oneshot(request("d")));
        entered.await.unwrap();
        call.abort();
        assert!(call.await.unwrap_err().is_cancelled());
        finish.send(()).unwrap();
        // The retry waits for nothing: it is either the replay, or 409 while the handler
        // finishes on its own task; never a second run.
        let replay = loop {
            let res = svc.clone().oneshot(request("d")).await.unwrap();
            if res.status() != StatusCode::CONFLICT {
                break res;
            }
            tokio::task::yield_now().await;
        };
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
        let body = replay.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "done once");
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}

#[tokio::test]
async fn a_holder_whose_lease_was_taken_stores_nothing_and_it_is_counted() {
    let engine = LockEngine::in_memory();
    let (entered_tx, entered) = oneshot::channel::<()>();
    let (finish, finish_rx) = oneshot::channel::<()>();
    let slot = Arc::new(std::sync::Mutex::new(Some((entered_tx, finish_rx))));
    let svc = service_fn(move |_req: Req| {
        let slot = slot.lock().unwrap().take();
        async move {
            if let Some((entered, finish)) = slot {
                entered.send(()).unwrap();
                finish.await.unwrap();
            }
            Ok::<_, Infallible>(full(StatusCode::CREATED, "late"))
        }
    });
    let layer = layer(&engine);
    let metrics = layer.metrics();
    let svc = tower::ServiceBuilder::new().layer(layer).service(svc);
    let call = tokio::spawn(svc.clone().oneshot(request("l")));
    entered.await.unwrap();
    // An operator (or an expiry) frees the key while the handler runs; another holder
    // takes it.
    assert!(
        engine
            .admin()
            .force_release(lock_key("l").as_str())
            .await
            .unwrap()
    );
    let other = engine
        .lock(lock_key("l").as_str())
        .try_acquire()
        .await
        .unwrap();
    finish.send(()).unwrap();
    let res = call.await.unwrap().unwrap();
    let _ = res.into_body().collect().await.unwrap();
    assert_eq!(
        engine.record(&lock_key("l")).await.unwrap(),
        None,
        "nothing overwritten"
    );
    assert!(
        other.owned().await.unwrap(),
        "the other holder keeps the key"
    );
    assert_eq!(metrics.snapshot().discarded, 1);
}

#[test]
fn replay_needs_a_backend_that_keeps_records() {
    let engine = LockEngine::new(Scripted::core_only());
    assert_eq!(
        IdempotencyLayer::builder(engine.clone())
            .unscoped()
            .build()
            .unwrap_err(),
        ConfigError::RecordsUnsupported
    );
    // Without replay, the preset needs nothing but the core.
    IdempotencyLayer::builder(engine)
        .without_replay()
        .build()
        .unwrap();
}

#[test]
fn limits_and_retention_are_checked() {
    let engine = LockEngine::in_memory();
    let build =
        |f: fn(tower_lock::IdempotencyLayerBuilder) -> tower_lock::IdempotencyLayerBuilder| {
            f(IdempotencyLayer::builder(engine.clone()).unscoped())
                .build()
                .unwrap_err()
        };
    assert_eq!(
        build(|b| b.max_request_body(0)),
        ConfigError::ZeroLimit("max_request_body")
    );
    assert_eq!(
        build(|b| b.max_response_body(0)),
        ConfigError::ZeroLimit("max_response_body")
    );
    assert_eq!(
        build(|b| b.retention(Duration::ZERO)),
        ConfigError::ZeroLimit("retention")
    );
    assert_eq!(
        build(|b| b.retention(Duration::from_secs(400 * 24 * 3600))),
        ConfigError::TooLong("retention")
    );
    assert_eq!(
        build(|b| b.max_drain_time(Duration::ZERO)),
        ConfigError::ZeroLimit("max_drain_time")
    );
}

#[tokio::test]
async fn a_response_dropped_unread_is_read_to_its_end_and_stored_on_the_spot() {
    let engine = LockEngine::in_memory();
    let svc =
        service_fn(|_req: Req| async { Ok::<_, Infallible>(full(StatusCode::OK, "all of it")) });
    let svc = tower::ServiceBuilder::new()
        .layer(layer(&engine))
        .service(svc);
    let res = svc.clone().oneshot(request("u")).await.unwrap();
    drop(res);
    // No task had to run: the body was already there.
    let record = engine
        .record(&lock_key("u"))
        .await
        .unwrap()
        .expect("stored");
    assert_eq!(record.body, "all of it");
}

#[tokio::test]
async fn a_request_body_in_many_chunks_is_the_same_request_as_in_one() {
    let engine = LockEngine::in_memory();
    let runs = Arc::new(AtomicUsize::new(0));
    let svc = {
        let runs = runs.clone();
        service_fn(move |req: Request<RequestBody<Body>>| {
            runs.fetch_add(1, Ordering::SeqCst);
            async move {
                // The handler sees the whole body.
                let body = req.into_body().collect().await.unwrap().to_bytes();
                assert_eq!(body, "abcdef");
                Ok::<_, Infallible>(full(StatusCode::CREATED, "made"))
            }
        })
    };
    let svc = tower::ServiceBuilder::new()
        .layer(layer(&engine))
        .service(svc);
    let send = |chunks: &[&'static str]| {
        let frames = chunks
            .iter()
            .map(|c| Ok(Frame::data(Bytes::from_static(c.as_bytes()))))
            .collect();
        Request::post("/orders")
            .header("idempotency-key", "\"m\"")
            .body(Frames(frames).boxed())
            .unwrap()
    };
    let first = svc
        .clone()
        .oneshot(send(&["ab", "cd", "ef"]))
        .await
        .unwrap();
    let _ = first.into_body().collect().await.unwrap();
    let again = svc.clone().oneshot(send(&["abcdef"])).await.unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let other = svc.oneshot(send(&["abc", "deg"])).await.unwrap();
    assert_eq!(other.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// The preset refuses the failure policies that would run a request without its record:
/// a completed request would run a second time while Redis stalls.
#[test]
fn the_preset_refuses_to_run_without_its_record() {
    use tower_lock::BackendFailurePolicy;
    for policy in [
        BackendFailurePolicy::FailOpen,
        BackendFailurePolicy::Degrade,
    ] {
        let built = IdempotencyLayer::builder(LockEngine::in_memory())
            .unscoped()
            .on_backend_failure(policy)
            .build();
        let err = built.map(|_| ()).expect_err("refused");
        assert_eq!(err, ConfigError::IdempotencyFailurePolicy(policy));
        assert!(err.to_string().contains("twice"), "{policy:?}: {err}");
    }
    // Fail-closed (the default) builds.
    IdempotencyLayer::builder(LockEngine::in_memory())
        .unscoped()
        .on_backend_failure(BackendFailurePolicy::FailClosed)
        .build()
        .unwrap();
}

/// A per-tenant lock inside the preset answers `423 Locked` while another request holds
/// the tenant: that answer is not stored, so once the tenant is free the same idempotency
/// key runs.
#[tokio::test]
async fn an_inner_lock_layers_423_is_not_stored() {
    let engine = LockEngine::in_memory();
    let runs = Arc::new(AtomicUsize::new(0));
    let svc = {
        let runs = runs.clone();
        service_fn(move |_req: Request<RequestBody<Full<Bytes>>>| {
            runs.fetch_add(1, Ordering::SeqCst);
            async move { Ok::<_, Infallible>(full(StatusCode::CREATED, "made")) }
        })
    };
    let per_tenant = LockLayer::builder(engine.clone())
        .key(tower_lock::key::HeaderKey::new(
            http::HeaderName::from_static("x-tenant"),
        ))
        .build()
        .unwrap();
    let svc = tower::ServiceBuilder::new()
        .layer(layer(&engine))
        .layer(per_tenant.clone())
        .service(svc);
    let tenant_key = per_tenant.locker().key_for("acme").unwrap();
    let held = engine.lock(tenant_key.as_str()).acquire().await.unwrap();
    let req = || {
        let mut r = request("t-423");
        r.headers_mut()
            .insert("x-tenant", http::HeaderValue::from_static("acme"));
        r
    };
    let locked = svc.clone().oneshot(req()).await.unwrap();
    assert_eq!(locked.status(), StatusCode::LOCKED);
    drop(locked);
    held.release().await.unwrap();
    let res = svc.oneshot(req()).await.unwrap();
    assert_eq!(
        res.status(),
        StatusCode::CREATED,
        "the stored 423 was replayed"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Header names are given as text (or as either `http` version's `HeaderName`): the
/// replayed header, the fingerprinted headers and the key header; an invalid one is a
/// typed error from `build`.
#[tokio::test]
async fn header_names_given_as_text_name_the_replayed_fingerprinted_and_key_headers() {
    let layer = IdempotencyLayer::builder(LockEngine::in_memory())
        .unscoped()
        .key_header("X-Request-Key")
        .replayed_header("X-Replayed")
        .fingerprint_headers(["API-Version"])
        .build()
        .unwrap();
    let svc = tower::ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(
            |_req: Request<RequestBody<Full<Bytes>>>| async {
                Ok::<_, Infallible>(full(StatusCode::CREATED, "made"))
            },
        ));
    let req = |version: &'static str| {
        Request::post("/orders")
            .header("x-request-key", "\"t-names\"")
            .header("api-version", version)
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap()
    };
    let first = svc.clone().oneshot(req("1")).await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    first.into_body().collect().await.unwrap();
    let retry = svc.clone().oneshot(req("1")).await.unwrap();
    assert_eq!(retry.headers()["x-replayed"], "true");
    let other_version = svc.oneshot(req("2")).await.unwrap();
    assert_eq!(other_version.status(), StatusCode::UNPROCESSABLE_ENTITY);

    for (option, builder) in [
        (
            "replayed_header",
            IdempotencyLayer::builder(LockEngine::in_memory()).replayed_header("x replayed"),
        ),
        (
            "fingerprint_headers",
            IdempotencyLayer::builder(LockEngine::in_memory())
                .fingerprint_headers(["api-version", "x replayed"]),
        ),
        (
            "key_header",
            IdempotencyLayer::builder(LockEngine::in_memory()).key_header("x replayed"),
        ),
    ] {
        let err = builder.unscoped().build().unwrap_err();
        assert_eq!(
            err,
            ConfigError::InvalidHeaderName {
                option,
                name: "x replayed".to_owned()
            }
        );
    }
}

/// A gRPC-Web frame: its flag (`0x80` for the trailers), its length, its bytes.
fn grpc_web_frame(flag: u8, payload: &[u8]) -> Bytes {
    let mut frame = vec![flag];
    frame.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_be_bytes());
    frame.extend_from_slice(payload);
    Bytes::from(frame)
}

/// A gRPC-Web response (HTTP `200`, `application/grpc-web+proto`) carries its status in a
/// trailer frame inside its body, which the layer does not read: it is not stored (the
/// retry runs, as for a "try again", whatever the frame said), rather than judged by its
/// HTTP `200` and its `UNAVAILABLE` replayed for the whole retention. A trailers-only
/// gRPC-Web answer, whose status is in its head, is judged by it as a gRPC one is.
#[tokio::test]
async fn a_grpc_web_response_is_judged_by_a_status_the_layer_can_read() {
    for (in_head, status, stored) in [
        (None, "14", false),
        (None, "0", false),
        (Some("14"), "14", false),
        (Some("0"), "0", true),
    ] {
        let engine = LockEngine::in_memory();
        let runs = Arc::new(AtomicUsize::new(0));
        let svc = {
            let runs = runs.clone();
            service_fn(move |_req: Req| {
                runs.fetch_add(1, Ordering::SeqCst);
                async move {
                    let mut res = match in_head {
                        // Messages, then the status in a trailer frame.
                        None => Response::new(
                            Full::new(
                                [
                                    grpc_web_frame(0, b"created"),
                                    grpc_web_frame(
                                        0x80,
                                        format!("grpc-status:{status}\r\n").as_bytes(),
                                    ),
                                ]
                                .concat()
                                .into(),
                            )
                            .map_err(|never| match never {})
                            .boxed(),
                        ),
                        Some(code) => {
                            let mut res = full(StatusCode::OK, "");
                            res.headers_mut()
                                .insert("grpc-status", code.parse().unwrap());
                            res
                        }
                    };
                    res.headers_mut().insert(
                        "content-type",
                        "application/grpc-web+proto".parse().unwrap(),
                    );
                    Ok::<_, Infallible>(res)
                }
            })
        };
        let svc = tower::ServiceBuilder::new()
            .layer(layer(&engine))
            .service(svc);
        let first = svc.clone().oneshot(request("w")).await.unwrap();
        first.into_body().collect().await.unwrap();
        let retry = svc.oneshot(request("w")).await.unwrap();
        let case = format!("status {status}, in the head: {}", in_head.is_some());
        assert_eq!(retry.status(), StatusCode::OK, "{case}");
        if stored {
            assert_eq!(retry.headers()["idempotent-replayed"], "true", "{case}");
            assert_eq!(runs.load(Ordering::SeqCst), 1, "{case}: never run twice");
        } else {
            assert_eq!(runs.load(Ordering::SeqCst), 2, "{case}: the retry ran");
            assert_eq!(engine.record(&lock_key("w")).await.unwrap(), None, "{case}");
        }
    }
}
