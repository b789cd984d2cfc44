//! The layer through a real server socket (axum on 127.0.0.1:0, hyper-util client), on
//! the in-process engine (and an unavailable backend for the failure policies). The
//! scenarios are written once in `tower-lock-test-support` (`scenarios`) and run here,
//! on Redis (`redis.rs` beside it) and under the actix middleware
//! (`tests/integrations/actix.rs`).

tower_lock_test_support::http_scenarios!(framework = tower, backend = InProcess);
tower_lock_test_support::unavailable_backend_scenarios!(framework = tower);
