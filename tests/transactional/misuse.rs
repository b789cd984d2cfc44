//! A handler's own mistakes with the transaction the layer lends it, on axum and on
//! actix-web alike: a `COMMIT` or `ROLLBACK` statement on it, a failed statement it
//! handled and answered anyway, and a second borrow (`Tx` taken twice, or held by a
//! middleware around the handler). Each is a `500` naming the cause, with nothing
//! committed and nothing stored, and the key's retry runs; never a half-written record, a
//! `503` with `Retry-After`, or a hang.

use std::time::Duration;

use http::StatusCode;
use tower_lock::{
    IdempotencyLayer, LockEngine,
    idempotency::transactional::LentTransaction,
    sqlx::{self, Connection, Executor, PgConnection},
};
use tower_lock_test_support::http::{Reply, TestServer, serve, serve_actix};

use crate::{
    app::{Db, shared_url},
    logs,
};

/// The frameworks every case runs on.
#[derive(Clone, Copy, Debug)]
enum Framework {
    Axum,
    Actix,
}

const BOTH: [Framework; 2] = [Framework::Axum, Framework::Actix];

/// What the handler of `POST /payments` does after inserting its payment, as the
/// request's `x-misuse` header says, and its answer (`201` unless it says otherwise):
/// `commit` / `rollback` send the statement on the lent connection and ignore its
/// outcome; `rollback-begin` sends `ROLLBACK`, `BEGIN` and its insert again; `exists` inserts an account that already exists and answers `200 already
/// exists` when the insert fails (the create-if-absent pattern, without a savepoint);
/// `savepoint` does the same in a savepoint it rolls back; `constraints` runs `SET
/// CONSTRAINTS ALL IMMEDIATE` and answers `500` with its error when it fails,
/// `constraints-ignored` ignores that error; anything else nothing more.
fn act<'a>(
    conn: &'a mut PgConnection,
    schema: &'a str,
    misuse: &'a str,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = (StatusCode, String)> + Send + 'a>> {
    Box::pin(async move {
        let insert = format!("INSERT INTO {schema}.payments (note) VALUES ('card')");
        (&mut *conn).execute(sqlx::raw_sql(&insert)).await.unwrap();
        let account = format!("INSERT INTO {schema}.accounts (name) VALUES ('alice')");
        let created = match misuse {
            "commit" | "rollback" => {
                let _ = (&mut *conn)
                    .execute(sqlx::raw_sql(&misuse.to_uppercase()))
                    .await;
                true
            }
            // Ends the request's transaction and writes in one of its own, which the
            // layer's `COMMIT` must not commit.
            "rollback-begin" => {
                let _ = (&mut *conn)
                    .execute(sqlx::raw_sql(&format!("ROLLBACK; BEGIN; {insert}")))
                    .await;
                true
            }
            "constraints" | "constraints-ignored" => {
                let set = (&mut *conn)
                    .execute(sqlx::raw_sql("SET CONSTRAINTS ALL IMMEDIATE"))
                    .await;
                match set {
                    Err(error) if misuse == "constraints" => {
                        return (StatusCode::INTERNAL_SERVER_ERROR, error.to_string());
                    }
                    _ => true,
                }
            }
            "exists" => (&mut *conn).execute(sqlx::raw_sql(&account)).await.is_ok(),
            "savepoint" => {
                let mut savepoint = conn.begin().await.unwrap();
                let created = (&mut *savepoint)
                    .execute(sqlx::raw_sql(&account))
                    .await
                    .is_ok();
                if created {
                    savepoint.commit().await.unwrap();
                } else {
                    savepoint.rollback().await.unwrap();
                }
                created
            }
            _ => true,
        };
        if created {
            (StatusCode::CREATED, "paid".to_owned())
        } else {
            (StatusCode::OK, "already exists".to_owned())
        }
    })
}

/// A fresh schema with its payments table, and an accounts table holding `alice`.
async fn db(name: &str) -> Db {
    let db = Db::new(&shared_url().await, name).await;
    sqlx::raw_sql(&format!(
        "CREATE TABLE {schema}.accounts (name text PRIMARY KEY);
         INSERT INTO {schema}.accounts VALUES ('alice')",
        schema = db.schema
    ))
    .execute(&db.pool)
    .await
    .unwrap();
    db
}

