//! Permits over real sockets, under the tower layer in axum and under the actix middleware
//! (two workers): `permits(n)` admits N requests per key and never more, `shared_for`
//! runs reads side by side and each write alone, a waiting writer goes before readers that
//! came after it, and contention is answered `423`/`429` as for the lock. On every backend
//! with permits.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use actix_web::{App, HttpRequest, web};
use axum::{Router, extract::Request, routing::any};
use http::StatusCode;
use tokio::task::JoinHandle;
use tower_lock::{LeaseInfo, LockLayer};
use tower_lock_actix::{LockMiddleware, Locked};
use tower_lock_test_support::{
    gate::{Gate, GateControl, gate},
    http::{Reply, TestServer, serve, serve_actix},
    occupancy::Occupancy,
    scenarios::{Backend, Framework, LockTable, Stack, assert_problem, bounded, lock_key},
};

/// How many rounds each concurrent case runs.
const ROUNDS: usize = 15;

/// A long wait: a request that waits is granted, never timed out.
const WAIT: Duration = Duration::from_secs(20);

/// What the handlers of a test app do: visit the occupancy of their key (exclusive for
/// any method but `GET` when `shared_for_get`), or, with an `x-seq` header, wait at the
/// gate reporting it.
struct Probe {
    shared_for_get: bool,
    limit: usize,
    keys: Mutex<HashMap<String, Arc<Occupancy>>>,
    gate: Gate,
}

impl Probe {
    fn new(shared_for_get: bool, limit: usize) -> (Arc<Self>, GateControl) {
        let (gate, control) = gate();
        let probe = Self {
            shared_for_get,
            limit,
            keys: Mutex::default(),
            gate,
        };
        (Arc::new(probe), control)
    }

    fn occupancy(&self, key: &str) -> Arc<Occupancy> {
        let mut keys = self.keys.lock().unwrap();
        keys.entry(key.to_owned())
            .or_insert_with(|| Occupancy::new(self.limit))
            .clone()
    }

    async fn handle(&self, method: &str, header: impl Fn(&str) -> Option<String>) -> String {
        if let Some(seq) = header("x-seq") {
            let _inside = self.gate.pass(seq).await;
            return String::new();
        }
        let key = header("x-key").unwrap();
        let hold = header("x-hold").map_or(0, |h| h.parse().unwrap());
        let exclusive = self.shared_for_get && method != "GET";
        self.occupancy(&key).visit(exclusive, hold).await;
        String::new()
    }
}

/// Serve `layer` on `/doc` (every method) on `framework`, handled by `probe`.
async fn serve_probe(
    framework: Framework,
    layer: &LockLayer,
    probe: &Arc<Probe>,
) -> Arc<TestServer> {
    let probe = probe.clone();
    Arc::new(match framework {
        Framework::Tower => {
            let handler = move |req: Request| {
                let probe = probe.clone();
                async move {
                    assert!(
                        req.extensions().get::<LeaseInfo>().is_some(),
                        "ran unlocked"
                    );
                    let headers = req.headers().clone();
                    let header =
                        |name: &str| headers.get(name).map(|v| v.to_str().unwrap().to_owned());
                    probe.handle(req.method().as_str(), header).await
                }
            };
            serve(
                Router::new()
                    .route("/doc", any(handler))
                    .route_layer(layer.clone()),
            )
            .await
        }
        Framework::Actix => {
            let lock = LockMiddleware::try_from(layer).expect("no principal scope");
            serve_actix(2, move || {
                let probe = probe.clone();
                let handler = move |req: HttpRequest, lease: Option<Locked>| {
                    let probe = probe.clone();
                    async move {
                        assert!(lease.is_some(), "ran unlocked");
                        let header = |name: &str| {
                            let value = req.headers().get(name)?;
                            Some(value.to_str().unwrap().to_owned())
                        };
                        probe.handle(req.method().as_str(), header).await
                    }
                };
                App::new().service(
                    web::resource("/doc")
                        .wrap(lock.clone())
                        .default_service(web::to(handler)),
                )
            })
        }
    })
}

fn spawn_send(
    server: &Arc<TestServer>,
    method: &'static str,
    key: &str,
    extra: &[(&'static str, &'static str)],
) -> JoinHandle<Reply> {
    let server = server.clone();
    let key = key.to_owned();
    let extra = extra.to_vec();
    tokio::spawn(async move {
        let mut headers = vec![("x-key", key.as_str())];
        headers.extend(extra);
        server.send(method, "/doc", &headers).await
    })
}

async fn all_ok(sent: impl IntoIterator<Item = JoinHandle<Reply>>) {
    for sent in sent {
        let reply = sent.await.unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    }
}

