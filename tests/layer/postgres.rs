//! The layer through a real server socket (axum on 127.0.0.1:0, hyper-util client), on the
//! Postgres backend: the HTTP scenarios (written once in `tower-lock-test-support`) on the
//! binary's throwaway cluster, each in a schema of its own; directly, and through a
//! PgBouncer in transaction pooling mode (every statement may meet another server
//! connection; the listener connects directly).
#![cfg(feature = "postgres")]

mod direct {
    tower_lock_test_support::http_scenarios!(framework = tower, backend = Postgres);
}

mod bouncer {
    tower_lock_test_support::http_scenarios!(framework = tower, backend = PostgresBouncer);
}
