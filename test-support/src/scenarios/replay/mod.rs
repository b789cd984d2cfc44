//! Idempotency replay over real sockets: each scenario serves an app of its own under an
//! [`IdempotencyLayer`](tower_lock::IdempotencyLayer) and checks what clients see, how
//! often the handlers ran, and what the backend kept.
//!
//! | module | the scenarios |
//! | --- | --- |
//! | `app` | none: the app they all serve, [`replay_app`] |
//! | `protocol` | replay after completion, duplicates in flight, retention, bad keys, options |
//! | `fingerprint` | a key reused with another request is `422` |
//! | `scope` | a stored response goes to its own caller only |
//! | `storage` | which answers are stored |
//! | `status_policy` | the status decides what "it did not happen" is; `store_if` the rest |
//! | `canonical_json` | JSON formatting is forgiven, numbers and repeated members are not |
//! | `custom_fingerprint` | a custom fingerprint adds to the default one |
//! | `long_keys` | any legal key works under any scope |
//! | `keep_running` | the handler outlives its client; panics cost one request |

use std::time::Duration;

use tokio::time::{Instant, sleep};
use tower_lock::{IdempotencyLayer, IdempotencyLayerBuilder};

use super::idempotency_lock_key;
use crate::http::{Reply, TestServer};

mod app;
mod canonical_json;
mod custom_fingerprint;
mod fingerprint;
mod keep_running;
mod long_keys;
mod protocol;
mod scope;
mod status_policy;
mod storage;

pub use app::{ReplayApp, replay_app};
pub use canonical_json::*;
pub use custom_fingerprint::*;
pub use fingerprint::*;
pub use keep_running::*;
pub use long_keys::*;
pub use protocol::*;
pub use scope::*;
pub use status_policy::*;
pub use storage::*;

fn key(k: &str) -> [(&'static str, String); 1] {
    [("idempotency-key", format!("\"{k}\""))]
}

async fn post_with(server: &TestServer, path: &str, k: &str, body: &str) -> Reply {
    let [(name, value)] = key(k);
    server
        .send_body("POST", path, &[(name, value.as_str())], body.to_owned())
        .await
}

/// `POST path` with idempotency key `k` and no body, written on a plain TCP connection
/// (with the `Host` the test client sends).
async fn raw_post(server: &TestServer, path: &str, k: &str) -> tokio::net::TcpStream {
    let request = format!(
        "POST {path} HTTP/1.1\r\nhost: {}\r\nidempotency-key: \"{k}\"\r\ncontent-length: 0\r\n\r\n",
        server.addr()
    );
    server.raw(&request).await
}

/// The preset on an anonymous endpoint: every client shares the records (the scenarios
/// that are about scope choose their own).
fn preset(table: &super::LockTable) -> IdempotencyLayerBuilder {
    IdempotencyLayer::builder(table.engine()).unscoped()
}

/// The preset with the drain of a body nobody reads bounded to a short time.
fn drain_bounded(builder: IdempotencyLayerBuilder) -> IdempotencyLayerBuilder {
    builder.max_drain_time(Duration::from_millis(300))
}

/// Wait (bounded) until `key` has a record: the first request's response is stored when
/// its body ends, on the server's side of the connection.
async fn until_recorded(table: &super::LockTable, k: &str) {
    let key = tower_lock::LockKey::new(idempotency_lock_key(k)).unwrap();
    let give_up = Instant::now() + Duration::from_secs(10);
    while table.engine().record(&key).await.unwrap().is_none() {
        assert!(Instant::now() < give_up, "no record for {k}");
        sleep(Duration::from_millis(2)).await;
    }
}

/// Instantiate the replay scenarios on one framework and one backend.
#[macro_export]
macro_rules! replay_scenarios {
    (framework = $framework:ident, backend = $backend:ident $(,)?) => {
        $crate::replay_scenarios!(@cases $framework $backend;
            a_retry_after_completion_gets_the_stored_response,
            a_reused_key_with_another_request_is_422,
            a_duplicate_in_flight_is_409_then_replayed,
            twenty_waiting_duplicates_run_the_handler_once,
            a_client_leaving_mid_handler_still_gets_its_replay,
            a_client_leaving_mid_body_still_gets_the_whole_body_stored,
            a_streaming_body_is_stored_in_full,
            an_oversized_response_is_not_replayed_nor_run_again,
            records_expire_after_the_retention,
            bad_keys_are_400_and_oversized_requests_413,
            the_quick_start_preset_never_replays_a_response_to_another_caller,
            a_key_reused_on_another_host_is_422_where_the_host_counts,
            a_retry_on_another_node_is_replayed,
            every_value_of_a_fingerprinted_header_counts,
            a_panicking_body_or_handler_costs_only_its_own_request,
            an_endless_body_after_its_client_left_is_cut_off,
            a_scoped_preset_replays_only_to_the_caller_who_made_it,
            a_custom_key_header_replay_hook_canonical_json_and_record_removal,
            store_if_is_asked_about_everything_the_fixed_policy_allows,
            canonical_json_never_lets_one_number_or_member_stand_for_another,
            a_custom_fingerprint_keeps_the_query_and_the_host,
            the_longest_key_works_under_a_long_scope,
        );
        // A retry sent as soon as the first answer has arrived: the key's release (or the
        // record written with it) must be applied before it.
        $crate::replay_scenarios!(@cases $framework $backend;
            server_errors_are_not_stored_unless_asked,
            answers_that_mean_try_again_are_never_stored,
            an_accepted_job_with_retry_after_is_stored,
            the_application_decides_what_else_is_stored,
        );
    };
    (@cases $framework:ident $backend:ident; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let stack = $crate::scenarios::Stack::new(
                    $crate::scenarios::Framework::$framework,
                    $crate::scenarios::Backend::$backend,
                );
                $crate::scenarios::bounded($crate::scenarios::$case(stack)).await;
            }
        )*
    };
}
