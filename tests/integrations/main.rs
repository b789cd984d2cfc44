//! The framework integrations through real sockets: tower-lock-axum (extractors, route
//! keys, `route_layer`; two nodes on Redis) and tower-lock-actix (the HTTP scenarios, the
//! parity with the tower layer, idempotency replay; in process, on Redis and on Postgres).
//!
//! One test binary for both crates (each would otherwise link tower-lock, axum, actix and
//! hyper once more); each module is the file of one theme, its tests named as before under
//! the module's name (`cargo test --test integrations actix_redis::`).

mod actix;
#[cfg(feature = "postgres")]
mod actix_postgres;
#[cfg(feature = "redis")]
mod actix_redis;
mod actix_replay;
mod axum;
#[cfg(feature = "redis")]
mod axum_redis;
mod dry_run;
mod holder_label;
mod permits;
mod routing;
