//! A completion that Redis refuses for a while (`-BUSY` while a script runs, `-READONLY`
//! while the server is a replica): it is not lost. The lease stays under watch and the
//! completion is sent again, with backoff, until it is stored (a retry then gets the
//! replay, the handler having run once) or the lease has run out (then it is "not stored",
//! counted, and a retry runs again). Each test owns its redis-server.
#![cfg(feature = "redis")]

use std::{sync::atomic::Ordering, time::Duration};

use http::StatusCode;
use tower_lock::{IdempotencyLayer, LockEngine, LockKey, engine::Record};
use tower_lock_test_support::{
    http::TestServer,
    redis::{RedisServer, engine as redis_engine},
    scenarios::{Backend, Framework, Stack, idempotency_lock_key, replay_app},
    serial,
};
use tracing_subscriber::prelude::*;

/// An idempotency layer on `engine` whose duplicates wait up to 5 s for the first request
/// (then get its replay), with lease length `ttl`.
fn layer(engine: LockEngine, ttl: Duration) -> IdempotencyLayer {
    IdempotencyLayer::builder(engine)
        .unscoped()
        .ttl(ttl)
        .wait(Duration::from_secs(5))
        .build()
        .unwrap()
}

async fn slow(server: &TestServer, k: &str) -> tower_lock_test_support::http::Reply {
    let header = format!("\"{k}\"");
    server
        .send_body(
            "POST",
            "/slow",
            &[("idempotency-key", header.as_str())],
            "{}",
        )
        .await
}

