//! Idempotency replay over real sockets (axum + hyper), on the in-process backend and on
//! Redis: the scenarios of `test-support/src/scenarios/replay.rs`.

mod in_process {
    tower_lock_test_support::replay_scenarios!(framework = Tower, backend = InProcess);
}

#[cfg(feature = "redis")]
mod redis {
    tower_lock_test_support::replay_scenarios!(framework = Tower, backend = Redis);
}
