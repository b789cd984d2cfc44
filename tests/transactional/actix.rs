//! The same protocol on actix-web: `TransactionalMiddleware` and its `Tx` extractor.

use std::time::Duration;

use actix_web::{App, HttpRequest, HttpResponse, web};
use http::StatusCode;
use tower_lock::sqlx::{self, Row};
use tower_lock_actix::{TransactionalMiddleware, Tx};
use tower_lock_test_support::http::serve_actix;

use crate::app::{Db, shared_url};

/// Inserts a payment, then answers `201`, or `422` for `x-outcome: invalid`.
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
    if req.headers().contains_key("x-outcome") {
        return HttpResponse::UnprocessableEntity().body("invalid card");
    }
    HttpResponse::Created().body(format!("payment {id}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actix_commits_once_replays_rolls_back_and_orders_duplicates() {
    let db = Db::new(&shared_url().await, "actix").await;
    let layer = db.layer(|b| b.wait(Duration::from_secs(20))).await;
    let middleware = TransactionalMiddleware::try_from(layer).unwrap();
    let schema = db.schema.clone();
    let server = std::sync::Arc::new(serve_actix(2, move || {
        App::new().app_data(web::Data::new(schema.clone())).service(
            web::resource("/payments")
                .wrap(middleware.clone())
                .route(web::post().to(pay)),
        )
    }));
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
