//! Idempotency replay over real sockets (axum + hyper), on the in-process backend, on Redis
//! and on Postgres: the scenarios of `test-support/src/scenarios/replay/`; and at the tower level
//! (`tower_level`), where a test controls what an HTTP server would not let it.
//!
//! The replay faults of a real Redis (a holder killed, a restart, a damaged record) are in
//! `tests/redis_faults/replay.rs`; the actix middleware's replay in
//! `tests/integrations/actix_replay.rs`.

mod tower_level;

mod in_process {
    tower_lock_test_support::replay_scenarios!(framework = Tower, backend = InProcess);
    tower_lock_test_support::scenario_tests!(
        (tower_lock_test_support::scenarios::Backend::InProcess);
        nested_routers_bind_records_to_the_full_target,
        a_custom_fingerprint_in_a_nested_router_keeps_the_full_target,
        the_longest_key_works_per_long_principal,
    );
}

#[cfg(feature = "redis")]
mod redis {
    tower_lock_test_support::replay_scenarios!(framework = Tower, backend = Redis);
    tower_lock_test_support::scenario_tests!(
        (tower_lock_test_support::scenarios::Backend::Redis);
        nested_routers_bind_records_to_the_full_target,
        a_custom_fingerprint_in_a_nested_router_keeps_the_full_target,
        the_longest_key_works_per_long_principal,
    );
}

#[cfg(feature = "postgres")]
mod postgres {
    tower_lock_test_support::replay_scenarios!(framework = Tower, backend = Postgres);
    tower_lock_test_support::scenario_tests!(
        (tower_lock_test_support::scenarios::Backend::Postgres);
        nested_routers_bind_records_to_the_full_target,
        a_custom_fingerprint_in_a_nested_router_keeps_the_full_target,
        the_longest_key_works_per_long_principal,
    );
}

/// The in-process record budget: what a retry sees when the record it needs was evicted,
/// or never fit. (Redis has no budget of its own: it keeps every record for its
/// retention.)
mod record_budget {
    use std::{sync::Arc, sync::atomic::Ordering};

    use http::StatusCode;
    use tower_lock::{IdempotencyLayer, LockEngine, MemoryBackend};
    use tower_lock_test_support::{
        http::{Reply, TestServer},
        scenarios::{
            Backend, Framework, ReplayApp, Stack, bounded, idempotency_lock_key, replay_app,
            until_free,
        },
    };

    async fn post(server: &TestServer, path: &str, key: &str) -> Reply {
        let value = format!("\"{key}\"");
        server
            .send_body(
                "POST",
                path,
                &[("idempotency-key", value.as_str())],
                "x".to_owned(),
            )
            .await
    }

    /// An app whose in-process engine keeps at most `budget` bytes of records.
    async fn app_with_budget(budget: usize) -> (ReplayApp, Arc<MemoryBackend>, LockEngine) {
        let backend = Arc::new(MemoryBackend::with_record_budget(budget));
        let engine = LockEngine::from_arc(backend.clone());
        let layer = IdempotencyLayer::builder(engine.clone())
            .unscoped()
            .build()
            .unwrap();
        let app = replay_app(Stack::new(Framework::Tower, Backend::InProcess), layer).await;
        (app, backend, engine)
    }

    fn assert_not_stored(retry: &Reply) {
        let text = retry.text();
        assert_eq!(
            retry.status,
            StatusCode::CONFLICT,
            "{}",
            &text[..text.len().min(80)]
        );
        assert_eq!(
            retry.json()["type"],
            "urn:tower-lock:problem:response-not-stored"
        );
        assert_eq!(retry.header("idempotent-replayed"), None);
    }

    /// The first request completes; others push its record out of the budget; its retry
    /// is answered `409 response-not-stored`, and its handler ran once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_evicted_record_is_answered_409_and_never_runs_again() {
        bounded(async {
            let (app, backend, engine) = app_with_budget(16 << 10).await;
            let first = post(&app.server, "/orders", "first").await;
            assert_eq!(first.status, StatusCode::CREATED);
            // Completed (stored and released) once the key is free again.
            until_free(&engine, &idempotency_lock_key("first")).await;
            let mut others = 0;
            while backend.evicted_records() == 0 {
                others += 1;
                assert!(others < 10_000, "the budget never evicted");
                let reply = post(&app.server, "/orders", &format!("other-{others}")).await;
                assert_eq!(reply.status, StatusCode::CREATED);
            }
            let runs = app.runs.load(Ordering::SeqCst);
            assert_eq!(runs, 1 + others);
            let retry = post(&app.server, "/orders", "first").await;
            assert_not_stored(&retry);
            // The tombstone keeps the fingerprint: another request under the key is 422.
            let other = app
                .server
                .send_body(
                    "POST",
                    "/orders",
                    &[("idempotency-key", "\"first\"")],
                    "y".to_owned(),
                )
                .await;
            assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
            assert_eq!(app.runs.load(Ordering::SeqCst), runs, "not run again");
        })
        .await;
    }

    /// A response within `max_response_body` but larger than the whole budget is not
    /// kept, yet its retry is answered `409 response-not-stored`, never run again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_record_larger_than_the_budget_is_answered_409_and_never_runs_again() {
        bounded(async {
            // `POST /big` answers 4 KiB.
            let (app, _backend, engine) = app_with_budget(2 << 10).await;
            let first = post(&app.server, "/big", "big").await;
            assert_eq!((first.status, first.body.len()), (StatusCode::OK, 4096));
            until_free(&engine, &idempotency_lock_key("big")).await;
            let retry = post(&app.server, "/big", "big").await;
            assert_not_stored(&retry);
            assert_eq!(app.runs.load(Ordering::SeqCst), 1, "not run again");
        })
        .await;
    }
}
