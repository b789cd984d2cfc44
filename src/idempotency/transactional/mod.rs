//! Exactly once for database writes: idempotency records committed in the handler's own
//! Postgres transaction (features `postgres` and `idempotency`).
//!
//! [`IdempotencyLayerBuilder::transactional`](crate::IdempotencyLayerBuilder::transactional)
//! turns an idempotency builder (its scope, key header, fingerprint, store policy, limits,
//! problem bodies, `wait`, `Retry-After`, metrics and `on_replay` unchanged) into a
//! [`TransactionalLayer`] whose records live in a table of the application's database.
//! For each covered request, every step one statement on the request's transaction:
//!
//! 1. **begin**, and **claim** the key with an `INSERT … ON CONFLICT DO NOTHING` into the
//!    records table, in one round trip. A concurrent duplicate waits on the unique index,
//!    bounded by the layer's `wait` (a transaction-local `lock_timeout`, at least 100 ms:
//!    an insert may also wait for a table extension, which is no duplicate), then gets the
//!    replay, or `409` with `Retry-After`. Under `wait(0)` a duplicate in flight is
//!    answered `409` at once (the key's transaction-level advisory lock, tried first); one
//!    claimed through another layer on the same table that waits, within 100 ms. A
//!    committed record with the same fingerprint is **replayed**, another is **`422`**.
//! 2. run the handler, which **borrows the transaction** ([`LentTransaction`] in the
//!    request extensions; `tower_lock_axum::Tx` dereferences to sqlx's `PgConnection`
//!    and cannot commit or roll back);
//! 3. a storable answer (the idempotency layer's policy) is buffered (within
//!    `max_response_body`) and written into the record, which **commits with the
//!    handler's rows before the client sees a byte** (the write and `COMMIT` in one round
//!    trip); a response over the limits commits a
//!    tombstone (a retry is answered `409` `response-not-stored`, never run again);
//! 4. an answer that means "it did not happen" (`4xx` validation, `409`, `5xx`, a
//!    [`NotStored`](crate::NotStored) mark), an error or a panic **rolls everything
//!    back**: the retry runs cleanly.
//!
//! **A client that leaves does not cancel the request**, as with the engine-backed layer:
//! once the handler began, a dropped response future (the client left, or a
//! `tower::timeout` outside the layer fired: the two cannot be told apart) hands the rest
//! to a task of its own ([`RunsOn`]), which commits the record with the handler's rows, or
//! rolls back; the retry waits for it (under `wait`) and gets the replay. The bound is the
//! engine-backed layer's: the handler runs to its end, and the response body is read for at
//! most `max_drain_time` once the client has left, counted from the later of its departure
//! and the start of the body's read (as the engine-backed layer's drain; then a tombstone:
//! `409 response-not-stored`). A deadline that must cancel belongs inside the layer (a
//! `tower::timeout::TimeoutLayer` between it and the handler): the handler's error, or the
//! `408` made of it, rolls back. A duplicate waiting for its claim, or a request body still
//! being read, is cancelled by a drop: nothing happened yet.
//!
//! **Isolation.** The transaction runs at the database's (or the role's) default
//! isolation; the layer sets none: a team that set `serializable` chose it for its
//! handlers. Under `repeatable read` or `serializable`, a duplicate whose claim waited for
//! the first request's commit fails with a serialization failure (`40001`; a deadlock,
//! `40P01`, the same): that wait ended, and the claim is made again in a fresh transaction,
//! whose snapshot sees the record (a replay, `422`, or the key claimed), within what is left
//! of `wait` (and once more when nothing is left), never a `503`.
//!
//! A handler's mistakes with the transaction are answered `500` naming them, with nothing
//! committed or stored, and logged (throttled): a `COMMIT` or `ROLLBACK` statement on it
//! (a `COMMIT` fails: `migrate()` puts a check deferred to the commit on the records
//! table that refuses a claim without its response; after a `ROLLBACK`, the record write
//! finds no claim of its transaction and refuses before the layer's `COMMIT`, so nothing
//! the handler wrote after it commits either), a failed statement it handled
//! outside a savepoint, a second borrow (refused at once, [`BorrowError`]), a borrow kept
//! past its return.
//!
//! A process that dies before the commit leaves nothing; one that dies after it leaves a
//! record the retry replays. With a `LockLayer` in front,
//! [`BorrowedTransaction::check_fence`] checks the lease's fence against a per-key
//! high-water mark in the same transaction and refuses a stale holder's writes. Retention
//! counts from the commit (the record write sets the expiry, by the database's clock);
//! expired records are deleted in batches by the layer itself.
//!
//! **Limits.** Effects outside the database (a card network, an email) are not in the
//! transaction: write a job row (an outbox) in it and send after the commit. A handler
//! holds a pooled connection and an open transaction while it runs: give it a deadline (inside the layer),
//! and set `idle_in_transaction_session_timeout` on the role. Behind PgBouncer in
//! transaction mode it works unchanged (one transaction per request; the layer's
//! statements are unnamed); the handler's own bound queries must be too
//! (`sqlx::query(..).persistent(false)` on each: `statement_cache_capacity(0)` still names
//! them), and its queries outside the transaction simple (`sqlx::raw_sql`) or in an
//! explicit transaction: `docs/transactional.md`, "Behind PgBouncer".
//!
//! ```no_run
//! use std::fmt;
//! use tower_lock::{IdempotencyLayer, LockEngine};
//!
//! #[derive(Clone)]
//! struct AccountId(u64);
//!
//! impl fmt::Display for AccountId {
//!     fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
//!         write!(f, "{}", self.0)
//!     }
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = sqlx::PgPool::connect("postgres://localhost/payments").await?;
//! // The engine only derives keys here: the records table's unique index orders duplicates.
//! let builder = IdempotencyLayer::builder(LockEngine::in_memory())
//!     .per_principal::<AccountId>()
//!     .transactional(pool);
//! builder.migrate().await?; // once: creates the tables if missing
//! let layer = builder.build().await?;
//! # let _ = layer;
//! # Ok(())
//! # }
//! ```

mod body;
mod borrow_error;
mod borrowed;
mod builder;
mod first_request;
mod flow;
mod in_flight;
mod layer;
mod lent;
mod misuse;
mod open;
mod protocol;
mod runs_on;
mod service;
mod setup_error;
mod shared;
mod tables;

pub use crate::fences::FenceError;
pub use body::TransactionalBody;
pub use borrow_error::BorrowError;
pub use borrowed::BorrowedTransaction;
pub use builder::TransactionalLayerBuilder;
pub use layer::TransactionalLayer;
pub use lent::LentTransaction;
pub use protocol::{Answer, Claimed, Coverage, PendingClaim, Settled, Storing};
pub use runs_on::RunsOn;
pub use service::{TransactionalFuture, TransactionalService};
pub use setup_error::SetupError;
