//! The conformance suite on the in-process backend, on the real clock (the engine keeps
//! time for leases on its own thread, which a paused test clock does not drive).

use tower_lock_test_support::{conformance::memory, conformance_tests};

conformance_tests!(
    timed = #[tokio::test(flavor = "multi_thread", worker_threads = 2)],
    concurrent = #[tokio::test(flavor = "multi_thread", worker_threads = 4)],
    harness = memory(),
);
