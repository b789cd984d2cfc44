//! Permits at the tower level: `permits(n)` admits N requests per key and never more,
//! `shared_for([..])` runs readers side by side and each writer alone, a plain lock layer
//! on the same key excludes them too, a waiting writer is not overtaken by later readers, and contention is answered as for the lock. Each case
//! runs on a multi-threaded runtime, many rounds, on every backend with permits.

use std::{convert::Infallible, sync::Arc, time::Duration};

use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use tokio::task::JoinHandle;
use tower::{ServiceExt, service_fn, util::BoxCloneService};
use tower_lock::{
    ConfigError, IdempotencyLayer, LeaseInfo, LockEngine, LockLayer, LockLayerBuilder, LockedBody,
};
use tower_lock_test_support::{
    gate::{Gate, GateControl, gate},
    occupancy::Occupancy,
    scenarios::{Backend, LockTable, bounded, header_key, lock_key},
};

type Service = BoxCloneService<Request<String>, Response<LockedBody<String>>, Infallible>;

/// How many rounds each concurrent case runs.
const ROUNDS: usize = 30;

/// A long wait: a request that waits is granted, never timed out, unless the case says.
const WAIT: Duration = Duration::from_secs(20);

/// `layer` around a handler that visits `occupancy` while it holds its permit: exclusive
/// for any method but `GET` when `shared_for_get`, shared otherwise; staying until the
/// request's `x-hold` shared holders have been inside at once.
fn occupied(layer: &LockLayer, occupancy: &Arc<Occupancy>, shared_for_get: bool) -> Service {
    let occupancy = occupancy.clone();
    let handler = service_fn(move |req: Request<String>| {
        let occupancy = occupancy.clone();
        async move {
            assert!(
                req.extensions().get::<LeaseInfo>().is_some(),
                "ran unlocked"
            );
            let exclusive = shared_for_get && req.method() != Method::GET;
            let hold = header_usize(&req, "x-hold");
            occupancy.visit(exclusive, hold).await;
            Ok::<_, Infallible>(Response::new(String::new()))
        }
    });
    BoxCloneService::new(
        tower::ServiceBuilder::new()
            .layer(layer.clone())
            .service(handler),
    )
}

/// `layer` around a handler that waits at `gate`, reporting the request's `x-seq`.
fn gated(layer: &LockLayer, gate: &Gate) -> Service {
    let gate = gate.clone();
    let handler = service_fn(move |req: Request<String>| {
        let gate = gate.clone();
        async move {
            let seq = req.headers()["x-seq"].to_str().unwrap().to_owned();
            let _inside = gate.pass(seq).await;
            Ok::<_, Infallible>(Response::new(String::new()))
        }
    });
    BoxCloneService::new(
        tower::ServiceBuilder::new()
            .layer(layer.clone())
            .service(handler),
    )
}

fn header_usize(req: &Request<String>, name: &str) -> usize {
    req.headers()
        .get(name)
        .map_or(0, |v| v.to_str().unwrap().parse().unwrap())
}

fn request(method: Method, key: &str, headers: &[(&str, &str)]) -> Request<String> {
    let mut req = Request::builder()
        .method(method)
        .uri("/doc")
        .header("x-key", key);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.body(String::new()).unwrap()
}

/// Send one request through `service` and read its body (which releases its permit).
fn spawn_send(
    service: &Service,
    method: Method,
    key: &str,
    headers: &[(&str, &str)],
) -> JoinHandle<(StatusCode, Response<LockedBody<String>>)> {
    let req = request(method, key, headers);
    let service = service.clone();
    tokio::spawn(async move {
        let res = service.oneshot(req).await.unwrap();
        (res.status(), res)
    })
}

/// The status of a response, once its body has been read to the end.
async fn finish(sent: JoinHandle<(StatusCode, Response<LockedBody<String>>)>) -> StatusCode {
    let (status, res) = sent.await.unwrap();
    res.into_body().collect().await.unwrap();
    status
}

fn builder(table: &LockTable) -> LockLayerBuilder {
    table.layer().wait(WAIT)
}

