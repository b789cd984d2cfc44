//! A request dropped while its commit (`UPDATE …; COMMIT; BEGIN`, one round trip) is in
//! flight: its client left, or a timeout outside the layer fired. Whatever the server then
//! does with the statement, the connection must not go back to the pool inside a
//! transaction sqlx miscounts: its next user would write through savepoints of a
//! transaction nobody commits, and the layer's next claim on it would fail.

use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt, Full};
use tower::{ServiceExt, service_fn};
use tower_lock::{
    idempotency::{RequestBody, transactional::LentTransaction},
    sqlx::{self, Connection, PgConnection, Row, postgres::PgPoolOptions},
};

use crate::app::{Db, shared_url};

async fn advisory_waiters(db: &Db) -> i64 {
    sqlx::raw_sql(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap()
    .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_dropped_mid_commit_leaves_its_connection_in_no_transaction() {
    let url = shared_url().await;
    let db = Db::new(&url, "dropped_commit").await;
    // The layer's pool: one connection, so the next user of the pool gets the one the
    // dropped request used.
    let single = Db {
        schema: db.schema.clone(),
        pool: PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(20))
            .connect(&url)
            .await
            .unwrap(),
    };
    let layer = single.layer(|b| b).await;
    let schema = db.schema.clone();
    let service = tower::ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(
            move |req: http::Request<RequestBody<Full<Bytes>>>| {
                let schema = schema.clone();
                async move {
                    let key = req.headers()["idempotency-key"]
                        .to_str()
                        .unwrap()
                        .to_owned();
                    let lent = req.extensions().get::<LentTransaction>().unwrap().clone();
                    let mut tx = lent.borrow().await.unwrap();
                    sqlx::query(&format!("INSERT INTO {schema}.payments (note) VALUES ($1)"))
                        .persistent(false)
                        .bind(key)
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                    drop(tx);
                    let mut res = http::Response::new(Full::new(Bytes::from("done")));
                    *res.status_mut() = StatusCode::CREATED;
                    Ok::<_, std::convert::Infallible>(res)
                }
            },
        ));
    let request = |key: &str| {
        http::Request::post("/payments")
            .header("idempotency-key", key)
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let answer = |key: &'static str| {
        let service = service.clone();
        async move {
            let res = service.oneshot(request(key)).await.unwrap();
            let (parts, body) = res.into_parts();
            let body = body.collect().await.unwrap().to_bytes();
            (parts, body)
        }
    };

    // The record write stalls: a trigger takes an advisory lock the test holds.
    let mut holder = PgConnection::connect(&url).await.unwrap();
    sqlx::raw_sql(&format!(
        "CREATE FUNCTION {s}.stall() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN PERFORM pg_advisory_xact_lock(7); RETURN NEW; END $$;
         CREATE TRIGGER stall BEFORE UPDATE ON {s}.tower_lock_idempotency_records
           FOR EACH ROW EXECUTE FUNCTION {s}.stall();
         SELECT pg_advisory_lock(7);",
        s = db.schema
    ))
    .execute(&mut holder)
    .await
    .unwrap();
    {
        let dropped = answer("k1");
        tokio::pin!(dropped);
        let give_up = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            tokio::select! {
                done = &mut dropped => panic!("the commit did not stall: {done:?}"),
                () = tokio::time::sleep(Duration::from_millis(5)) => {}
            }
            if advisory_waiters(&db).await > 0 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < give_up,
                "the commit never stalled"
            );
        }
        // Dropped here, mid-commit.
    }
    sqlx::raw_sql(&format!(
        "SELECT pg_advisory_unlock(7); DROP TRIGGER stall ON {s}.tower_lock_idempotency_records;",
        s = db.schema
    ))
    .execute(&mut holder)
    .await
    .unwrap();

    // The application's own transaction on the layer's pool commits.
    let mut tx = single.pool.begin().await.unwrap();
    sqlx::query(&format!(
        "INSERT INTO {}.payments (note) VALUES ('app')",
        db.schema
    ))
    .persistent(false)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let app_rows: i64 = sqlx::raw_sql(&format!(
        "SELECT count(*) FROM {}.payments WHERE note = 'app'",
        db.schema
    ))
    .fetch_one(&db.pool)
    .await
    .unwrap()
    .get(0);
    assert_eq!(
        app_rows, 1,
        "the application's commit on that connection took effect"
    );

    // The layer's next request on it: its normal answer, then a replay.
    let (first, _) = answer("k2").await;
    assert_eq!(first.status, StatusCode::CREATED);
    let (again, _) = answer("k2").await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert_eq!(
        again
            .headers
            .get("idempotent-replayed")
            .map(|v| v.to_str().unwrap()),
        Some("true")
    );
    // The dropped request ran once, whatever became of its commit: its retry is replayed
    // (committed) or runs it (rolled back).
    let (retry, _) = answer("k1").await;
    assert_eq!(retry.status, StatusCode::CREATED);
    let k1_rows: i64 = sqlx::raw_sql(&format!(
        "SELECT count(*) FROM {}.payments WHERE note = 'k1'",
        db.schema
    ))
    .fetch_one(&db.pool)
    .await
    .unwrap()
    .get(0);
    assert_eq!(k1_rows, 1, "the dropped request's row, once");
}
