//! The actix middleware on the Redis backend, through a real socket: the scenarios
//! (written once in `tower-lock-test-support`) on a shared redis-server, each under its own
//! key prefix, with actix `HttpServer`s of several workers and a hyper-util client.

tower_lock_test_support::http_scenarios!(framework = actix, backend = Redis);
tower_lock_test_support::parity_scenarios!(backend = Redis);
