//! A request whose future is dropped while the layer's commit or rollback is in flight (a
//! client that left, a `tower::timeout` around the layer), on a pool of one connection: the
//! request runs on to the end of that statement on a task of its own, its connection never
//! goes back to the pool in a transaction state nobody knows (the application's next
//! transaction commits, the layer's next request is stored), and the dropped key's retry
//! agrees with what the server did with its rows. So does a savepoint the handler leaked.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use http::StatusCode;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::{Notify, watch},
};
use tower::ServiceExt;
use tower_lock::sqlx::{self, Connection, PgConnection, PgPool, Row, postgres::PgPoolOptions};
use tower_lock_test_support::http::{TestServer, serve};

use crate::app::{Db, Gate, post, router, shared_url};

/// The advisory lock (two-key form, apart from the layer's one-key locks) the records
/// table's test trigger waits for.
const GATE: &str = "7, 70707";

/// Waits until a backend waits for the advisory lock [`GATE`] in a statement of the layer
/// on `db`'s schema (which the layer quotes).
async fn until_blocked_on_the_gate(db: &Db) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let waiting: i64 = sqlx::query(
            "SELECT count(*) FROM pg_stat_activity
             WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'
               AND strpos(query, $1) > 0",
        )
        .persistent(false)
        .bind(format!("\"{}\".", db.schema))
        .fetch_one(&db.pool)
        .await
        .unwrap()
        .get(0);
        if waiting > 0 {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "nothing blocked");
        tokio::task::yield_now().await;
    }
}

/// The rows of `db`'s payments table with `note`, as another connection sees them.
async fn notes(db: &Db, note: &str) -> i64 {
    sqlx::query(&format!(
        "SELECT count(*) FROM {}.payments WHERE note = $1",
        db.schema
    ))
    .persistent(false)
    .bind(note)
    .fetch_one(&db.pool)
    .await
    .unwrap()
    .get(0)
}

/// A pool of one connection on `url`: its next user gets the connection a dropped request
/// had.
async fn one_connection(url: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(20))
        .connect(url)
        .await
        .unwrap()
}

/// The application's own transaction on `pool` inserts a row and commits: another
/// connection sees it.
async fn the_application_commits(db: &Db, pool: &PgPool) {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(&format!(
        "INSERT INTO {}.payments (note) VALUES ('app')",
        db.schema
    ))
    .persistent(false)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        notes(db, "app").await,
        1,
        "the application's write was not committed"
    );
}

/// The layer's next request runs, commits and is replayed.
async fn a_fresh_request_is_stored_and_replayed(server: &TestServer) {
    let fresh = post(server, "fresh", "ok", "fresh").await;
    assert_eq!(fresh.status, StatusCode::CREATED, "{}", fresh.text());
    assert_eq!(fresh.header("idempotent-replayed"), None);
    let again = post(server, "fresh", "ok", "fresh").await;
    assert_eq!(again.status, StatusCode::CREATED, "{}", again.text());
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
}

