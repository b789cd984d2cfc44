//! The HTTP scenarios: each written once, run wherever it must hold.
//!
//! A scenario is an `async fn` that takes the [`Stack`] it runs on: the [`Framework`]
//! serving its routes and the [`Backend`] its engines run on (a scenario that compares
//! the frameworks takes only the backend, one that needs no backend only the framework).
//! It builds its app from [`Routes`] of framework-neutral [`Handler`]s, so the same steps
//! and the same assertions run under the tower layer and under the actix middleware, on
//! the in-process backend, on Redis and on Postgres. Each scenario that uses a backend ends by checking
//! that its [`LockTable`] kept nothing behind.
//!
//! A test file instantiates a list with one macro call; each scenario becomes one
//! `#[tokio::test]` named as the scenario, so a failure names the scenario and the test
//! binary names the framework and backend:
//!
//! | macro | the scenarios | instantiated in |
//! | --- | --- | --- |
//! | [`http_scenarios!`](crate::http_scenarios) `(framework = tower \| actix, backend = InProcess \| Redis \| RedisCluster \| Postgres \| PostgresBouncer)` | ordering, rejections, release points; on the tower layer also a handler dropped with its client, on actix also exclusion across workers | `tests/layer/in_process.rs` (tower, in process), `tests/layer/redis.rs` (tower, Redis), `tests/layer/redis_cluster.rs` (tower, Cluster), `tests/layer/postgres.rs` (tower, Postgres directly and through PgBouncer), `tests/integrations/actix.rs` (actix, in process), `tests/integrations/actix_redis.rs` (actix, Redis), `tests/integrations/actix_postgres.rs` (actix, Postgres) |
//! | [`parity_scenarios!`](crate::parity_scenarios) `(backend = ...)` | the tower layer and the actix middleware answer alike | `actix.rs`, `actix_redis.rs`, `actix_postgres.rs` |
//! | [`unavailable_backend_scenarios!`](crate::unavailable_backend_scenarios) `(framework = ...)` | the failure policies, on a backend that is always down | `in_process.rs`, `actix.rs` |
//! | [`replay_scenarios!`](crate::replay_scenarios) `(framework = Tower \| Actix, backend = ...)` | idempotency replay: the protocol, the fingerprint, the scope, what is stored, the handler outliving its client | `tests/replay/main.rs` (tower), `tests/integrations/actix_replay.rs` (actix); each in process, on Redis and on Postgres |
//!
//! Every scenario runs on every backend: the permit scenarios and the ones that need a
//! release ordered before the client's next request included (the engine orders a node's
//! own release before its next acquire of the key, whatever connection each takes).
//!
//! Faults of a real Redis (killed, paused, frozen, restarted) are Redis-only and stay in
//! `tests/layer/redis.rs` and `tests/redis_faults/`, built from the same pieces.

use std::time::Duration;

mod backend;
mod client;
mod failure;
mod framework;
mod handler;
mod ordering;
mod parity;
#[cfg(feature = "postgres")]
mod postgres;
mod rejections;
mod release;
mod replay;
mod stack;

pub use backend::{Backend, LockTable};
pub use client::{
    FOR_K, arrives, assert_problem, header_key, hold, idempotency_lock_key, inside, lock_key,
    post_refused, reaches_its_handler, spawn_post, until_free, wait_for_waiters,
};
pub use failure::*;
pub use framework::{ACTIX_WORKERS, Framework, Routes};
pub use handler::{Handler, Hangs, Streams};
pub use ordering::*;
pub use parity::*;
pub use rejections::*;
pub use release::*;
pub use replay::*;
pub use stack::Stack;

/// Run a scenario with a time bound, so a scenario that hangs fails instead.
pub async fn bounded(scenario: impl Future<Output = ()>) {
    tokio::time::timeout(Duration::from_secs(60), scenario)
        .await
        .expect("scenario did not finish within 60 s");
}