/// Wait until every permit of `key` is free (releases still in flight included), then
/// check that the table kept nothing.
async fn assert_nothing_left(table: &LockTable, key: &str) {
    table
        .engine()
        .lock(key)
        .shared(1)
        .shared(1)
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap_or_else(|e| panic!("{key} is free within 5 s: {e}"))
        .release()
        .await
        .unwrap();
    table.assert_no_residue(&[]).await;
}

/// Wait until `n` requests wait for a permit of `key`.
async fn until_waiting(engine: &LockEngine, key: &str, n: usize) {
    let permits = engine.lock(key).shared(1);
    tokio::time::timeout(Duration::from_secs(10), async {
        // The engine offers no event for "a waiter queued"; look again shortly.
        while permits.waiters().await.unwrap() < n {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{n} waiters on {key} within 10 s"));
}

pub(crate) async fn permits_admit_n_requests_per_key_at_once_and_never_more(backend: Backend) {
    let table = backend.table("permits-admit-n").await;
    let layer = builder(&table).permits(3).build().unwrap();
    for round in 0..ROUNDS {
        let key = format!("n-{round}");
        let occupancy = Occupancy::new(3);
        let service = occupied(&layer, &occupancy, false);
        // Eight at once: the first three stay until all three are inside together, which
        // never happens unless three are admitted; the others wait their turn.
        let sent: Vec<_> = (0..8)
            .map(|_| spawn_send(&service, Method::POST, &key, &[("x-hold", "3")]))
            .collect();
        for sent in sent {
            assert_eq!(finish(sent).await, StatusCode::OK);
        }
        occupancy.assert_kept();
        assert_eq!(occupancy.most_shared(), 3, "round {round}");
        assert_nothing_left(&table, &lock_key(&key)).await;
    }
    let snap = layer.metrics().snapshot();
    assert_eq!((snap.shared_permits, snap.exclusive_permits), (0, 0));
}

pub(crate) async fn shared_for_runs_reads_side_by_side_and_each_write_alone(backend: Backend) {
    let table = backend.table("shared-for").await;
    let layer = builder(&table).shared_for(["GET"]).build().unwrap();
    for round in 0..ROUNDS {
        let key = format!("rw-{round}");
        let occupancy = Occupancy::new(usize::MAX);
        let service = occupied(&layer, &occupancy, true);
        // Three readers that stay until all three are inside together...
        let readers: Vec<_> = (0..3)
            .map(|_| spawn_send(&service, Method::GET, &key, &[("x-hold", "3")]))
            .collect();
        occupancy.reached(3).await;
        // ...then readers and writers mixed, all at once.
        let mixed: Vec<_> = (0..12)
            .map(|i| {
                let method = if i % 3 == 0 { Method::PUT } else { Method::GET };
                spawn_send(&service, method, &key, &[])
            })
            .collect();
        for sent in readers.into_iter().chain(mixed) {
            assert_eq!(finish(sent).await, StatusCode::OK);
        }
        occupancy.assert_kept();
        assert!(occupancy.most_shared() >= 3, "round {round}");
        assert_eq!(occupancy.exclusive_visits(), 4);
        assert_nothing_left(&table, &lock_key(&key)).await;
    }
}

pub(crate) async fn permits_with_shared_for_bound_the_readers_and_keep_writers_alone(
    backend: Backend,
) {
    let table = backend.table("permits-shared-for").await;
    let layer = builder(&table)
        .permits(2)
        .shared_for(["GET"])
        .build()
        .unwrap();
    for round in 0..ROUNDS {
        let key = format!("bounded-{round}");
        let occupancy = Occupancy::new(2);
        let service = occupied(&layer, &occupancy, true);
        let readers: Vec<_> = (0..2)
            .map(|_| spawn_send(&service, Method::GET, &key, &[("x-hold", "2")]))
            .collect();
        occupancy.reached(2).await;
        let mixed: Vec<_> = (0..12)
            .map(|i| {
                let method = if i % 4 == 0 {
                    Method::DELETE
                } else {
                    Method::GET
                };
                spawn_send(&service, method, &key, &[])
            })
            .collect();
        for sent in readers.into_iter().chain(mixed) {
            assert_eq!(finish(sent).await, StatusCode::OK);
        }
        occupancy.assert_kept();
        assert_eq!(occupancy.most_shared(), 2, "round {round}");
        assert_nothing_left(&table, &lock_key(&key)).await;
    }
}

/// A plain `LockLayer` on writes and a `shared_for` layer on reads of the same key: one
/// key, one queue, so a write never runs beside a read (issue 51: in process it did, 9
/// times in 12 requests).
pub(crate) async fn a_lock_layer_and_a_shared_for_layer_on_one_key_exclude_each_other(
    backend: Backend,
) {
    let table = backend.table("lock-beside-shared").await;
    let writes = builder(&table).build().unwrap();
    let reads = builder(&table).shared_for(["GET"]).build().unwrap();
    for round in 0..ROUNDS {
        let key = format!("both-{round}");
        let occupancy = Occupancy::new(usize::MAX);
        let (writer, reader) = (
            occupied(&writes, &occupancy, true),
            occupied(&reads, &occupancy, true),
        );
        let readers: Vec<_> = (0..3)
            .map(|_| spawn_send(&reader, Method::GET, &key, &[("x-hold", "3")]))
            .collect();
        occupancy.reached(3).await;
        let mixed: Vec<_> = (0..12)
            .map(|i| match i % 3 {
                0 => spawn_send(&writer, Method::POST, &key, &[]),
                _ => spawn_send(&reader, Method::GET, &key, &[]),
            })
            .collect();
        for sent in readers.into_iter().chain(mixed) {
            assert_eq!(finish(sent).await, StatusCode::OK);
        }
        occupancy.assert_kept();
        assert_eq!(occupancy.exclusive_visits(), 4);
        assert_nothing_left(&table, &lock_key(&key)).await;
    }
}

/// The label of the next request to arrive at the gate.
async fn next_arrival(control: &mut GateControl) -> String {
    control.arrived().await
}

pub(crate) async fn a_waiting_writer_goes_before_readers_that_came_after_it(backend: Backend) {
    let table = backend.table("writer-first").await;
    let engine = table.engine();
    let layer = builder(&table).shared_for(["GET"]).build().unwrap();
    for round in 0..ROUNDS / 3 {
        let key = format!("starve-{round}");
        let lock = lock_key(&key);
        let (gate, mut control) = gate();
        let service = gated(&layer, &gate);
        // A reader holds the key...
        let r1 = spawn_send(&service, Method::GET, &key, &[("x-seq", "r1")]);
        assert_eq!(next_arrival(&mut control).await, "r1");
        // ...a second reader joins it: readers share...
        let r2 = spawn_send(&service, Method::GET, &key, &[("x-seq", "r2")]);
        assert_eq!(next_arrival(&mut control).await, "r2");
        // ...a writer arrives and waits for them...
        let w = spawn_send(&service, Method::PUT, &key, &[("x-seq", "w")]);
        until_waiting(&engine, &lock, 1).await;
        // ...and readers arriving after it queue behind it, however many readers hold.
        let later: Vec<_> = ["r3", "r4"]
            .iter()
            .map(|seq| spawn_send(&service, Method::GET, &key, &[("x-seq", seq)]))
            .collect();
        until_waiting(&engine, &lock, 3).await;
        assert_eq!(
            control.try_arrived(),
            None,
            "a later reader overtook the writer"
        );
        control.let_one();
        control.let_one();
        assert_eq!(next_arrival(&mut control).await, "w", "round {round}");
        assert_eq!(control.inside(), 1, "the writer is alone");
        control.let_one();
        let mut after = vec![
            next_arrival(&mut control).await,
            next_arrival(&mut control).await,
        ];
        after.sort();
        assert_eq!(after, ["r3", "r4"]);
        control.open();
        for sent in [r1, r2, w].into_iter().chain(later) {
            assert_eq!(finish(sent).await, StatusCode::OK);
        }
        assert_nothing_left(&table, &lock).await;
    }
}

pub(crate) async fn contention_is_answered_423_at_once_or_429_when_the_queue_is_full(
    backend: Backend,
) {
    let table = backend.table("permits-contention").await;
    let (gate, mut control) = gate();

    // No wait: the third request for two permits is answered 423 at once.
    let two = table.layer().permits(2).build().unwrap();
    let service = gated(&two, &gate);
    let a = spawn_send(&service, Method::POST, "k", &[("x-seq", "a")]);
    let b = spawn_send(&service, Method::POST, "k", &[("x-seq", "b")]);
    control.arrived().await;
    control.arrived().await;
    let (status, res) = spawn_send(&service, Method::POST, "k", &[("x-seq", "c")])
        .await
        .unwrap();
    assert_eq!(status, StatusCode::LOCKED);
    assert!(res.headers().contains_key("retry-after"));
    drop(res);

    // No wait, shared_for: a reader beside the readers, a writer 423.
    let rw = table.layer().shared_for(["GET"]).build().unwrap();
    let service_rw = gated(&rw, &gate);
    let r = spawn_send(&service_rw, Method::GET, "doc", &[("x-seq", "r")]);
    assert_eq!(control.arrived().await, "r");
    let r2 = spawn_send(&service_rw, Method::GET, "doc", &[("x-seq", "r2")]);
    assert_eq!(control.arrived().await, "r2");
    let (status, res) = spawn_send(&service_rw, Method::PUT, "doc", &[("x-seq", "w")])
        .await
        .unwrap();
    assert_eq!(status, StatusCode::LOCKED);
    assert!(res.headers().contains_key("retry-after"));
    drop(res);
    let snap = rw.metrics().snapshot();
    assert_eq!((snap.shared_permits, snap.exclusive_permits), (2, 0));

    // A wait with room for one waiter: the next is answered 429 at once.
    let one = table
        .layer()
        .permits(1)
        .wait(WAIT)
        .max_waiters(1)
        .build()
        .unwrap();
    let service_one = gated(&one, &gate);
    let held = spawn_send(&service_one, Method::POST, "q", &[("x-seq", "held")]);
    assert_eq!(control.arrived().await, "held");
    let waiting = spawn_send(&service_one, Method::POST, "q", &[("x-seq", "waiting")]);
    until_waiting(&table.engine(), &lock_key("q"), 1).await;
    let (status, res) = spawn_send(&service_one, Method::POST, "q", &[("x-seq", "third")])
        .await
        .unwrap();
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(res.headers().contains_key("retry-after"));
    drop(res);

    control.open();
    for sent in [a, b, r, r2, held, waiting] {
        assert_eq!(finish(sent).await, StatusCode::OK);
    }
    let snap = rw.metrics().snapshot();
    assert_eq!((snap.shared_permits, snap.exclusive_permits), (0, 0));
    assert_eq!(snap.rejected.locked, 1);
    assert_eq!(one.metrics().snapshot().rejected.queue_full, 1);
    for key in ["k", "doc", "q"] {
        assert_nothing_left(&table, &lock_key(key)).await;
    }
}

/// Under the degrade policy a Redis that is down leaves the node's own permits: n at once
/// per key on this node, the next one `423`.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn degraded_permits_still_admit_n_per_key_on_the_node() {
    let redis = Arc::new(tower_lock_test_support::redis::RedisServer::start());
    let timeout = Some(Duration::from_millis(200));
    let table = LockTable::on_redis(redis.clone(), "permits-degrade", timeout).await;
    let layer = table
        .layer()
        .permits(2)
        .on_backend_failure(tower_lock::BackendFailurePolicy::Degrade)
        .build()
        .unwrap();
    tokio::task::block_in_place(|| redis.kill());
    let (gate, mut control) = gate();
    let service = gated(&layer, &gate);
    let a = spawn_send(&service, Method::POST, "k", &[("x-seq", "a")]);
    let b = spawn_send(&service, Method::POST, "k", &[("x-seq", "b")]);
    control.arrived().await;
    control.arrived().await;
    assert_eq!(layer.metrics().snapshot().shared_permits, 2);
    let (status, _) = spawn_send(&service, Method::POST, "k", &[("x-seq", "c")])
        .await
        .unwrap();
    assert_eq!(status, StatusCode::LOCKED);
    control.open();
    for sent in [a, b] {
        assert_eq!(finish(sent).await, StatusCode::OK);
    }
    assert_eq!(layer.metrics().snapshot().degraded, 2);
}

/// Instantiate the cases above on one backend, each on a multi-threaded runtime.
macro_rules! permit_cases {
    ($backend:ident; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                bounded(super::$case(Backend::$backend)).await;
            }
        )*
    };
}

