//! The fence check in the request's transaction: a holder whose lease was lost while it
//! was paused (a newer holder took the lock and wrote) has its writes refused.

use std::{sync::Arc, time::Duration};

use axum::{
    Extension, Router,
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::post,
};
use tokio::sync::{Notify, mpsc};
use tower_lock::{LockEngine, LockLayer, key::HeaderKey, sqlx};
use tower_lock_axum::{Locked, Tx};
use tower_lock_test_support::http::serve;

use crate::app::{Db, shared_url};

/// A handler marked `x-pause` reports its lease's key on `entered`, then waits for
/// `release` before its fence check.
#[derive(Clone)]
struct Pause {
    entered: mpsc::UnboundedSender<String>,
    release: Arc<Notify>,
}

/// Inserts a payment, then checks its lease's fence in the same transaction.
async fn fenced_pay(
    Extension(pause): Extension<Pause>,
    Extension(schema): Extension<String>,
    Locked(lease): Locked,
    headers: HeaderMap,
    mut tx: Tx,
) -> Response {
    if headers.contains_key("x-pause") {
        pause.entered.send(lease.key().as_str().to_owned()).unwrap();
        pause.release.notified().await;
    }
    sqlx::query(&format!(
        "INSERT INTO {schema}.payments (note) VALUES ('fenced')"
    ))
    .persistent(false)
    .execute(&mut *tx)
    .await
    .unwrap();
    if let Err(refused) = tx.check_fence(&lease).await {
        return refused.into_response();
    }
    StatusCode::CREATED.into_response()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_paused_past_its_lease_has_its_writes_refused_after_a_newer_holder_wrote() {
    let db = Db::new(&shared_url().await, "fence").await;
    let engine = LockEngine::in_memory();
    let lock = LockLayer::builder(engine.clone())
        .key(HeaderKey::new("x-tenant"))
        .wait(Duration::from_secs(20))
        .build()
        .unwrap();
    let (entered, mut paused) = mpsc::unbounded_channel();
    let pause = Pause {
        entered,
        release: Arc::new(Notify::new()),
    };
    let app = Router::new()
        .route("/payments", post(fenced_pay))
        .layer(db.layer(|b| b).await)
        .layer(lock)
        .layer(Extension(db.schema.clone()))
        .layer(Extension(pause.clone()));
    let server = Arc::new(serve(app).await);
    let stale = tokio::spawn({
        let server = server.clone();
        async move {
            let headers = [
                ("idempotency-key", "a"),
                ("x-tenant", "t1"),
                ("x-pause", "1"),
            ];
            server
                .send_body("POST", "/payments", &headers, "card")
                .await
        }
    });
    // The first holder is paused; its lease is lost (here: broken, as an expiry would).
    let key = paused.recv().await.unwrap();
    assert!(engine.admin().force_release(&key).await.unwrap());
    let headers = [("idempotency-key", "b"), ("x-tenant", "t1")];
    let newer = server
        .send_body("POST", "/payments", &headers, "card")
        .await;
    assert_eq!(newer.status, StatusCode::CREATED);
    pause.release.notify_one();
    let stale = stale.await.unwrap();
    assert_eq!(stale.status, StatusCode::CONFLICT);
    assert!(stale.text().contains("stale-fence"), "{}", stale.text());
    // The newer holder's row alone: the stale insert rolled back with its record.
    assert_eq!((db.payments().await, db.records().await), (1, 1));
}
