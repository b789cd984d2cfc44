//! [`Shared`]: what every service of one transactional layer shares (the replay core,
//! the pool, the tables), and the layer's statements before and after the handler: the
//! claim, the completion, the sweep of expired records.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, UNIX_EPOCH},
};

use bytes::Bytes;
use sqlx::{Executor, PgPool, Row};
use tower_lock_core::{AcceptedCodings, ReplayLocker};

use super::{open::OpenTransaction, tables::Tables};
use crate::{
    Rejection,
    engine::{LockKey, Record},
};

/// Expired records deleted per statement: short row locks, bounded work per sweep.
pub(super) const SWEEP_BATCH: i64 = 500;

/// The most often the layer sweeps (and at least once per retention).
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// The shortest `lock_timeout` of a claim, also when the layer does not wait (`0` would
/// mean "no limit" to Postgres): the claim's insert also waits for locks that are no
/// duplicate's (a table extension under concurrent inserts), and a duplicate must not be
/// the answer to those. A layer that does not wait finds a duplicate of its own in flight
/// at once (the key's advisory lock, see the claim function); one of another layer on the
/// same table (which waits) is answered `409` after at most this long.
const MIN_LOCK_WAIT: Duration = Duration::from_millis(100);

/// Why a completion did not commit the record.
pub(super) enum Completion {
    /// The statement failed (the connection, the server): the commit is ambiguous.
    Failed(sqlx::Error),
    /// The claimed record was not this transaction's any more: the handler ended the
    /// transaction it borrowed (a `begin()` on the lent connection, committed or dropped).
    NotOurs,
}

/// The outcome of claiming a key.
pub(super) enum Claim {
    /// The key is this request's, in this transaction: run the handler.
    Ours(OpenTransaction),
    /// A committed record answers: its replay, or a rejection (`422`, `409`, `503`).
    Answer(Result<http::Response<Bytes>, Rejection>),
}

pub(super) struct Shared {
    pub(super) replay: ReplayLocker,
    pub(super) pool: PgPool,
    pub(super) tables: Arc<Tables>,
    started: Instant,
    /// Milliseconds after `started` when the next sweep is due.
    next_sweep: AtomicU64,
    /// Sweeps that failed (see [`Shared::sweep`]).
    failed_sweeps: AtomicU64,
}

/// Whether `error` is Postgres's `lock_not_available`: the claim waited `lock_timeout`
/// on a duplicate's uncommitted claim.
fn waited_out(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| code == "55P03")
}

impl Shared {
    pub(super) fn new(replay: ReplayLocker, pool: PgPool, tables: Tables) -> Self {
        Self {
            replay,
            pool,
            tables: Arc::new(tables),
            started: Instant::now(),
            next_sweep: AtomicU64::new(0),
            failed_sweeps: AtomicU64::new(0),
        }
    }

    /// Begin the request's transaction and claim `key`, or answer from its record.
    pub(super) async fn claim(
        &self,
        key: &LockKey,
        fingerprint: &Bytes,
        accepted: AcceptedCodings,
    ) -> Claim {
        match self.try_claim(key, fingerprint, accepted).await {
            Ok(claim) => claim,
            Err(error) if waited_out(&error) => Claim::Answer(Err(self.replay.in_flight())),
            Err(error) => {
                tracing::warn!(%error, "claiming the idempotency key failed; rejecting");
                Claim::Answer(Err(self.replay.unavailable_rejection()))
            }
        }
    }

