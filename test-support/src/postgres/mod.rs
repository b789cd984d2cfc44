//! A throwaway Postgres cluster of the test's own on a free loopback port, and a PgBouncer
//! in transaction pooling mode in front of it. No client library: the tests reach the
//! database through the backend under test (and its pool), the fixtures through `psql`.

mod bouncer;
mod server;

pub use bouncer::PgBouncer;
pub use server::{PostgresServer, TEST_USER};
