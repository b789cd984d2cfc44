//! A request dropped while the layer's last statement is in flight (a client that left, a
//! `tower::timeout` around the layer): its connection never goes back to the pool in a
//! transaction state nobody knows, and its key's record says what happened to its rows.

use std::time::Duration;

use http::StatusCode;
use tower::ServiceExt;
use tower_lock::sqlx::{self, Connection, PgConnection, Row, postgres::PgPoolOptions};
use tower_lock_test_support::http::serve;

use crate::app::{Db, Gate, post, router, shared_url};

/// The advisory lock (two-key form, apart from the layer's one-key locks) the records
/// table's test trigger waits for.
const GATE: &str = "7, 70707";

/// Waits until a backend waits for the advisory lock [`GATE`] in a statement on `db`'s
/// schema.
async fn until_blocked_on_the_gate(db: &Db) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let waiting: i64 = sqlx::query(
            "SELECT count(*) FROM pg_stat_activity
             WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'
               AND strpos(query, $1) > 0",
        )
        .persistent(false)
        .bind(format!("{}.", db.schema))
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_dropped_during_its_commit_leaves_a_clean_connection_in_the_pool() {
    let url = shared_url().await;
    let db = Db::new(&url, "dropped_commit").await;
    // The layer's pool has one connection: the next user gets the dropped request's.
    let one = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(20))
        .connect(&url)
        .await
        .unwrap();
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

    let request = http::Request::post("/payments")
        .header("idempotency-key", "dropped")
        .header("x-outcome", "ok")
        .body(axum::body::Body::from("dropped"))
        .unwrap();
    tokio::select! {
        answer = app.clone().oneshot(request) => {
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

    // The application's own transaction on the pool commits.
    let mut tx = one.begin().await.unwrap();
    sqlx::query(&format!(
        "INSERT INTO {schema}.payments (note) VALUES ('app')"
    ))
    .persistent(false)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        notes(&db, "app").await,
        1,
        "the application's write was not committed"
    );

    // The layer's next request runs, commits and is replayed.
    let server = serve(app).await;
    let fresh = post(&server, "fresh", "ok", "fresh").await;
    assert_eq!(fresh.status, StatusCode::CREATED, "{}", fresh.text());
    assert_eq!(fresh.header("idempotent-replayed"), None);
    let again = post(&server, "fresh", "ok", "fresh").await;
    assert_eq!(again.status, StatusCode::CREATED, "{}", again.text());
    assert_eq!(again.header("idempotent-replayed"), Some("true"));

    // The dropped request committed or not, as the server had it; its retry agrees: it is
    // replayed (its row is there) or runs once.
    let retry = post(&server, "dropped", "ok", "dropped").await;
    assert_eq!(retry.status, StatusCode::CREATED, "{}", retry.text());
    assert_eq!(notes(&db, "dropped").await, 1);
    assert_eq!(notes(&db, "fresh").await, 1);
}