/// `framework`'s server on `db` under the transactional layer: `POST /payments` ([`act`]),
/// `POST /twice` (a handler that takes `Tx` twice) and `POST /held` (a handler that takes
/// `Tx` inside a middleware that holds one around it), each answering `201` when it runs.
async fn server(framework: Framework, db: &Db) -> TestServer {
    let layer = db.layer(|b| b).await;
    let schema = db.schema.clone();
    match framework {
        Framework::Axum => {
            use axum::{Extension, extract::Request, http::HeaderMap, middleware::Next, routing};
            use tower_lock_axum::Tx;

            async fn pay(
                Extension(schema): Extension<String>,
                headers: HeaderMap,
                mut tx: Tx,
            ) -> (StatusCode, String) {
                let misuse = headers.get("x-misuse").map_or("", |v| v.to_str().unwrap());
                act(&mut tx, &schema, misuse).await
            }
            async fn twice(_first: Tx, _second: Tx) -> StatusCode {
                StatusCode::CREATED
            }
            async fn hold(req: Request, next: Next) -> axum::response::Response {
                let lent = req.extensions().get::<LentTransaction>().cloned().unwrap();
                let _held = lent.borrow().await.unwrap();
                next.run(req).await
            }
            let held = axum::Router::new()
                .route(
                    "/held",
                    routing::post(|_tx: Tx| async { StatusCode::CREATED }),
                )
                .layer(axum::middleware::from_fn(hold));
            let app = axum::Router::new()
                .route("/payments", routing::post(pay))
                .route("/twice", routing::post(twice))
                .merge(held)
                .layer(layer)
                .layer(Extension(schema));
            serve(app).await
        }
        Framework::Actix => {
            use actix_web::{App, HttpMessage, HttpRequest, HttpResponse, dev::Service, web};
            use tower_lock_actix::{TransactionalMiddleware, Tx};

            async fn pay(req: HttpRequest, schema: web::Data<String>, mut tx: Tx) -> HttpResponse {
                let misuse = req
                    .headers()
                    .get("x-misuse")
                    .map_or("", |v| v.to_str().unwrap());
                let (status, body) = act(&mut tx, &schema, misuse).await;
                HttpResponse::build(actix_web::http::StatusCode::from_u16(status.as_u16()).unwrap())
                    .body(body)
            }
            async fn twice(_first: Tx, _second: Tx) -> HttpResponse {
                HttpResponse::Created().finish()
            }
            async fn plain(_tx: Tx) -> HttpResponse {
                HttpResponse::Created().finish()
            }
            let middleware = TransactionalMiddleware::try_from(layer).unwrap();
            serve_actix(2, move || {
                App::new()
                    .app_data(web::Data::new(schema.clone()))
                    .service(
                        web::resource("/payments")
                            .wrap(middleware.clone())
                            .route(web::post().to(pay)),
                    )
                    .service(
                        web::resource("/twice")
                            .wrap(middleware.clone())
                            .route(web::post().to(twice)),
                    )
                    .service(
                        // The last `wrap` is the outer one: the transactional middleware,
                        // then the one that holds the transaction around the handler.
                        web::resource("/held")
                            .wrap_fn(|req, srv| {
                                let lent = req.extensions().get::<LentTransaction>().cloned();
                                let call = srv.call(req);
                                async move {
                                    let _held = lent.unwrap().borrow().await.unwrap();
                                    call.await
                                }
                            })
                            .wrap(middleware.clone())
                            .route(web::post().to(plain)),
                    )
            })
        }
    }
}

/// `POST path` with idempotency key `key` and `x-misuse: misuse`, answered within 10 s.
async fn send(server: &TestServer, path: &str, key: &str, misuse: &str) -> Reply {
    let headers = [("idempotency-key", key), ("x-misuse", misuse)];
    tokio::time::timeout(
        Duration::from_secs(10),
        server.send_body("POST", path, &headers, "card"),
    )
    .await
    .unwrap_or_else(|_| panic!("POST {path} ({misuse}) got no answer within 10 s"))
}

/// `reply` is the layer's `500` problem naming `cause`, without `Retry-After`.
fn assert_misuse(reply: &Reply, cause: &str, framework: Framework) {
    assert_eq!(
        reply.status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "{framework:?}: {}",
        reply.text()
    );
    assert!(
        reply.text().contains(cause),
        "{framework:?}: {}",
        reply.text()
    );
    assert_eq!(reply.header("retry-after"), None, "{framework:?}");
}

