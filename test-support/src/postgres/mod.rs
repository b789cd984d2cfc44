//! A throwaway Postgres cluster of the test's own on a free loopback port, and a PgBouncer
//! in transaction pooling mode in front of it (its pool size chosen), with other clients
//! keeping it busy ([`BusyClients`], feature `postgres`). No client library in the
//! fixtures themselves: the tests reach the database through the backend under test (and
//! its pool), the fixtures through `psql`.

mod bouncer;
#[cfg(feature = "postgres")]
mod busy;
mod guardian;
mod processes;
mod server;

pub use bouncer::PgBouncer;
#[cfg(feature = "postgres")]
pub use busy::BusyClients;
pub use server::{PostgresServer, TEST_USER};
