//! The sweeper: a task per backend, on the engine's runtime, that deletes the rows nothing
//! holds any more (fence tombstones and lapsed leases past [`TOMBSTONE_MARGIN`], dead
//! tickets), so released keys leave no rows for longer than a bounded time.

use sqlx::PgPool;

use super::{SWEEP_EVERY, TOMBSTONE_MARGIN, millis, sql::Call};
use crate::runtime;

/// The running sweeper; dropping it stops it.
pub(super) struct Sweeper(tokio::task::AbortHandle);

impl Drop for Sweeper {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Sweeper {
    /// Sweep with `function` (the schema's `sweep`) every [`SWEEP_EVERY`].
    pub(super) fn start(pool: PgPool, function: &str, timeout: std::time::Duration) -> Self {
        let sql = Call::function(function)
            .int(millis(TOMBSTONE_MARGIN))
            .finish();
        let task = runtime::handle().spawn(async move {
            let mut every = tokio::time::interval(SWEEP_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                let sweep = sqlx::raw_sql(&sql).execute(&pool);
                match tokio::time::timeout(timeout, sweep).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(error)) => tracing::debug!(%error, "postgres sweep failed"),
                    Err(_) => tracing::debug!("postgres sweep timed out"),
                }
            }
        });
        Self(task.abort_handle())
    }
}
