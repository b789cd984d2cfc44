//! The same protocol on actix-web: `TransactionalMiddleware` and its `Tx` extractor.

use std::{sync::Arc, time::Duration};

use actix_web::{App, HttpRequest, HttpResponse, dev::Service, web};
use http::StatusCode;
use tower_lock::sqlx::{self, Row};
use tower_lock_actix::{TransactionalMiddleware, Tx};
use tower_lock_test_support::http::{TestServer, serve_actix};

use crate::app::{Db, Gate, shared_url};

/// Inserts a payment, then answers as `x-outcome` says: `ok` (default, `201`), `invalid`
/// (`422`), `hang` (reports to the app's [`Gate`], waits for it, then `201`).
async fn pay(
    req: HttpRequest,
    schema: web::Data<String>,
    mut tx: Tx,
    body: String,
) -> HttpResponse {
    let inserted = sqlx::query(&format!(
        "INSERT INTO {}.payments (note) VALUES ($1) RETURNING id",
        schema.get_ref()
    ))
    .persistent(false)
    .bind(body)
    .fetch_one(&mut *tx)
    .await;
    let id: i64 = match inserted {
        Ok(row) => row.get(0),
        Err(e) => return HttpResponse::ServiceUnavailable().body(e.to_string()),
    };
    let outcome = req.headers().get("x-outcome").map(|v| v.as_bytes());
    if outcome == Some(b"invalid") {
        return HttpResponse::UnprocessableEntity().body("invalid card");
    }
    if let Some(gate) = req.app_data::<web::Data<Gate>>() {
        let _ = gate.entered.send(format!("payment {id}"));
        if outcome == Some(b"hang") {
            gate.release.notified().await;
        }
    }
    HttpResponse::Created().body(format!("payment {id}"))
}

/// `POST /payments` ([`pay`]) on `db` under the transactional middleware, in process.
pub(crate) async fn actix_server(db: &Db) -> TestServer {
    let layer = db.layer(|b| b.wait(Duration::from_secs(20))).await;
    let middleware = TransactionalMiddleware::try_from(layer).unwrap();
    let schema = db.schema.clone();
    serve_actix(2, move || {
        App::new().app_data(web::Data::new(schema.clone())).service(
            web::resource("/payments")
                .wrap(middleware.clone())
                .route(web::post().to(pay)),
        )
    })
}

/// [`actix_server`] whose handlers report to `gate` and, for `x-outcome: hang`, wait for
/// it.
pub(crate) async fn gated_actix_server(db: &Db, gate: Gate) -> TestServer {
    let layer = db.layer(|b| b.wait(Duration::from_secs(20))).await;
    let middleware = TransactionalMiddleware::try_from(layer).unwrap();
    let schema = db.schema.clone();
    serve_actix(2, move || {
        App::new()
            .app_data(web::Data::new(schema.clone()))
            .app_data(web::Data::new(gate.clone()))
            .service(
                web::resource("/payments")
                    .wrap(middleware.clone())
                    .route(web::post().to(pay)),
            )
    })
}

/// The child process's actix server on `port` (see `crate::child`): [`pay`] under the
/// transactional middleware, `POST /release` opening `gate`, and outside the middleware, for
/// a request marked `x-die-after-commit`, the mark `committed` written once the middleware
/// answered (after its commit) and no answer ever. Runs until the process is killed.
pub(crate) async fn child_server(db: Db, gate: Gate, committed: String, port: u16) {
    let layer = db.layer(|b| b.wait(Duration::from_secs(20))).await;
    let middleware = TransactionalMiddleware::try_from(layer).unwrap();
    let schema = db.schema.clone();
    let committed = Arc::new(committed);
    actix_web::HttpServer::new(move || {
        let committed = committed.clone();
        App::new()
            .app_data(web::Data::new(schema.clone()))
            .app_data(web::Data::new(gate.clone()))
            .service(
                web::resource("/payments")
                    .wrap(middleware.clone())
                    .route(web::post().to(pay)),
            )
            .route(
                "/release",
                web::post().to(|gate: web::Data<Gate>| async move {
                    gate.release.notify_one();
                    HttpResponse::NoContent().finish()
                }),
            )
            .wrap_fn(move |req, srv| {
                let die = req.headers().contains_key("x-die-after-commit");
                let committed = committed.clone();
                let answer = srv.call(req);
                async move {
                    let answer = answer.await?;
                    if die {
                        std::fs::write(&*committed, b"committed").unwrap();
                        std::future::pending::<()>().await;
                    }
                    Ok(answer)
                }
            })
    })
    .workers(1)
    .disable_signals()
    .bind(("127.0.0.1", port))
    .unwrap()
    .run()
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actix_commits_once_replays_rolls_back_and_orders_duplicates() {
    let db = Db::new(&shared_url().await, "actix").await;
    let server = Arc::new(actix_server(&db).await);
    let invalid = server
        .send_body(
            "POST",
            "/payments",
            &[("idempotency-key", "k"), ("x-outcome", "invalid")],
            "card",
        )
        .await;
    assert_eq!(invalid.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!((db.payments().await, db.records().await), (0, 0));
    let duplicates: Vec<_> = (0..20)
        .map(|_| {
            let server = server.clone();
            tokio::spawn(async move {
                server
                    .send_body("POST", "/payments", &[("idempotency-key", "k")], "card")
                    .await
            })
        })
        .collect();
    let mut replayed = 0;
    for duplicate in duplicates {
        let reply = duplicate.await.unwrap();
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text());
        replayed += usize::from(reply.header("idempotent-replayed") == Some("true"));
    }
    assert_eq!(replayed, 19);
    let other = server
        .send_body(
            "POST",
            "/payments",
            &[("idempotency-key", "k")],
            "another card",
        )
        .await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!((db.payments().await, db.records().await), (1, 1));
}