macro_rules! every_case {
    ($backend:ident) => {
        permit_cases!($backend;
            permits_admit_n_requests_per_key_at_once_and_never_more,
            shared_for_runs_reads_side_by_side_and_each_write_alone,
            permits_with_shared_for_bound_the_readers_and_keep_writers_alone,
            a_lock_layer_and_a_shared_for_layer_on_one_key_exclude_each_other,
            a_waiting_writer_goes_before_readers_that_came_after_it,
            contention_is_answered_423_at_once_or_429_when_the_queue_is_full,
        );
    };
}

mod in_process {
    use super::*;
    every_case!(InProcess);
}

#[cfg(feature = "redis")]
mod redis {
    use super::*;
    every_case!(Redis);
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    every_case!(Postgres);
}

#[test]
fn shared_methods_are_locked_even_where_the_default_leaves_them_unlocked() {
    let engine = LockEngine::in_memory();
    let plain = LockLayer::builder(engine.clone())
        .key(header_key())
        .build()
        .unwrap();
    assert!(!plain.locker().locks_method("GET"));
    let rw = LockLayer::builder(engine.clone())
        .key(header_key())
        .shared_for([Method::GET, Method::HEAD])
        .build()
        .unwrap();
    for method in ["GET", "HEAD", "POST", "PUT", "DELETE"] {
        assert!(rw.locker().locks_method(method), "{method}");
    }
    assert!(!rw.locker().locks_method("OPTIONS"));
    // Named beside `methods`, they are added to it.
    let listed = LockLayer::builder(engine)
        .key(header_key())
        .methods(["PUT"])
        .shared_for(["GET"])
        .build()
        .unwrap();
    assert!(listed.locker().locks_method("GET") && listed.locker().locks_method("PUT"));
    assert!(!listed.locker().locks_method("POST"));
}

