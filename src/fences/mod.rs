//! Fenced writes on Postgres (feature `postgres`): a lease's fence checked against a
//! per-key high-water mark in the transaction of the writes it guards, so that a holder
//! paused past its lease (a GC pause, a partition) cannot write after a newer holder did.
//!
//! [`FenceTable`] is the high-water-mark table (`public.tower_lock_fences` by default) and
//! its check, for a handler under a plain [`LockLayer`](crate::LockLayer) that writes in a
//! transaction of its own. The transactional idempotency layer's
//! `BorrowedTransaction::check_fence` is the same check on the same table, in the request's
//! transaction.
//!
//! ```no_run
//! use axum::{Extension, http::StatusCode};
//! use tower_lock::{FenceError, FenceTable, LeaseInfo, sqlx::PgPool};
//!
//! async fn rebuild(
//!     Extension(pool): Extension<PgPool>,
//!     Extension(fences): Extension<FenceTable>,
//!     Extension(lease): Extension<LeaseInfo>,
//! ) -> StatusCode {
//!     let Ok(mut tx) = pool.begin().await else { return StatusCode::SERVICE_UNAVAILABLE };
//!     match fences.check(&mut tx, &lease).await {
//!         Ok(()) => {}
//!         // A newer holder already wrote: this one's lease ran out. Dropped, `tx` rolls back.
//!         Err(FenceError::Stale { .. }) => return StatusCode::CONFLICT,
//!         Err(_) => return StatusCode::SERVICE_UNAVAILABLE,
//!     }
//!     // ... the writes the lock guards, on `&mut *tx` ...
//!     match tx.commit().await {
//!         Ok(()) => StatusCode::OK,
//!         Err(_) => StatusCode::SERVICE_UNAVAILABLE,
//!     }
//! }
//!
//! # async fn run(pool: PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! let fences = FenceTable::new("public", "tower_lock_")?; // the defaults: FenceTable::default()
//! fences.migrate(&pool).await?; // once: creates the table if missing
//! # Ok(())
//! # }
//! ```

mod fence_error;
mod fence_table;
mod names;

pub use fence_error::FenceError;
pub use fence_table::FenceTable;
pub(crate) use names::plain;