/// Wait until every permit of `key` is free, then check that the table kept nothing.
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
async fn until_waiting(table: &LockTable, key: &str, n: usize) {
    let permits = table.engine().lock(key).shared(1);
    tokio::time::timeout(Duration::from_secs(10), async {
        // The engine offers no event for "a waiter queued"; look again shortly.
        while permits.waiters().await.unwrap() < n {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{n} waiters on {key} within 10 s"));
}

async fn permits_admit_n_requests_per_key_at_once_and_never_more(
    framework: Framework,
    backend: Backend,
) {
    let table = Stack::new(framework, backend)
        .table("sockets-permits-n")
        .await;
    let layer = table.layer().permits(3).wait(WAIT).build().unwrap();
    let (probe, _control) = Probe::new(false, 3);
    let server = serve_probe(framework, &layer, &probe).await;
    for round in 0..ROUNDS {
        let key = format!("n-{round}");
        let sent: Vec<_> = (0..8)
            .map(|_| spawn_send(&server, "POST", &key, &[("x-hold", "3")]))
            .collect();
        all_ok(sent).await;
        let occupancy = probe.occupancy(&key);
        occupancy.assert_kept();
        assert_eq!(occupancy.most_shared(), 3, "round {round}");
        assert_nothing_left(&table, &lock_key(&key)).await;
    }
}

async fn shared_for_runs_reads_side_by_side_and_each_write_alone(
    framework: Framework,
    backend: Backend,
) {
    let table = Stack::new(framework, backend)
        .table("sockets-shared-for")
        .await;
    let layer = table
        .layer()
        .shared_for(["GET"])
        .wait(WAIT)
        .build()
        .unwrap();
    let (probe, _control) = Probe::new(true, usize::MAX);
    let server = serve_probe(framework, &layer, &probe).await;
    for round in 0..ROUNDS {
        let key = format!("rw-{round}");
        let occupancy = probe.occupancy(&key);
        let readers: Vec<_> = (0..3)
            .map(|_| spawn_send(&server, "GET", &key, &[("x-hold", "3")]))
            .collect();
        occupancy.reached(3).await;
        let mixed: Vec<_> = (0..12)
            .map(|i| spawn_send(&server, if i % 3 == 0 { "PUT" } else { "GET" }, &key, &[]))
            .collect();
        all_ok(readers.into_iter().chain(mixed)).await;
        occupancy.assert_kept();
        assert_eq!(occupancy.exclusive_visits(), 4);
        assert_nothing_left(&table, &lock_key(&key)).await;
    }
}

async fn a_waiting_writer_goes_before_readers_that_came_after_it(
    framework: Framework,
    backend: Backend,
) {
    let table = Stack::new(framework, backend)
        .table("sockets-writer-first")
        .await;
    let layer = table
        .layer()
        .shared_for(["GET"])
        .wait(WAIT)
        .build()
        .unwrap();
    let (probe, mut control) = Probe::new(true, usize::MAX);
    let server = serve_probe(framework, &layer, &probe).await;
    let lock = lock_key("doc");
    let r1 = spawn_send(&server, "GET", "doc", &[("x-seq", "r1")]);
    assert_eq!(control.arrived().await, "r1");
    let r2 = spawn_send(&server, "GET", "doc", &[("x-seq", "r2")]);
    assert_eq!(control.arrived().await, "r2");
    let w = spawn_send(&server, "PUT", "doc", &[("x-seq", "w")]);
    until_waiting(&table, &lock, 1).await;
    let r3 = spawn_send(&server, "GET", "doc", &[("x-seq", "r3")]);
    until_waiting(&table, &lock, 2).await;
    assert_eq!(
        control.try_arrived(),
        None,
        "a later reader overtook the writer"
    );
    control.let_one();
    control.let_one();
    assert_eq!(control.arrived().await, "w");
    assert_eq!(control.inside(), 1, "the writer is alone");
    control.let_one();
    assert_eq!(control.arrived().await, "r3");
    control.open();
    all_ok([r1, r2, w, r3]).await;
    assert_nothing_left(&table, &lock).await;
}

async fn contention_is_answered_423_at_once_or_429_when_the_queue_is_full(
    framework: Framework,
    backend: Backend,
) {
    let table = Stack::new(framework, backend)
        .table("sockets-permits-contention")
        .await;
    let (probe, mut control) = Probe::new(true, usize::MAX);
    // No wait: a reader beside a reader, a writer 423.
    let rw = table.layer().shared_for(["GET"]).build().unwrap();
    let server = serve_probe(framework, &rw, &probe).await;
    let r1 = spawn_send(&server, "GET", "doc", &[("x-seq", "r1")]);
    assert_eq!(control.arrived().await, "r1");
    let r2 = spawn_send(&server, "GET", "doc", &[("x-seq", "r2")]);
    assert_eq!(control.arrived().await, "r2");
    let refused = spawn_send(&server, "PUT", "doc", &[("x-seq", "w")])
        .await
        .unwrap();
    assert_problem(&refused, StatusCode::LOCKED, "locked");
    // Room for one waiter: the next request is answered 429 at once.
    let one = table
        .layer()
        .namespace("one")
        .permits(1)
        .wait(WAIT)
        .max_waiters(1)
        .build()
        .unwrap();
    let server_one = serve_probe(framework, &one, &probe).await;
    let held = spawn_send(&server_one, "POST", "q", &[("x-seq", "held")]);
    assert_eq!(control.arrived().await, "held");
    let waiting = spawn_send(&server_one, "POST", "q", &[("x-seq", "waiting")]);
    let q = tower_lock::key::encode("one", "header=x-key", "q");
    until_waiting(&table, &q, 1).await;
    let refused = spawn_send(&server_one, "POST", "q", &[("x-seq", "third")])
        .await
        .unwrap();
    assert_problem(&refused, StatusCode::TOO_MANY_REQUESTS, "too-many-waiters");
    control.open();
    all_ok([r1, r2, held, waiting]).await;
    assert_nothing_left(&table, &lock_key("doc")).await;
    assert_nothing_left(&table, &q).await;
}

/// Instantiate the cases above on one framework and backend.
macro_rules! permit_cases {
    ($framework:ident, $backend:ident; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                bounded(super::$case(Framework::$framework, Backend::$backend)).await;
            }
        )*
    };
}

macro_rules! every_case {
    ($framework:ident, $backend:ident) => {
        permit_cases!($framework, $backend;
            permits_admit_n_requests_per_key_at_once_and_never_more,
            shared_for_runs_reads_side_by_side_and_each_write_alone,
            a_waiting_writer_goes_before_readers_that_came_after_it,
            contention_is_answered_423_at_once_or_429_when_the_queue_is_full,
        );
    };
}

mod axum_in_process {
    use super::*;
    every_case!(Tower, InProcess);
}

mod actix_in_process {
    use super::*;
    every_case!(Actix, InProcess);
}

#[cfg(feature = "redis")]
mod axum_redis {
    use super::*;
    every_case!(Tower, Redis);
}

#[cfg(feature = "redis")]
mod actix_redis {
    use super::*;
    every_case!(Actix, Redis);
}

/// `permits(n)` without `methods([..])` limits every method but `OPTIONS` and `TRACE`: a
/// `GET` export under `permits(1)` takes its permit (its handler sees the lease), where
/// the lock's default (safe methods pass unlocked) would have let it through unlimited.
/// Under axum and actix, over real sockets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_on_a_get_endpoint_limit_it_without_a_method_filter() {
    let layer = LockLayer::builder(tower_lock::LockEngine::in_memory())
        .key(tower_lock::key::GlobalKey::new("export"))
        .permits(1)
        .build()
        .unwrap();
    let axum = serve(
        Router::new()
            .route(
                "/export",
                any(|req: Request| async move {
                    if req.extensions().get::<LeaseInfo>().is_some() {
                        "limited"
                    } else {
                        "unlimited"
                    }
                }),
            )
            .route_layer(layer.clone()),
    )
    .await;
    let actix_layer: LockMiddleware = layer.try_into().unwrap();
    let actix = serve_actix(1, move || {
        App::new().service(
            web::resource("/export")
                .wrap(actix_layer.clone())
                .route(web::get().to(|lease: Option<Locked>| async move {
                    if lease.is_some() {
                        "limited"
                    } else {
                        "unlimited"
                    }
                }))
                .route(web::method(http_02_options()).to(|| async { "preflight" })),
        )
    });
    assert_eq!(axum.send("GET", "/export", &[]).await.text(), "limited");
    assert_eq!(actix.send("GET", "/export", &[]).await.text(), "limited");
    // A CORS preflight never takes a permit.
    assert_eq!(
        axum.send("OPTIONS", "/export", &[]).await.text(),
        "unlimited"
    );
    assert_eq!(
        actix.send("OPTIONS", "/export", &[]).await.text(),
        "preflight"
    );
}

fn http_02_options() -> actix_web::http::Method {
    actix_web::http::Method::OPTIONS
}

#[cfg(feature = "postgres")]
mod axum_postgres {
    use super::*;
    every_case!(Tower, Postgres);
}

#[cfg(feature = "postgres")]
mod actix_postgres {
    use super::*;
    every_case!(Actix, Postgres);
}