/// Instantiate the HTTP scenarios on one framework and one backend: one `#[tokio::test]`
/// per scenario, named as the scenario.
///
/// ```ignore
/// tower_lock_test_support::http_scenarios!(framework = tower, backend = InProcess);
/// tower_lock_test_support::http_scenarios!(framework = actix, backend = Redis);
/// ```
#[macro_export]
macro_rules! http_scenarios {
    (framework = tower, backend = $backend:ident $(,)?) => {
        $crate::http_scenarios!(@every Tower, $backend);
        // Not on actix: an actix server does not drop a running handler whose client went
        // away (it notices a closed connection only when it next writes, actix-web#1313).
        $crate::scenario_tests!(
            ($crate::scenarios::Stack::new(
                $crate::scenarios::Framework::Tower,
                $crate::scenarios::Backend::$backend,
            ));
            disconnecting_client_frees_the_key,
        );
    };
    (framework = actix, backend = $backend:ident $(,)?) => {
        $crate::http_scenarios!(@every Actix, $backend);
        $crate::scenario_tests!(($crate::scenarios::Backend::$backend);
            requests_with_one_key_never_overlap_across_workers,
        );
    };
    (@every $framework:ident, $backend:ident) => {
        $crate::scenario_tests!(
            ($crate::scenarios::Stack::new(
                $crate::scenarios::Framework::$framework,
                $crate::scenarios::Backend::$backend,
            ));
            fifo_requests_with_one_key_never_overlap_and_run_in_arrival_order,
            waiting_requests_without_fifo_never_overlap,
            held_key_is_answered_423_with_retry_after_and_problem_json,
            wait_that_runs_out_is_answered_429_with_retry_after,
            full_wait_queue_is_answered_429_at_once,
            missing_key_is_400_or_passes_through_as_configured,
            idempotency_preset_requires_a_wellformed_key_and_answers_duplicates_409,
            idempotency_duplicate_in_flight_is_answered_409,
            rejection_hook_replaces_the_default_body_and_keeps_the_headers,
            raw_socket_sees_status_line_for_locked,
            one_layer_on_many_routes_shares_one_lock_table,
            a_client_of_one_namespace_cannot_spell_a_key_of_another,
            a_plain_header_key_cannot_block_the_idempotency_preset,
            streaming_body_keeps_the_key_locked_until_its_last_chunk,
            client_leaving_in_the_middle_of_a_streamed_body_frees_the_key,
            bodiless_responses_release_the_key_before_the_client_has_them,
            release_at_response_ready_frees_the_key_while_the_body_streams,
        );
        $crate::scenario_tests!(
            ($crate::scenarios::Stack::new(
                $crate::scenarios::Framework::$framework,
                $crate::scenarios::Backend::$backend,
            ));
            back_to_back_requests_for_one_key_never_see_423,
        );
    };
}

/// Instantiate the scenarios that compare the tower layer with the actix middleware on
/// one backend.
///
/// ```ignore
/// tower_lock_test_support::parity_scenarios!(backend = InProcess);
/// ```
#[macro_export]
macro_rules! parity_scenarios {
    (backend = $backend:ident $(,)?) => {
        $crate::scenario_tests!(($crate::scenarios::Backend::$backend);
            held_key_is_answered_423_like_the_tower_layer,
            wait_that_runs_out_is_answered_429_like_the_tower_layer,
            full_wait_queue_is_answered_429_like_the_tower_layer,
            idempotency_preset_answers_400_and_409_like_the_tower_layer,
            rejection_hook_answers_on_actix_as_on_the_tower_layer,
        );
    };
}

/// Instantiate the failure-policy scenarios (a backend that is always down) on one
/// framework.
///
/// ```ignore
/// tower_lock_test_support::unavailable_backend_scenarios!(framework = actix);
/// ```
#[macro_export]
macro_rules! unavailable_backend_scenarios {
    (framework = tower $(,)?) => {
        $crate::unavailable_backend_scenarios!(@cases Tower);
    };
    (framework = actix $(,)?) => {
        $crate::unavailable_backend_scenarios!(@cases Actix);
    };
    (@cases $framework:ident) => {
        $crate::scenario_tests!(($crate::scenarios::Framework::$framework);
            unavailable_backend_fails_closed_with_503_and_retry_after,
            unavailable_backend_fails_open_when_configured,
            unavailable_backend_degrades_to_an_in_process_lock_when_configured,
        );
    };
}

/// One `#[tokio::test]` per scenario, each calling the scenario with `args` (a
/// parenthesized argument list). The building block of the macros above.
#[doc(hidden)]
#[macro_export]
macro_rules! scenario_tests {
    ($args:tt; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                $crate::scenarios::bounded($crate::scenarios::$case $args).await;
            }
        )*
    };
}
