//! Whose stored response a retry may get: only its own caller's. The quick-start preset
//! refuses to build without a scope decision, and a scoped preset keeps callers apart.

use std::sync::atomic::Ordering;

use http::StatusCode;
use tower_lock::IdempotencyLayer;

use super::{app::replay_app, post_with, until_recorded};
use crate::scenarios::Stack;

/// The quick-start preset (no scope chosen) never hands one caller's stored response to
/// another caller who happens to send the same key and body: `build()` refuses a preset
/// without a scope decision and names the choices.
pub async fn the_quick_start_preset_never_replays_a_response_to_another_caller(on: Stack) {
    let table = on.table("replay-callers").await;
    let built = IdempotencyLayer::builder(table.engine()).build();
    let layer = match built {
        Err(error) => {
            let text = error.to_string();
            for choice in ["per_principal", "scope_by", "unscoped"] {
                assert!(text.contains(choice), "{text:?} names {choice}");
            }
            return;
        }
        Ok(layer) => layer,
    };
    // If it builds, two callers must still never share an answer.
    let app = replay_app(on, layer).await;
    let send = |user: &'static str| {
        let server = app.server.clone();
        async move {
            server
                .send_body(
                    "POST",
                    "/orders",
                    &[
                        ("idempotency-key", "\"order-1\""),
                        ("authorization", &format!("Bearer {user}")),
                    ],
                    "{\"sku\":42}",
                )
                .await
        }
    };
    let alice = send("alice").await;
    assert_eq!(alice.status, StatusCode::CREATED);
    until_recorded(&table, "order-1").await;
    let bob = send("bob").await;
    assert_ne!(
        bob.header("idempotent-replayed"),
        Some("true"),
        "bob was handed alice's stored response: {:?}",
        bob.text()
    );
}

/// A scoped preset replays a stored response only to the caller who made it: another
/// caller sending the same key and body runs its own request, and each caller's retries
/// get their own response.
pub async fn a_scoped_preset_replays_only_to_the_caller_who_made_it(on: Stack) {
    let table = on.table("replay-scoped").await;
    // The scope a server derives: here the bearer token stands for a verified identity.
    let layer = IdempotencyLayer::builder(table.engine())
        .scope_by(tower_lock::key::from_fn("bearer", |req| {
            let token = req.header("authorization")?.strip_prefix(b"Bearer ")?;
            Some(String::from_utf8_lossy(token).into_owned())
        }))
        .build()
        .unwrap();
    let app = replay_app(on, layer).await;
    let send = |user: &'static str| {
        let server = app.server.clone();
        async move {
            let bearer = format!("Bearer {user}");
            server
                .send_body(
                    "POST",
                    "/orders",
                    &[
                        ("idempotency-key", "\"order-1\""),
                        ("authorization", bearer.as_str()),
                    ],
                    "{\"sku\":42}",
                )
                .await
        }
    };
    let alice = send("alice").await;
    assert_eq!(alice.header("x-run"), Some("1"));
    let bob = send("bob").await;
    assert_eq!(
        (
            bob.status,
            bob.header("idempotent-replayed"),
            bob.header("x-run")
        ),
        (StatusCode::CREATED, None, Some("2")),
        "bob runs his own order"
    );
    for (user, run) in [("alice", "1"), ("bob", "2")] {
        let again = send(user).await;
        assert_eq!(again.header("idempotent-replayed"), Some("true"), "{user}");
        assert_eq!(again.header("x-run"), Some(run), "{user} gets their own");
    }
    // A request the scope finds nothing in is the server's mistake (its authentication
    // did not run), never the client's: `500 misconfigured`, and nothing runs.
    let anonymous = post_with(&app.server, "/orders", "order-1", "{\"sku\":42}").await;
    assert_eq!(anonymous.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(
        anonymous
            .text()
            .contains("urn:tower-lock:problem:misconfigured"),
        "{}",
        anonymous.text()
    );
    assert_eq!(app.runs.load(Ordering::SeqCst), 2);
}
