//! Idempotency replay over real sockets (axum + hyper), on the in-process backend and on
//! Redis: the scenarios of `test-support/src/scenarios/replay.rs`.

mod in_process {
    tower_lock_test_support::replay_scenarios!(framework = Tower, backend = InProcess);
    tower_lock_test_support::scenario_tests!(
        (tower_lock_test_support::scenarios::Backend::InProcess);
        nested_routers_bind_records_to_the_full_target,
    );
}

#[cfg(feature = "redis")]
mod redis {
    tower_lock_test_support::replay_scenarios!(framework = Tower, backend = Redis);
    tower_lock_test_support::scenario_tests!(
        (tower_lock_test_support::scenarios::Backend::Redis);
        nested_routers_bind_records_to_the_full_target,
    );
}
