//! The sweeper: a task per backend, on the engine's runtime, that deletes the rows nothing
//! holds any more (fence tombstones and lapsed leases past [`TOMBSTONE_MARGIN`], dead
//! tickets, expired numbers and records), so released keys leave no rows for longer than a
//! bounded time; and the sweep it runs, also reachable as
//! [`PostgresBackend::sweep`](super::PostgresBackend::sweep).
//!
//! A sweep is a series of calls of the schema's `sweep`, each its own transaction deleting at
//! most [`BATCH`] rows per table, found by an index on their expiry: a sweep costs what
//! expired, not the size of the tables, and holds no row lock for long. One node of the
//! fleet sweeps at a time (a transaction-level advisory lock): the background sweeper of a
//! node that finds another sweeping does nothing this round.
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

use sqlx::{PgPool, Row};

use super::{SWEEP_EVERY, TOMBSTONE_MARGIN, backend_error, millis, sql::Call, timed_out};
use crate::{LockError, runtime};

/// Rows per table one call deletes at most.
pub(super) const BATCH: i64 = 1000;

/// One backend's sweep: its statements (each a single simple-protocol message, so that it
/// works behind PgBouncer in transaction mode) and the count of those that failed.
#[derive(Clone)]
pub(super) struct Sweep {
    pool: PgPool,
    /// The call that leaves the work to another node sweeping now, and the one that waits
    /// for it.
    try_sql: Arc<str>,
    wait_sql: Arc<str>,
    timeout: Duration,
    failed: Arc<AtomicU64>,
}

impl Sweep {
    /// The sweep of `function` (the schema's `sweep`) on `pool`, each call bounded by
    /// `timeout`.
    pub(super) fn new(pool: PgPool, function: &str, timeout: Duration) -> Self {
        let sql = |try_only| {
            Call::function(function)
                .int(millis(TOMBSTONE_MARGIN))
                .int(BATCH)
                .int(try_only)
                .finish()
        };
        Self {
            pool,
            try_sql: sql(1).into(),
            wait_sql: sql(0).into(),
            timeout,
            failed: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Sweep until a call deletes fewer than [`BATCH`] rows: `None` when another node was
    /// sweeping and `wait` is false (nothing done), else the rows deleted. A failure is
    /// logged at `warn` and counted.
    pub(super) async fn run(&self, wait: bool) -> Result<Option<u64>, LockError> {
        let sql = if wait { &self.wait_sql } else { &self.try_sql };
        let mut deleted = 0;
        loop {
            let call = sqlx::raw_sql(sql).fetch_one(&self.pool);
            let outcome = match tokio::time::timeout(self.timeout, call).await {
                Ok(Ok(row)) => match row.try_get::<i64, _>(0) {
                    Ok(n) if n < 0 => return Ok(None),
                    Ok(n) => {
                        deleted += n.unsigned_abs();
                        if n < BATCH {
                            return Ok(Some(deleted));
                        }
                        continue;
                    }
                    Err(error) => backend_error("sweep", error),
                },
                Ok(Err(error)) => backend_error("sweep", error),
                Err(_) => timed_out("sweep", self.timeout),
            };
            self.failed.fetch_add(1, Ordering::Relaxed);
            // The error's text carries the database's cause.
            tracing::warn!(
                error = %outcome,
                "postgres sweep failed: lapsed rows stay until a sweep succeeds"
            );
            return Err(outcome);
        }
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
                // Logged and counted by `run`; another node sweeping now does the work.
                let _ = sweep.run(false).await;
            }
        });
        Self(task.abort_handle())
    }
}