/// How many commands the server has refused with `code` so far (`INFO errorstats`).
fn refused(server: &RedisServer, code: &str) -> u64 {
    let info = server.cli(["INFO", "errorstats"]);
    let prefix = format!("errorstat_{code}:count=");
    info.lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix(prefix.as_str())?
                .split(',')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// The request's handler answers while the server refuses everything with `-BUSY` for
/// 1.5 s, longer than the lease's first renewal interval (1 s of a 3 s lease): the
/// completion is refused, sent again until the server takes it, and stored. A duplicate
/// sent meanwhile waits and gets the replay; the handler ran once.
async fn a_completion_refused_with_busy_is_stored_once_the_server_takes_it(framework: Framework) {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    let engine = redis_engine(&server, "busy", None).await;
    let mut app = replay_app(
        Stack::new(framework, Backend::Redis),
        layer(engine.clone(), Duration::from_secs(3)),
    )
    .await;
    let first = {
        let server = app.server.clone();
        tokio::spawn(async move {
            server
                .send_body("POST", "/slow", &[("idempotency-key", "\"b1\"")], "{}")
                .await
        })
    };
    app.control.arrived().await;
    let busy = tokio::task::block_in_place(|| server.busy(Duration::from_millis(1500)));
    let before = tokio::task::block_in_place(|| refused(&server, "BUSY"));
    app.control.let_one();
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text());
    tokio::task::block_in_place(|| busy.join().unwrap());
    // The server answers again; the completion may still be on its way: a duplicate waits
    // for the key, then gets the replay. (Should it run again, it finds the gate open.)
    app.control.open();
    let retry = slow(&app.server, "b1").await;
    assert!(
        tokio::task::block_in_place(|| refused(&server, "BUSY")) > before,
        "nothing was refused: the test did not test"
    );
    assert_eq!(
        retry.status,
        StatusCode::CREATED,
        "the retry after a refused completion: {}",
        retry.text()
    );
    assert_eq!(
        retry.header("idempotent-replayed"),
        Some("true"),
        "the retry ran the request again ({} runs) instead of getting its replay",
        app.runs.load(Ordering::SeqCst)
    );
    assert_eq!(retry.text(), first.text());
    assert_eq!(app.runs.load(Ordering::SeqCst), 1, "the handler ran again");
    let key = LockKey::new(idempotency_lock_key("b1")).unwrap();
    assert!(!engine.lock_on(key).locked().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_refused_with_busy_is_stored_once_the_server_takes_it_on_tower() {
    a_completion_refused_with_busy_is_stored_once_the_server_takes_it(Framework::Tower).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_refused_with_busy_is_stored_once_the_server_takes_it_on_actix() {
    a_completion_refused_with_busy_is_stored_once_the_server_takes_it(Framework::Actix).await;
}

/// The server refuses for longer than the lease can last (2.5 s against a 1 s lease that
/// is never renewed meanwhile): the completion gives up once the lease's validity has run
/// out, the response is not stored (counted as discarded), and once the server answers
/// again the key has expired and a retry runs the request again. Run in a child process
/// (see [`not_stored_child`]), whose log this checks: it says what happened, and never
/// that the key was released.
fn a_completion_refused_past_its_lease_is_not_stored(framework: &str) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            &format!(
                "{}::not_stored_child",
                module_path!().split_once("::").unwrap().1
            ),
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, framework)
        .output()
        .expect("run the child test process");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let logs: Vec<&str> = stdout
        .lines()
        .filter_map(|l| Some(l.split_once("log: ")?.1))
        .collect();
    assert!(
        logs.iter().any(
            |l| l.contains("refused to store the response until the lease ran out")
                && l.contains("not stored")
                && l.contains("the key was not released")
        ),
        "no log says what happened: {logs:#?}"
    );
    assert!(
        !logs.iter().any(|l| l.contains("the key is released")),
        "a log claims a release that did not happen: {logs:#?}"
    );
    assert!(
        out.status.success(),
        "the child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_refused_past_its_lease_is_not_stored_on_tower() {
    let _group = serial::group(module_path!()).await;
    tokio::task::block_in_place(|| a_completion_refused_past_its_lease_is_not_stored("tower"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_refused_past_its_lease_is_not_stored_on_actix() {
    let _group = serial::group(module_path!()).await;
    tokio::task::block_in_place(|| a_completion_refused_past_its_lease_is_not_stored("actix"));
}

/// Set (to the framework) in the child process of
/// [`a_completion_refused_past_its_lease_is_not_stored`].
const CHILD: &str = "TOWER_LOCK_REFUSAL_CHILD";

/// The child process: the scenario under a subscriber of its own, which prints the
/// warnings of tower-lock as `log: ...` lines. In the parent run it checks nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_stored_child() {
    let Ok(framework) = std::env::var(CHILD) else {
        return;
    };
    let framework = match framework.as_str() {
        "tower" => Framework::Tower,
        _ => Framework::Actix,
    };
    tracing_subscriber::registry()
        .with(PrintWarnings)
        .try_init()
        .expect("the child's own subscriber");
    let server = RedisServer::start();
    let engine = redis_engine(&server, "gone", None).await;
    let layer = layer(engine.clone(), Duration::from_secs(1));
    let metrics = layer.metrics();
    let mut app = replay_app(Stack::new(framework, Backend::Redis), layer).await;
    let first = {
        let server = app.server.clone();
        tokio::spawn(async move { slow(&server, "g1").await })
    };
    app.control.arrived().await;
    let busy = tokio::task::block_in_place(|| server.busy(Duration::from_millis(2500)));
    app.control.let_one();
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    tokio::task::block_in_place(|| busy.join().unwrap());
    let key = LockKey::new(idempotency_lock_key("g1")).unwrap();
    assert!(
        !engine.lock_on(key.clone()).locked().await.unwrap(),
        "the lease outlived its TTL"
    );
    // The completion gave up at the lease's deadline, inside the refusal.
    assert_eq!(
        metrics.snapshot().discarded,
        1,
        "a response lost to a lease that ran out is counted as discarded"
    );
    assert!(engine.record(&key).await.unwrap().is_none());
    app.control.open();
    let retry = slow(&app.server, "g1").await;
    assert_eq!(retry.status, StatusCode::CREATED, "{}", retry.text());
    assert_eq!(retry.header("idempotent-replayed"), None);
    assert_eq!(app.runs.load(Ordering::SeqCst), 2);
}

/// Prints each warning of tower-lock's own modules as one `log: ` line: its message and
/// its other fields.
struct PrintWarnings;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for PrintWarnings {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let meta = event.metadata();
        if *meta.level() > tracing::Level::WARN || !meta.target().starts_with("tower_lock") {
            return;
        }
        struct Line(String);
        impl tracing::field::Visit for Line {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0.push_str(&format!(" {}={value:?}", field.name()));
            }
        }
        let mut line = Line(String::new());
        event.record(&mut line);
        println!("log:{}", line.0);
    }
}

/// The engine's own [`Lease::complete`](tower_lock::engine::Lease::complete), on a server
/// demoted to a replica of a primary that is nowhere until it is promoted back: it refuses
/// every write with `-READONLY` or, told not to serve stale data, every script with
/// `-MASTERDOWN` (`code`). The completion is stored and the key released.
async fn a_completion_refused_by_a_replica_is_stored_once_it_is_a_primary_again(code: &str) {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    let engine = redis_engine(&server, "replica", None).await;
    let key = LockKey::new("k").unwrap();
    let lease = engine.lock_on(key.clone()).acquire().await.unwrap();
    let nowhere = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    tokio::task::block_in_place(|| {
        if code == "MASTERDOWN" {
            server.cli(["CONFIG", "SET", "replica-serve-stale-data", "no"]);
        }
        server.cli(["REPLICAOF", "127.0.0.1", &nowhere]);
    });
    let record = Record::new(
        bytes::Bytes::from_static(b"fingerprint"),
        bytes::Bytes::from_static(b"meta"),
        bytes::Bytes::from_static(b"body"),
    );
    let complete = tokio::spawn(lease.complete(record.clone(), Duration::from_secs(60)));
    // Until the server has refused it at least once.
    while tokio::task::block_in_place(|| refused(&server, code)) == 0 {
        assert!(
            !complete.is_finished(),
            "the completion ended while refused: {:?}",
            complete.await
        );
        tokio::task::yield_now().await;
    }
    tokio::task::block_in_place(|| server.cli(["REPLICAOF", "NO", "ONE"]));
    let completed = complete.await.unwrap();
    assert!(completed.is_ok(), "{completed:?}");
    let stored = engine.record(&key).await.unwrap().expect("the record");
    assert_eq!(stored.body, record.body);
    assert!(!engine.lock_on(key).locked().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_refused_with_readonly_is_stored_once_the_server_is_a_primary_again() {
    a_completion_refused_by_a_replica_is_stored_once_it_is_a_primary_again("READONLY").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_refused_with_masterdown_is_stored_once_the_server_is_a_primary_again() {
    a_completion_refused_by_a_replica_is_stored_once_it_is_a_primary_again("MASTERDOWN").await;
}

/// A renewal the server refuses because it is busy running a script is not a lost lease:
/// nobody can be granted anything while the script runs, and the key keeps its TTL. The
/// renewal is tried again within the lease's confirmed validity and lands once the script
/// ends, so the lease outlives its first TTL, unlost, and another node still finds the
/// key held. (Any other failed renewal loses the lease at once: `lost_on_reset`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_refused_while_the_server_is_busy_keeps_the_lease() {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    let holder = redis_engine(&server, "busy-renewal", None).await;
    let other = redis_engine(&server, "busy-renewal", None).await;
    let ttl = Duration::from_secs(3);
    let lease = holder.lock("k").ttl(ttl).acquire().await.unwrap();
    let first_expiry = tokio::time::Instant::now() + ttl;
    // Busy across the first renewal (due a third into the lease).
    let busy = server.busy(Duration::from_millis(1600));
    tokio::task::spawn_blocking(move || busy.join().unwrap())
        .await
        .unwrap();
    assert!(refused(&server, "BUSY") > 0, "the server refused nothing");
    // Past the lease's first TTL: had the refused renewal lost it, the key is free now.
    let lost = lease.lost();
    tokio::select! {
        _ = lost => panic!("a renewal refused while the server was busy lost the lease"),
        _ = tokio::time::sleep_until(first_expiry + Duration::from_millis(500)) => {}
    }
    assert!(!lease.is_lost());
    let taken = other.lock("k").try_acquire().await;
    assert!(
        taken.is_err(),
        "another node took the key of a live lease: {taken:?}"
    );
    assert!(
        lease.owned().await.unwrap(),
        "the lease is no longer the key's holder"
    );
    lease.release().await.unwrap();
}
