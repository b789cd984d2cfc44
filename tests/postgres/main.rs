//! The Postgres backend on a throwaway cluster of this binary's own: the conformance suite's
//! cases (both modes on one key included) directly and through a PgBouncer in transaction pooling mode, a
//! server crash and restart under a holder and a waiter, fences rising and every lease
//! reported lost through a `kill -9` crash or a clean restart (`restarts`), a stored record
//! through a crash (`durability`), a frozen server, killed pool and listener
//! connections, grants matched by their registration's nonce, a release sent again, the
//! set-up (schema check and the exact call it names, names, the application's own pool,
//! the connections an engine opens, tombstone
//! sweeping, upgrades), every lock operation finding its key by index on a large table
//! (`plans`), the one-statement fast paths against the waiters they race with,
//! the uncontended cycle's cost; every statement type through a PgBouncer whose two server
//! connections other clients keep busy, calls on pooled connections the server ended while
//! idle, and the configuration matrix (`matrix/`: isolation defaults, idle and statement
//! timeouts, reserved-word names, a least-privilege role, a pooler restart under load).
//!
//! `cargo test --features postgres --test postgres`; needs Debian's `postgresql` and
//! `pgbouncer` packages (`scripts/test.sh` installs them).
#![cfg(feature = "postgres")]

mod busy_pooler;
mod conformance_bouncer;
mod conformance_direct;
mod cycle;
mod dead_idle;
mod durability;
mod fast_path;
mod faults;
mod grants;
mod harness;
mod isolation;
mod late_refresh;
mod matrix;
mod order;
mod plans;
mod query_timeout;
mod restart;
mod restarts;
mod setup;
mod shared;
mod sweeping;
mod wake;
