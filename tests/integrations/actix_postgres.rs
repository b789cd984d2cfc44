//! The actix middleware on the Postgres backend, through a real socket: the scenarios
//! (written once in `tower-lock-test-support`) on the binary's throwaway cluster, each in a
//! schema of its own, with actix `HttpServer`s of several workers and a hyper-util client.

tower_lock_test_support::http_scenarios!(framework = actix, backend = Postgres);
tower_lock_test_support::parity_scenarios!(backend = Postgres);
