//! The transactional idempotency layer (records committed in the handler's own Postgres
//! transaction) on a real Postgres of this binary's own, over real sockets: claims,
//! replays, `422` and `409`; rollbacks (an answer that did not happen, an error, a panic);
//! a client that left mid-handler, whose request runs on to its commit (axum and actix-web),
//! and timeouts outside and inside the layer; requests dropped mid-commit and mid-rollback;
//! tombstones; twenty
//! concurrent duplicates from two server processes; server processes killed before and
//! after the commit; Postgres restarted mid-request; duplicates waiting under a database
//! default isolation of `serializable` and of `repeatable read`; a schema and a prefix that
//! are reserved words;
//! the fence check against a holder whose process was stopped past its lease, in the
//! request's transaction and under a plain `LockLayer` (`FenceTable`); the
//! configuration matrix (`matrix`: server settings, least privilege, restarts under load,
//! what PgBouncer needs). The
//! duplicates, the kills and the fence check run directly and through PgBouncer in
//! transaction mode; the kills on axum and on actix-web. Every count is the business
//! table's, not the layer's word.
//!
//! `cargo test --features postgres --test transactional`; needs Debian's `postgresql` and
//! `pgbouncer` packages.
#![cfg(feature = "postgres")]

mod actix;
mod app;
mod behaviour;
mod busy_pooler;
mod cancelled;
mod child;
mod crash;
mod duplicates;
mod fence;
mod grpc;
mod isolation;
mod left;
mod logs;
mod matrix;
mod misuse;
mod names;
mod setup;
