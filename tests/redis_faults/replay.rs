//! Idempotency replay on Redis under faults: a holder process killed with SIGKILL, a
//! Redis restart, a damaged record, a completion whose connection is killed. Each test owns its redis-server.
#![cfg(feature = "redis")]

use std::{
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use http::StatusCode;
use tokio::time::{Instant, sleep};
use tower_lock::{
    IdempotencyLayer, LockEngine, LockKey,
    engine::{Record, redis::RedisBackend},
};
use tower_lock_test_support::serial;
use tower_lock_test_support::{
    http::{TestServer, serve},
    redis::{RedisServer, engine as redis_engine},
    scenarios::{Backend, Framework, ReplayApp, Stack, idempotency_lock_key, replay_app},
};

/// Set in a child process started by [`spawn_holder`].
const CHILD: &str = "TOWER_LOCK_REPLAY_CHILD";

fn layer(engine: LockEngine) -> IdempotencyLayer {
    IdempotencyLayer::builder(engine)
        .unscoped()
        .ttl(Duration::from_secs(1))
        .build()
        .unwrap()
}

/// `POST /orders` under `layer`: counts its runs, answers `201`; `hang` makes it never
/// answer.
fn app(layer: IdempotencyLayer, runs: Arc<AtomicUsize>, hang: bool) -> axum::Router {
    axum::Router::new()
        .route(
            "/orders",
            axum::routing::post(move || {
                let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                async move {
                    if hang {
                        std::future::pending::<()>().await;
                    }
                    (StatusCode::CREATED, format!("order {n}"))
                }
            }),
        )
        .layer(layer)
}

async fn order(server: &TestServer, k: &str) -> tower_lock_test_support::http::Reply {
    server
        .send_body(
            "POST",
            "/orders",
            &[("idempotency-key", format!("\"{k}\"").as_str())],
            "{}",
        )
        .await
}

fn spawn_holder(server: &RedisServer, prefix: &str, port: u16) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            // libtest names a test by its module path, without the crate's name.
            &format!(
                "{}::child_process_entry",
                module_path!().split_once("::").unwrap().1
            ),
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env("TOWER_LOCK_TEST_REDIS", server.url())
        .env("TOWER_LOCK_TEST_PREFIX", prefix)
        .env("TOWER_LOCK_TEST_PORT", port.to_string())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn child test process")
}

