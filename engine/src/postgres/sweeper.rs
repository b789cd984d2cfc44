//! The sweeper: a task per backend, on the engine's runtime, that deletes the rows nothing
//! holds any more (fence tombstones and lapsed leases past [`TOMBSTONE_MARGIN`], dead
//! tickets, expired numbers and records), so released keys leave no rows for longer than a
//! bounded time; and the one sweep it runs, also reachable as
//! [`PostgresBackend::sweep`](super::PostgresBackend::sweep).
//!
//! A failed sweep is a `warn!` with its cause and is counted
//! ([`PostgresBackend::failed_sweeps`](super::PostgresBackend::failed_sweeps)): rows that
//! nothing deletes pile up unseen otherwise.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use sqlx::PgPool;

use super::{SWEEP_EVERY, TOMBSTONE_MARGIN, backend_error, millis, sql::Call, timed_out};
use crate::{LockError, runtime};

/// One backend's sweep: its statement (a single simple-protocol message, so that it works
/// behind PgBouncer in transaction mode) and the count of those that failed.
#[derive(Clone)]
pub(super) struct Sweep {
    pool: PgPool,
    sql: Arc<str>,
    timeout: Duration,
    failed: Arc<AtomicU64>,
}

impl Sweep {
    /// The sweep of `function` (the schema's `sweep`) on `pool`, each bounded by `timeout`.
    pub(super) fn new(pool: PgPool, function: &str, timeout: Duration) -> Self {
        let sql = Call::function(function)
            .int(millis(TOMBSTONE_MARGIN))
            .finish();
        Self {
            pool,
            sql: sql.into(),
            timeout,
            failed: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Sweep once; a failure is logged at `warn` and counted.
    pub(super) async fn run(&self) -> Result<(), LockError> {
        let sweep = sqlx::raw_sql(&self.sql).execute(&self.pool);
        let outcome = match tokio::time::timeout(self.timeout, sweep).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(error)) => backend_error("sweep", error),
            Err(_) => timed_out("sweep", self.timeout),
        };
        self.failed.fetch_add(1, Ordering::Relaxed);
        // The error's text carries the database's cause.
        tracing::warn!(
            error = %outcome,
            "postgres sweep failed: lapsed rows stay until a sweep succeeds"
        );
        Err(outcome)
    }

    /// How many sweeps failed so far.
    pub(super) fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }
}

/// The running sweeper; dropping it stops it.
pub(super) struct Sweeper(tokio::task::AbortHandle);

impl Drop for Sweeper {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Sweeper {
    /// Run `sweep` every [`SWEEP_EVERY`] on the engine's runtime.
    pub(super) fn start(sweep: Sweep) -> Self {
        let task = runtime::handle().spawn(async move {
            let mut every = tokio::time::interval(SWEEP_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                // Logged and counted by `run`.
                let _ = sweep.run().await;
            }
        });
        Self(task.abort_handle())
    }
}
