//! A database whose `statement_timeout` (100 ms) is shorter than the waits asked for (up to
//! seconds): a wait is never one statement (a waiter's attempts are each short, and it waits
//! between them for a notification or its fallback timer), so it outlasts the timeout. The
//! cases that wait: in arrival order, to the end of the wait, with waiters given up.

use tower_lock_test_support::conformance_tests;

use super::harness_on;

const SETTINGS: &[(&str, &str)] = &[("statement_timeout", "100ms")];

conformance_tests!(@in_mode [tokio::test(flavor = "multi_thread", worker_threads = 2)]
    harness_on("m_statement_timeout", SETTINGS), tower_lock::engine::Mode::Exclusive;
    fifo_grants_in_arrival_order_with_zero_overtakes,
    acquire_times_out_after_wait_limit,
    timed_out_waiters_leave_no_residue,
    a_waiter_is_granted_when_a_shorter_successor_lease_expires,
);