    async fn try_claim(
        &self,
        key: &LockKey,
        fingerprint: &Bytes,
        accepted: AcceptedCodings,
    ) -> Result<Claim, sqlx::Error> {
        let mut tx = OpenTransaction::begin(&self.pool).await?;
        let now = self.replay.wait().is_zero();
        let wait = self.replay.wait().max(MIN_LOCK_WAIT).as_millis();
        let retention = self.replay.retention().as_millis();
        let claim = self
            .tables
            .claim(key.as_str(), fingerprint, retention, wait, now);
        // The connection is in the transaction (or, after an error, in a failed one): it
        // ends by a commit or a rollback, never back to the pool as it is.
        let claimed = (&mut *tx).fetch_all(sqlx::raw_sql(&claim)).await;
        let row = match claimed.map(|mut rows| rows.pop()) {
            Ok(Some(row)) => row,
            Ok(None) => return Err(sqlx::Error::RowNotFound),
            Err(error) => {
                tokio::spawn(tx.rollback());
                return Err(error);
            }
        };
        if row.try_get::<bool, _>(0)? {
            return Ok(Claim::Ours(tx));
        }
        // Nothing was written: roll back after this answer, on a task of its own.
        tokio::spawn(tx.rollback());
        let Some(stored_fingerprint) = row.try_get::<Option<Vec<u8>>, _>(1)? else {
            return Ok(Claim::Answer(Err(self.replay.in_flight())));
        };
        let mut record = Record::new(
            Bytes::from(stored_fingerprint),
            Bytes::from(row.try_get::<Option<Vec<u8>>, _>(2)?.unwrap_or_default()),
            Bytes::from(row.try_get::<Option<Vec<u8>>, _>(3)?.unwrap_or_default()),
        );
        record.kept = row.try_get::<Option<bool>, _>(4)?.unwrap_or_default();
        let completed = row.try_get::<Option<i64>, _>(5)?.unwrap_or_default();
        record.completed_at =
            UNIX_EPOCH + Duration::from_millis(u64::try_from(completed).unwrap_or_default());
        Ok(Claim::Answer(self.replay.answer_record(
            record,
            fingerprint,
            accepted,
        )))
    }

    /// Write the response (or a tombstone) into the claimed record and commit it with the
    /// handler's rows, in one round trip.
    pub(super) async fn complete(
        &self,
        tx: OpenTransaction,
        key: &LockKey,
        meta: Bytes,
        body: Bytes,
    ) -> Result<(), Completion> {
        let statement = self
            .tables
            .complete_and_commit(key.as_str(), &meta, &body, true);
        match tx.commit_with(&statement).await {
            Ok(1) => Ok(()),
            Ok(_) => Err(Completion::NotOurs),
            Err(error) => Err(Completion::Failed(error)),
        }
    }

    /// Delete one batch of expired records; the number deleted. One simple-protocol
    /// message (its own transaction), so that it works behind PgBouncer in transaction
    /// mode. A failure is logged at `warn` with its cause and counted
    /// ([`failed_sweeps`](Self::failed_sweeps)).
    pub(super) async fn sweep(&self) -> Result<u64, sqlx::Error> {
        match sqlx::raw_sql(&self.tables.sweep(SWEEP_BATCH))
            .execute(&self.pool)
            .await
        {
            Ok(done) => Ok(done.rows_affected()),
            Err(error) => {
                self.failed_sweeps.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    %error,
                    "sweeping expired idempotency records failed: they stay until a sweep \
                     succeeds"
                );
                Err(error)
            }
        }
    }

    /// How many sweeps failed so far.
    pub(super) fn failed_sweeps(&self) -> u64 {
        self.failed_sweeps.load(Ordering::Relaxed)
    }

    /// Start a sweep in the background if one is due (at most once a minute, and at least
    /// once per retention), batch after batch until a batch comes back short.
    pub(super) fn sweep_if_due(self: &Arc<Self>) {
        let now = self.started.elapsed().as_millis() as u64;
        let due = self.next_sweep.load(Ordering::Relaxed);
        let every = SWEEP_EVERY.min(self.replay.retention()).as_millis() as u64;
        if now < due
            || self
                .next_sweep
                .compare_exchange(due, now + every.max(1), Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let this = Arc::clone(self);
        tokio::spawn(async move {
            // Batch after batch while they come back full; a failure is logged and counted
            // by `sweep`.
            while matches!(this.sweep().await, Ok(n) if n == SWEEP_BATCH as u64) {}
        });
    }
}