/// The rows of `db`'s payments and records tables.
async fn rows(db: &Db) -> (i64, i64) {
    (db.payments().await, db.records().await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_commits_or_rolls_back_the_lent_transaction_leaves_nothing_and_its_retry_runs()
 {
    for framework in BOTH {
        let db = db("ended").await;
        let server = server(framework, &db).await;
        for (key, misuse) in [("c", "commit"), ("r", "rollback"), ("b", "rollback-begin")] {
            let ended = send(&server, "/payments", key, misuse).await;
            assert_misuse(&ended, "ended the request's transaction", framework);
            // The database refused the handler's `COMMIT` (a claim cannot commit without
            // its response): nothing of the request, no half-written record.
            assert_eq!(rows(&db).await, (0, 0), "{framework:?} after a {misuse}");
            let retry = send(&server, "/payments", key, "").await;
            assert_eq!(
                retry.status,
                StatusCode::CREATED,
                "{framework:?}: {}",
                retry.text()
            );
            assert_eq!(retry.header("idempotent-replayed"), None);
            let replay = send(&server, "/payments", key, "").await;
            assert_eq!(replay.header("idempotent-replayed"), Some("true"));
            assert_eq!(db.payments().await, 1);
            let schema = &db.schema;
            sqlx::raw_sql(&format!(
                "TRUNCATE {schema}.payments, {schema}.tower_lock_idempotency_records"
            ))
            .execute(&db.pool)
            .await
            .unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handled_failed_statement_is_a_500_naming_the_savepoint_stored_never_and_logged_once() {
    logs::capture();
    for framework in BOTH {
        let db = db("failed_statement").await;
        let server = server(framework, &db).await;
        for _ in 0..3 {
            let answered = send(&server, "/payments", "k", "exists").await;
            assert_misuse(&answered, "savepoint", framework);
            assert_eq!(rows(&db).await, (0, 0), "{framework:?}");
        }
        let logged = logs::events_with("records", &format!("\"{}\".", db.schema));
        assert_eq!(logged.len(), 1, "{framework:?}: {logged:?}");
        assert!(logged[0]["cause"].contains("savepoint"), "{logged:?}");
        // The same in a savepoint: the answer is stored and replayed.
        let first = send(&server, "/payments", "s", "savepoint").await;
        assert_eq!(
            first.status,
            StatusCode::OK,
            "{framework:?}: {}",
            first.text()
        );
        assert_eq!(first.text(), "already exists");
        let replay = send(&server, "/payments", "s", "savepoint").await;
        assert_eq!(replay.header("idempotent-replayed"), Some("true"));
        assert_eq!(rows(&db).await, (1, 1), "{framework:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_borrow_of_the_transaction_is_refused_at_once_and_logged() {
    logs::capture();
    for framework in BOTH {
        let db = db("borrowed").await;
        let server = server(framework, &db).await;
        for (path, key) in [("/twice", "t"), ("/held", "h"), ("/twice", "t")] {
            let refused = send(&server, path, key, "").await;
            assert_misuse(&refused, "already borrowed", framework);
        }
        assert_eq!(rows(&db).await, (0, 0), "{framework:?}");
        let logged = logs::events_with("records", &format!("\"{}\".", db.schema));
        assert_eq!(logged.len(), 1, "{framework:?}: {logged:?}");
        assert!(
            logged[0]["cause"].contains("already borrowed"),
            "{logged:?}"
        );
        // The connection went back clean: a request that takes it once commits.
        let paid = send(&server, "/payments", "p", "").await;
        assert_eq!(
            paid.status,
            StatusCode::CREATED,
            "{framework:?}: {}",
            paid.text()
        );
        assert_eq!(rows(&db).await, (1, 1), "{framework:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_refuses_tables_without_the_commit_check_and_migrate_adds_it() {
    let db = db("outdated").await;
    let _ = db.layer(|b| b).await;
    // The tables as an earlier version made them: no commit check.
    sqlx::raw_sql(&format!(
        "DROP TRIGGER tower_lock_claim_check ON {}.tower_lock_idempotency_records",
        db.schema
    ))
    .execute(&db.pool)
    .await
    .unwrap();
    let builder = || {
        IdempotencyLayer::builder(LockEngine::in_memory())
            .unscoped()
            .transactional(db.pool.clone())
            .schema(&db.schema)
    };
    let refused = builder()
        .build()
        .await
        .expect_err("tables without the commit check were accepted");
    assert!(refused.to_string().contains("migrate()"), "{refused}");
    builder().migrate().await.unwrap();
    builder().migrate().await.unwrap();
    builder().build().await.unwrap();
}

/// `SET CONSTRAINTS ALL IMMEDIATE` (Django's `check_constraints`) fires the commit check at
/// once, before the record is written: Postgres offers no way to exempt a constraint
/// trigger from `ALL`. The refusal says so (not that the transaction was committed), and a
/// handler that answers anyway gets the layer's `500` naming it; nothing is committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_constraints_all_immediate_is_refused_with_a_message_that_names_it() {
    for framework in BOTH {
        let db = db("constraints").await;
        let server = server(framework, &db).await;
        let refused = send(&server, "/payments", "k", "constraints").await;
        assert_eq!(refused.status, StatusCode::INTERNAL_SERVER_ERROR);
        let text = refused.text();
        assert!(
            text.contains("SET CONSTRAINTS ALL IMMEDIATE") && text.contains("by name"),
            "{framework:?}: {text}"
        );
        assert!(
            !text.contains("was committed before"),
            "{framework:?}: {text}"
        );
        let answered = send(&server, "/payments", "k", "constraints-ignored").await;
        assert_misuse(&answered, "SET CONSTRAINTS ALL IMMEDIATE", framework);
        assert_eq!(rows(&db).await, (0, 0), "{framework:?}");
        let retry = send(&server, "/payments", "k", "").await;
        assert_eq!(retry.status, StatusCode::CREATED, "{framework:?}");
    }
}
