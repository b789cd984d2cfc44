//! A database restart and a pooler restart under load: four clients post payments through
//! a PgBouncer in transaction mode (`server_login_retry = 1`) in front of a Postgres of the
//! test's own, each retrying a key until it is answered `201`, while the database is
//! crashed and started again, then the pooler is stopped at once (`SIGTERM`, every
//! connection cut) and started again. What it can affect: every request in flight (its
//! claim, its handler's statements, its record write and `COMMIT`) and the pool's
//! connections. Each answer is a success, a replay, or a clear status (`503` with the
//! layer's `retry_after_fallback` as `Retry-After`, or the handler's own answer to its
//! statement that failed; `409` with `Retry-After` for a retry that met its
//! predecessor's transaction before the server ended it); nothing hangs;
//! afterwards every key has its record and exactly one row.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use http::StatusCode;
use tower_lock::sqlx::{self, Row};
use tower_lock_test_support::{
    http::{TestServer, serve},
    postgres::{PgBouncer, PostgresServer},
};

use crate::app::{Db, Gate, post, router};

const CLIENTS: usize = 4;

/// Keys answered `201` after each event before the next.
const BETWEEN: usize = 8;

/// What the clients saw: `201`s fresh and replayed, `503`s, `409`s.
#[derive(Default)]
struct Seen {
    done: AtomicUsize,
    replayed: AtomicUsize,
    unavailable: AtomicUsize,
    conflict: AtomicUsize,
}

/// Posts keys `c<client>-<n>` one after another, each until it is answered `201`, until
/// `stop`; the keys answered.
async fn client(
    app: Arc<TestServer>,
    client: usize,
    seen: Arc<Seen>,
    stop: Arc<AtomicBool>,
) -> usize {
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        let key = format!("c{client}-{n}");
        loop {
            let reply = tokio::time::timeout(Duration::from_secs(15), post(&app, &key, "ok", &key))
                .await
                .unwrap_or_else(|_| panic!("{key}: no answer within 15 s"));
            match reply.status {
                StatusCode::CREATED => {
                    if reply.header("idempotent-replayed").is_some() {
                        seen.replayed.fetch_add(1, Ordering::Relaxed);
                    }
                    break;
                }
                // The layer's (its statement failed: the connection, the server), or the
                // handler's own answer to its insert that failed.
                StatusCode::SERVICE_UNAVAILABLE => {
                    let handlers = reply
                        .header("content-type")
                        .is_some_and(|t| t.starts_with("text/plain"));
                    assert!(
                        handlers || reply.header("retry-after") == Some("2"),
                        "{key}: {:?} {}",
                        reply.headers,
                        reply.text()
                    );
                    seen.unavailable.fetch_add(1, Ordering::Relaxed);
                }
                StatusCode::CONFLICT => {
                    assert!(
                        reply.header("retry-after").is_some(),
                        "{key}: {}",
                        reply.text()
                    );
                    seen.conflict.fetch_add(1, Ordering::Relaxed);
                }
                status => panic!("{key}: {status} {}", reply.text()),
            }
            // The client's back-off before it retries.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        seen.done.fetch_add(1, Ordering::Relaxed);
        n += 1;
    }
    n
}

/// Waits until `BETWEEN` more keys than `from` were answered; the count.
async fn progress(seen: &Seen, from: usize) -> usize {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let done = seen.done.load(Ordering::Relaxed);
        if done >= from + BETWEEN {
            return done;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "stuck at {done} keys"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_load_a_database_and_a_pooler_restart_leave_every_key_answered_once() {
    let (server, bouncer) = tokio::task::spawn_blocking(|| {
        let server = Arc::new(PostgresServer::start());
        let bouncer = Arc::new(PgBouncer::start(&server));
        (server, bouncer)
    })
    .await
    .unwrap();
    let db = Db::new(&bouncer.url(), "restarts").await;
    let layer = db
        .layer(|b| {
            b.wait(Duration::from_secs(5))
                .retry_after_fallback(Duration::from_secs(2))
        })
        .await;
    let app = Arc::new(serve(router(&db, layer, Gate::new().0)).await);
    let seen = Arc::new(Seen::default());
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            tokio::spawn(client(
                Arc::clone(&app),
                c,
                Arc::clone(&seen),
                Arc::clone(&stop),
            ))
        })
        .collect();
    let done = progress(&seen, 0).await;
    // A clone: the last `Arc` of the server, dropped, would stop it for good.
    let restarting = Arc::clone(&server);
    tokio::task::spawn_blocking(move || restarting.restart())
        .await
        .unwrap();
    let done = progress(&seen, done).await;
    let restarting = Arc::clone(&bouncer);
    tokio::task::spawn_blocking(move || restarting.restart("-TERM"))
        .await
        .unwrap();
    progress(&seen, done).await;
    stop.store(true, Ordering::Relaxed);
    let mut keys = 0;
    for client in clients {
        keys += client.await.unwrap();
    }
    let row = sqlx::raw_sql(&format!(
        "SELECT count(*), count(DISTINCT note) FROM {}.payments",
        db.schema
    ))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let (rows, notes): (i64, i64) = (row.get(0), row.get(1));
    let seen = format!(
        "{keys} keys; {} replayed, {} 503, {} 409",
        seen.replayed.load(Ordering::Relaxed),
        seen.unavailable.load(Ordering::Relaxed),
        seen.conflict.load(Ordering::Relaxed)
    );
    assert_eq!((rows, notes), (keys as i64, keys as i64), "{seen}");
    assert_eq!(db.records().await, keys as i64, "{seen}");
}
