//! Idempotency replay on actix-web through a real socket (an actix `HttpServer` with
//! several workers), on the in-process backend, on Redis and on Postgres: the same scenarios as the
//! tower layer's `tests/replay/main.rs`.

mod in_process {
    tower_lock_test_support::replay_scenarios!(framework = Actix, backend = InProcess);
}

#[cfg(feature = "redis")]
mod redis {
    tower_lock_test_support::replay_scenarios!(framework = Actix, backend = Redis);
}

#[cfg(feature = "postgres")]
mod postgres {
    tower_lock_test_support::replay_scenarios!(framework = Actix, backend = Postgres);
}
