//! A database whose default isolation is `serializable`, and one whose default is
//! `repeatable read`: every call must still run at `READ COMMITTED` (the functions re-read
//! a key's row after waiting for its lock; a stricter level fails that with `could not
//! serialize access`). The cases that make calls wait for one another's row locks: hand-offs
//! in arrival order, simultaneous tries, shared grants, an admin hand-off, compare-and-set,
//! a completion granting a waiter; and the migration itself.

mod serializable {
    use tower_lock_test_support::conformance_tests;

    use super::super::harness_on;

    const SETTINGS: &[(&str, &str)] = &[("default_transaction_isolation", "serializable")];

    conformance_tests!(@in_mode [tokio::test(flavor = "multi_thread", worker_threads = 2)]
        harness_on("m_serializable", SETTINGS), tower_lock::engine::Mode::Exclusive;
        fifo_grants_in_arrival_order_with_zero_overtakes,
        only_one_of_simultaneous_tries_wins,
    );

    conformance_tests!(@cases [tokio::test(flavor = "multi_thread", worker_threads = 2)]
        harness_on("m_serializable", SETTINGS);
        shared_grants_follow_arrival_order_across_limits,
        admin_force_release_hands_the_key_to_the_next_waiter,
        numeric_compare_and_set_follows_each_comparison,
        a_waiter_granted_by_a_completion_finds_the_record,
    );
}

mod repeatable_read {
    use tower_lock_test_support::conformance_tests;

    use super::super::harness_on;

    const SETTINGS: &[(&str, &str)] = &[("default_transaction_isolation", "repeatable read")];

    conformance_tests!(@in_mode [tokio::test(flavor = "multi_thread", worker_threads = 2)]
        harness_on("m_repeatable_read", SETTINGS), tower_lock::engine::Mode::Exclusive;
        fifo_grants_in_arrival_order_with_zero_overtakes,
        only_one_of_simultaneous_tries_wins,
    );

    conformance_tests!(@cases [tokio::test(flavor = "multi_thread", worker_threads = 2)]
        harness_on("m_repeatable_read", SETTINGS);
        shared_grants_follow_arrival_order_across_limits,
        a_waiter_granted_by_a_completion_finds_the_record,
    );
}