/// The entry point of the child process: serves the replay app (with a handler that
/// never answers) on the given port until it is killed. In the parent run it checks
/// nothing and returns.
#[tokio::test]
async fn child_process_entry() {
    if std::env::var(CHILD).is_err() {
        return;
    }
    let url = std::env::var("TOWER_LOCK_TEST_REDIS").unwrap();
    let prefix = std::env::var("TOWER_LOCK_TEST_PREFIX").unwrap();
    let port: u16 = std::env::var("TOWER_LOCK_TEST_PORT")
        .unwrap()
        .parse()
        .unwrap();
    let backend = RedisBackend::builder(url)
        .prefix(prefix)
        .build()
        .await
        .unwrap();
    let app = app(layer(LockEngine::new(backend)), Arc::default(), true);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    axum::serve(listener, app).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_killed_with_sigkill_lets_the_retry_run_after_its_ttl() {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    let engine = redis_engine(&server, "killed", None).await;
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut child = spawn_holder(&server, "killed", port);
    // The first request reaches the child's handler, which holds the key and hangs.
    let first = tokio::spawn(async move {
        let give_up = Instant::now() + Duration::from_secs(20);
        loop {
            let req = "POST /orders HTTP/1.1\r\nhost: x\r\nidempotency-key: \"o1\"\r\ncontent-length: 2\r\n\r\n{}";
            if let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                s.write_all(req.as_bytes()).await.unwrap();
                let mut buf = [0u8; 64];
                // Until the child dies.
                let _ = s.read(&mut buf).await;
                return;
            }
            assert!(Instant::now() < give_up, "the child never listened");
            sleep(Duration::from_millis(20)).await;
        }
    });
    let key = LockKey::new(idempotency_lock_key("o1")).unwrap();
    let lock = engine.lock_on(key.clone());
    let give_up = Instant::now() + Duration::from_secs(20);
    while !lock.locked().await.unwrap() {
        assert!(Instant::now() < give_up, "the child never took the key");
        sleep(Duration::from_millis(5)).await;
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let killed = Instant::now();
    first.await.unwrap();

    let runs = Arc::new(AtomicUsize::new(0));
    let here = serve(app(layer(engine.clone()), runs.clone(), false)).await;
    // While the dead holder's lease lasts, a retry is told the request is in flight.
    let retry = order(&here, "o1").await;
    assert_eq!(retry.status, StatusCode::CONFLICT, "{}", retry.text());
    // Within its TTL (1 s) the lease is gone and the retry runs: at least once.
    let ran = loop {
        let retry = order(&here, "o1").await;
        if retry.status == StatusCode::CREATED {
            break retry;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(5),
            "still {}",
            retry.status
        );
        sleep(Duration::from_millis(50)).await;
    };
    assert!(
        killed.elapsed() <= Duration::from_millis(1500),
        "{:?}",
        killed.elapsed()
    );
    assert_eq!(ran.text(), "order 1");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // And it is replayed from now on: once its completion (stored after the response went
    // out, in the step that frees the key) has landed; until then a retry is `409`.
    assert!(until_completed(&engine, &key).await.is_some());
    let again = order(&here, "o1").await;
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_loses_records_and_a_damaged_record_is_never_served() {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    let engine = redis_engine(&server, "restart", None).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let here = serve(app(layer(engine.clone()), runs.clone(), false)).await;
    let first = order(&here, "o2").await;
    assert_eq!(first.text(), "order 1");
    let key = LockKey::new(idempotency_lock_key("o2")).unwrap();
    let give_up = Instant::now() + Duration::from_secs(10);
    while engine.record(&key).await.unwrap().is_none() {
        assert!(Instant::now() < give_up);
        sleep(Duration::from_millis(2)).await;
    }
    let replay = order(&here, "o2").await;
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));

    // A restart without persistence loses the record: the retry runs again (documented).
    server.restart();
    let give_up = Instant::now() + Duration::from_secs(20);
    let after = loop {
        let reply = order(&here, "o2").await;
        if reply.status != StatusCode::SERVICE_UNAVAILABLE {
            break reply;
        }
        assert!(Instant::now() < give_up, "the backend never came back");
        sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(after.text(), "order 2");
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // A record hash missing fields (not one the engine wrote) is refused, never replayed.
    let names = server.scan("restart:*");
    let rec = names
        .iter()
        .find(|n| n.contains("}:rec:") && n.ends_with("/idempotency-key/o2"))
        .expect("the record of o2");
    assert_eq!(server.cli(["HDEL", rec, "body"]), "1");
    let damaged = order(&here, "o2").await;
    assert_eq!(
        damaged.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        damaged.text()
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2, "not run again either");
}

/// The ids of the server's clients whose `EVALSHA` is held back by `CLIENT PAUSE`.
fn paused_scripts(server: &RedisServer) -> Vec<String> {
    server
        .cli(["CLIENT", "LIST", "TYPE", "normal"])
        .lines()
        .filter(|l| l.contains(" flags=b ") && l.contains(" cmd=evalsha "))
        .filter_map(|l| l.strip_prefix("id=")?.split(' ').next().map(str::to_owned))
        .collect()
}

/// Sends `POST /slow` with key `k` and returns once its handler is inside, held at the
/// gate.
async fn slow_order_inside(
    app: &mut ReplayApp,
    k: &str,
) -> tokio::task::JoinHandle<tower_lock_test_support::http::Reply> {
    let server = app.server.clone();
    let header = format!("\"{k}\"");
    let first = tokio::spawn(async move {
        server
            .send_body(
                "POST",
                "/slow",
                &[("idempotency-key", header.as_str())],
                "{}",
            )
            .await
    });
    app.control.arrived().await;
    first
}

/// Until the record of `key` is stored (`Some`), or the key is free without one (`None`),
/// or 5 s passed (panics, naming what was seen). A read that fails is asked again: the
/// test's own calls share the pool whose connections it kills, and one of them may meet a
/// killed connection before the client has read its close.
async fn until_completed(engine: &LockEngine, key: &LockKey) -> Option<Record> {
    let give_up = Instant::now() + Duration::from_secs(5);
    loop {
        match engine.record(key).await {
            Ok(Some(record)) => return Some(record),
            Ok(None) => {
                // Free: the record is there now, or never will be (completing writes it
                // and frees the key in one step, maybe just after the read above).
                if let Ok(false) = engine.lock_on(key.clone()).locked().await
                    && let Ok(record) = engine.record(key).await
                {
                    return record;
                }
            }
            Err(_) => {}
        }
        assert!(
            Instant::now() < give_up,
            "5 s after the handler answered, the key is still held and nothing is stored"
        );
        sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_whose_connection_is_killed_is_retried_and_stored() {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    // A command timeout long enough for the test to kill the connection mid-call.
    let engine = redis_engine(&server, "complete", Some(Duration::from_secs(3))).await;
    let layer = IdempotencyLayer::builder(engine.clone())
        .unscoped()
        .ttl(Duration::from_secs(30))
        .build()
        .unwrap();
    let mut app = replay_app(Stack::new(Framework::Tower, Backend::Redis), layer).await;

    // 1. The pooled connections are killed while the handler runs (an idle timeout, a
    //    proxy reset): the completion meets a dead connection before anything is sent.
    let first = slow_order_inside(&mut app, "c1").await;
    tokio::task::block_in_place(|| server.cli(["CLIENT", "KILL", "TYPE", "normal"]));
    app.control.let_one();
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    let key = LockKey::new(idempotency_lock_key("c1")).unwrap();
    assert!(
        until_completed(&engine, &key).await.is_some(),
        "the key was released without its record"
    );
    let retry = app
        .server
        .send_body("POST", "/slow", &[("idempotency-key", "\"c1\"")], "{}")
        .await;
    assert_eq!(retry.status, StatusCode::CREATED, "{}", retry.text());
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);

    // 2. The connection is killed with the completion on the wire, before the server ran
    //    it (the server holds writes back with `CLIENT PAUSE WRITE`; the test kills the
    //    client whose script waits, then lets the server go on).
    let first = slow_order_inside(&mut app, "c2").await;
    tokio::task::block_in_place(|| server.cli(["CLIENT", "PAUSE", "10000", "WRITE"]));
    app.control.let_one();
    let give_up = Instant::now() + Duration::from_secs(5);
    let paused = loop {
        let paused = tokio::task::block_in_place(|| paused_scripts(&server));
        if !paused.is_empty() {
            break paused;
        }
        assert!(
            Instant::now() < give_up,
            "the completion never reached the server"
        );
        sleep(Duration::from_millis(5)).await;
    };
    tokio::task::block_in_place(|| {
        for id in &paused {
            server.cli(["CLIENT", "KILL", "ID", id]);
        }
        server.cli(["CLIENT", "UNPAUSE"]);
    });
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    let key = LockKey::new(idempotency_lock_key("c2")).unwrap();
    assert!(
        until_completed(&engine, &key).await.is_some(),
        "the key was released without its record"
    );
    let retry = app
        .server
        .send_body("POST", "/slow", &[("idempotency-key", "\"c2\"")], "{}")
        .await;
    assert_eq!(retry.status, StatusCode::CREATED, "{}", retry.text());
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(app.runs.load(Ordering::SeqCst), 2, "each request ran once");
}

/// A TCP proxy to `upstream` on a port of its own. While `cut` is set, the next chunk of
/// replies the server sends on any connection is dropped and that connection closed (the
/// flag then clears): a command that ran on the server whose reply never arrives.
async fn reply_cutting_proxy(upstream: u16, cut: Arc<std::sync::atomic::AtomicBool>) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut client, _)) = listener.accept().await else {
                return;
            };
            let cut = cut.clone();
            tokio::spawn(async move {
                let Ok(mut server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                else {
                    return;
                };
                let (mut from_client, mut to_client) = client.split();
                let (mut from_server, mut to_server) = server.split();
                let up = tokio::io::copy(&mut from_client, &mut to_server);
                let down = async {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = from_server.read(&mut buf).await?;
                        if n == 0 || cut.swap(false, Ordering::SeqCst) {
                            return Ok::<_, std::io::Error>(());
                        }
                        to_client.write_all(&buf[..n]).await?;
                    }
                };
                // Either side ending closes both.
                tokio::select! {
                    _ = up => {}
                    _ = down => {}
                }
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_that_landed_but_lost_its_reply_counts_as_done() {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let port = reply_cutting_proxy(server.port(), cut.clone()).await;
    let engine = LockEngine::new(
        RedisBackend::builder(format!("redis://127.0.0.1:{port}"))
            .prefix("landed")
            .build()
            .await
            .unwrap(),
    );
    let key = LockKey::new("k").unwrap();
    let lease = engine.lock_on(key.clone()).acquire().await.unwrap();
    let record = Record::new(
        bytes::Bytes::from_static(b"fingerprint"),
        bytes::Bytes::from_static(b"meta"),
        bytes::Bytes::from_static(b"body"),
    );
    // The completion runs on the server (record written, key released); its reply is lost
    // with its connection.
    cut.store(true, Ordering::SeqCst);
    let completed = lease
        .complete(record.clone(), Duration::from_secs(60))
        .await;
    assert!(
        !cut.load(Ordering::SeqCst),
        "the proxy never cut a reply: the test did not test"
    );
    assert!(
        completed.is_ok(),
        "a completion that landed is reported as {completed:?}"
    );
    let stored = engine.record(&key).await.unwrap().expect("the record");
    assert_eq!(stored.body, record.body);
    assert!(!engine.lock_on(key).locked().await.unwrap());
}

/// A completion lost to a Redis outage (the server gone while the handler ran) is counted
/// in `discarded` (`tower_lock_replay_discarded_total`), so it can be alerted on, not only
/// logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_lost_to_an_outage_is_counted() {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    let engine = redis_engine(&server, "outage", Some(Duration::from_millis(300))).await;
    let layer = IdempotencyLayer::builder(engine.clone())
        .unscoped()
        .ttl(Duration::from_secs(1))
        .build()
        .unwrap();
    let metrics = layer.metrics();
    let mut app = replay_app(Stack::new(Framework::Tower, Backend::Redis), layer).await;
    let first = slow_order_inside(&mut app, "o1").await;
    tokio::task::block_in_place(|| server.kill());
    app.control.let_one();
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    let give_up = Instant::now() + Duration::from_secs(10);
    while metrics.snapshot().discarded == 0 {
        assert!(
            Instant::now() < give_up,
            "10 s after the handler answered into an outage, no lost completion was counted"
        );
        sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(metrics.snapshot().discarded, 1);
}