/// A request of `outcome` with key and body `dropped`.
fn request(outcome: &str) -> http::Request<axum::body::Body> {
    http::Request::post("/payments")
        .header("idempotency-key", "dropped")
        .header("x-outcome", outcome)
        .body(axum::body::Body::from("dropped"))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_dropped_during_its_commit_leaves_a_clean_connection_in_the_pool() {
    let url = shared_url().await;
    let db = Db::new(&url, "dropped_commit").await;
    let one = one_connection(&url).await;
    let layered = Db {
        schema: db.schema.clone(),
        pool: one.clone(),
    };
    let (gate, _entered) = Gate::new();
    let app = router(&db, layered.layer(|b| b).await, gate);
    let schema = &db.schema;
    // The record write (the commit's statement) waits for the test's advisory lock.
    sqlx::raw_sql(&format!(
        "CREATE FUNCTION {schema}.gate() RETURNS trigger LANGUAGE plpgsql AS
           $$ BEGIN PERFORM pg_advisory_xact_lock({GATE}); RETURN NEW; END $$;
         CREATE TRIGGER gate BEFORE UPDATE ON {schema}.tower_lock_idempotency_records
           FOR EACH ROW EXECUTE FUNCTION {schema}.gate()"
    ))
    .execute(&db.pool)
    .await
    .unwrap();
    let mut holder = PgConnection::connect(&url).await.unwrap();
    sqlx::raw_sql(&format!("SELECT pg_advisory_lock({GATE})"))
        .execute(&mut holder)
        .await
        .unwrap();

    tokio::select! {
        answer = app.clone().oneshot(request("ok")) => {
            panic!("the request ended before its commit blocked: {answer:?}")
        }
        () = until_blocked_on_the_gate(&db) => {}
    }

    sqlx::raw_sql(&format!("SELECT pg_advisory_unlock({GATE})"))
        .execute(&mut holder)
        .await
        .unwrap();
    sqlx::raw_sql(&format!(
        "DROP TRIGGER gate ON {schema}.tower_lock_idempotency_records"
    ))
    .execute(&db.pool)
    .await
    .unwrap();

    the_application_commits(&db, &one).await;
    let server = serve(app).await;
    a_fresh_request_is_stored_and_replayed(&server).await;

    // The dropped request committed or not, as the server had it; its retry agrees: it is
    // replayed if its row is there, or runs once.
    let committed = notes(&db, "dropped").await == 1;
    let retry = post(&server, "dropped", "ok", "dropped").await;
    assert_eq!(retry.status, StatusCode::CREATED, "{}", retry.text());
    let replayed = retry.header("idempotent-replayed") == Some("true");
    assert_eq!(replayed, committed);
    assert_eq!(notes(&db, "dropped").await, 1);
    assert_eq!(notes(&db, "fresh").await, 1);
}

/// A TCP relay to the Postgres on port `target` that holds the server's replies on the first
/// connection to send `ROLLBACK`, from then until `release` says so.
struct Relay {
    port: u16,
    /// Notified once that `ROLLBACK` went to the server.
    sent: Arc<Notify>,
    release: watch::Sender<bool>,
}

async fn relay(target: u16) -> Relay {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let sent = Arc::new(Notify::new());
    let (release, released) = watch::channel(false);
    let armed = Arc::new(AtomicBool::new(true));
    let notify = Arc::clone(&sent);
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let server = TcpStream::connect(("127.0.0.1", target)).await.unwrap();
            let (mut from_client, mut to_client) = client.into_split();
            let (mut from_server, mut to_server) = server.into_split();
            let held = Arc::new(AtomicBool::new(false));
            let (armed, notify, hold) = (Arc::clone(&armed), Arc::clone(&notify), held.clone());
            tokio::spawn(async move {
                let mut buf = vec![0; 64 * 1024];
                let mut window = Vec::new();
                while let Ok(n @ 1..) = from_client.read(&mut buf).await {
                    window.extend_from_slice(&buf[..n]);
                    let rollback = window.windows(8).any(|w| w == b"ROLLBACK");
                    window.drain(..window.len().saturating_sub(7));
                    let first = rollback && armed.swap(false, Ordering::AcqRel);
                    // Held before the statement leaves: its reply cannot pass.
                    hold.fetch_or(first, Ordering::AcqRel);
                    if to_server.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    if first {
                        notify.notify_one();
                    }
                }
                let _ = to_server.shutdown().await;
            });
            let mut released = released.clone();
            tokio::spawn(async move {
                let mut buf = vec![0; 64 * 1024];
                while let Ok(n @ 1..) = from_server.read(&mut buf).await {
                    if held.load(Ordering::Acquire) {
                        let _ = released.wait_for(|r| *r).await;
                    }
                    if to_client.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    Relay {
        port,
        sent,
        release,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_dropped_during_its_rollback_leaves_a_clean_connection_in_the_pool() {
    let url = shared_url().await;
    let db = Db::new(&url, "dropped_rollback").await;
    let (head, rest) = url.rsplit_once(':').unwrap();
    let (port, path) = rest.split_once('/').unwrap();
    let relay = relay(port.parse().unwrap()).await;
    let one = one_connection(&format!("{head}:{}/{path}", relay.port)).await;
    let layered = Db {
        schema: db.schema.clone(),
        pool: one.clone(),
    };
    let (gate, _entered) = Gate::new();
    let app = router(&db, layered.layer(|b| b).await, gate);

    // `422` means "it did not happen": the layer rolls back, and the request is dropped
    // while the `ROLLBACK`'s reply is held.
    tokio::select! {
        answer = app.clone().oneshot(request("invalid")) => {
            panic!("the request ended before its rollback was held: {answer:?}")
        }
        () = relay.sent.notified() => {}
    }
    relay.release.send(true).unwrap();

    the_application_commits(&db, &one).await;
    let server = serve(app).await;
    a_fresh_request_is_stored_and_replayed(&server).await;
    // Its rollback was sent: nothing of it stays, and the retry runs.
    let retry = post(&server, "dropped", "ok", "dropped").await;
    assert_eq!(retry.status, StatusCode::CREATED, "{}", retry.text());
    assert_eq!(retry.header("idempotent-replayed"), None);
    assert_eq!(notes(&db, "dropped").await, 1);
}

/// Leaks a `begin()` of its own on the lent connection (a savepoint sqlx still counts),
/// then answers `422`: "it did not happen".
async fn leaks_a_savepoint(mut tx: tower_lock_axum::Tx) -> StatusCode {
    std::mem::forget(Connection::begin(&mut *tx).await.unwrap());
    StatusCode::UNPROCESSABLE_ENTITY
}

/// A rollback ends the layer's transaction whatever the handler left counted on the
/// connection (sqlx's own rollback would only roll back to the leaked savepoint, and leave
/// the request's transaction open on a pooled connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_savepoint_the_handler_leaked_leaves_a_clean_connection_in_the_pool() {
    let url = shared_url().await;
    let db = Db::new(&url, "leaked_savepoint").await;
    let one = one_connection(&url).await;
    let layered = Db {
        schema: db.schema.clone(),
        pool: one.clone(),
    };
    let app = axum::Router::new()
        .route("/payments", axum::routing::post(leaks_a_savepoint))
        .layer(layered.layer(|b| b).await);
    let server = serve(app).await;
    let leaked = post(&server, "k", "ok", "card").await;
    assert_eq!(leaked.status, StatusCode::UNPROCESSABLE_ENTITY);
    the_application_commits(&db, &one).await;
    assert_eq!(db.records().await, 0);
}