#[test]
fn zero_permits_an_empty_shared_list_and_permits_under_idempotency_are_refused() {
    let engine = LockEngine::in_memory();
    let layer = || LockLayer::builder(engine.clone()).key(header_key());
    assert_eq!(
        layer().permits(0).build().unwrap_err(),
        ConfigError::ZeroPermits
    );
    let none: [&str; 0] = [];
    assert_eq!(
        layer().shared_for(none).build().unwrap_err(),
        ConfigError::NoSharedMethods
    );
    assert_eq!(
        layer().shared_for(["get"]).build().unwrap_err(),
        ConfigError::InvalidMethod("get".to_owned())
    );
    // A backend without permits is refused by `build()`, not answered 503 per request.
    let bare = LockEngine::new(tower_lock_test_support::unavailable::UnavailableBackend);
    for built in [
        LockLayer::builder(bare.clone())
            .key(header_key())
            .permits(2)
            .build(),
        LockLayer::builder(bare)
            .key(header_key())
            .shared_for(["GET"])
            .build(),
    ] {
        assert_eq!(built.unwrap_err(), ConfigError::PermitsUnsupported);
    }
    let idempotency = || IdempotencyLayer::builder(engine.clone()).without_replay();
    assert_eq!(
        idempotency().permits(2).build().unwrap_err(),
        ConfigError::IdempotencyPermits
    );
    assert_eq!(
        idempotency().shared_for(["POST"]).build().unwrap_err(),
        ConfigError::IdempotencyPermits
    );
}
