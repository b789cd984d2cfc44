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
use sqlx::{PgPool, Row};
use tower_lock_core::{AcceptedCodings, ReplayLocker};

use super::{
    misuse::MisuseLog,
    open::{Begun, OpenTransaction, uncounted, uncounted_rollback},
    tables::{CLAIM_COLUMNS, NOT_CLAIMED, NOT_OURS, Tables},
};
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
    /// transaction it borrowed (a `COMMIT` or `ROLLBACK` statement on the lent connection).
    NotOurs,
    /// A statement of the handler's failed inside the transaction (which Postgres then
    /// aborted) and the handler answered anyway: nothing committed.
    Aborted,
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
    /// The throttled logs of handlers' mistakes with the lent transaction.
    pub(super) misuse: Arc<MisuseLog>,
    started: Instant,
    /// Milliseconds after `started` when the next sweep is due.
    next_sweep: AtomicU64,
    /// Sweeps that failed (see [`Shared::sweep`]).
    failed_sweeps: AtomicU64,
}

/// Whether `error` is Postgres's `in_failed_sql_transaction`: a statement met a
/// transaction that an earlier failed statement aborted.
fn in_aborted_transaction(error: &sqlx::Error) -> bool {
    has_code(error, "25P02")
}

/// Whether `error` has SQLSTATE `code`.
fn has_code(error: &sqlx::Error, code: &str) -> bool {
    error
        .as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|c| c == code)
}

/// Whether `error` is Postgres's `lock_not_available`: the claim waited `lock_timeout`
/// on a duplicate's uncommitted claim.
fn waited_out(error: &sqlx::Error) -> bool {
    has_code(error, "55P03")
}

/// Whether the claim failed because its wait ended under a snapshot that cannot see why:
/// a serialization failure (`40001`: under `repeatable read` or `serializable`, the
/// insert that waited on a duplicate's claim meets the record it committed after the
/// transaction's snapshot; or the delete of an expired record meets a concurrent
/// change), or a deadlock (`40P01`) the server broke by aborting the claim. Nothing was
/// written: a fresh transaction, with a fresh snapshot, sees the committed record.
fn wait_ended(error: &sqlx::Error) -> bool {
    has_code(error, "40001") || has_code(error, "40P01")
}

impl Shared {
    pub(super) fn new(replay: ReplayLocker, pool: PgPool, tables: Tables) -> Self {
        Self {
            replay,
            pool,
            tables: Arc::new(tables),
            misuse: Arc::default(),
            started: Instant::now(),
            next_sweep: AtomicU64::new(0),
            failed_sweeps: AtomicU64::new(0),
        }
    }

    /// Begin the request's transaction and claim `key`, or answer from its record.
    ///
    /// The transaction runs at the database's (or the role's) default isolation: a team
    /// that set `serializable` chose it for its handlers. Under `repeatable read` or
    /// `serializable`, a claim that waited for a duplicate which then committed fails
    /// with a serialization failure ([`wait_ended`]): that wait ended, so the claim is
    /// made again in a fresh transaction (whose snapshot sees the record: a replay,
    /// `422`, or the key claimed), within what is left of the layer's `wait`, and once
    /// more when nothing is left (it does not wait on a committed record), never a `503`.
    pub(super) async fn claim(
        &self,
        key: &LockKey,
        fingerprint: &Bytes,
        accepted: AcceptedCodings,
    ) -> Claim {
        let deadline = Instant::now() + self.replay.wait();
        let mut claimed_at_the_deadline = false;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.try_claim(key, fingerprint, &accepted, left).await {
                Ok(claim) => return claim,
                Err(error) if waited_out(&error) => {
                    return Claim::Answer(Err(self.replay.in_flight()));
                }
                Err(error) if wait_ended(&error) => {
                    if left.is_zero() && std::mem::replace(&mut claimed_at_the_deadline, true) {
                        // Every claim ended so, to the end of the wait: keys claimed and
                        // committed again and again, a duplicate's in flight.
                        return Claim::Answer(Err(self.replay.in_flight()));
                    }
                    tracing::debug!(%error, "the claim's wait ended in a serialization failure; claiming again");
                }
                Err(error) => {
                    tracing::warn!(%error, "claiming the idempotency key failed; rejecting");
                    return Claim::Answer(Err(self.replay.unavailable_rejection()));
                }
            }
        }
    }

    /// One claim in a transaction of its own, waiting at most `left` (at least
    /// [`MIN_LOCK_WAIT`]) for a duplicate in flight.
    ///
    /// A first request's claim is one round trip: `BEGIN` and the claim in sqlx's `begin`
    /// statement ([`Tables::begin_and_claim`]), whose rows sqlx does not return; a key
    /// that is not this request's is refused there ([`NOT_CLAIMED`]), and the next message
    /// rolls that back and claims again the way that returns the record (a replay's
    /// second round trip, as before this fast path, which cost every first request one
    /// more: the `BEGIN` of its own). The first claim does not bound its own
    /// `statement_timeout` (two statements more on every request); one that a shorter
    /// `statement_timeout` cut (`57014`: it waited for a duplicate) is made again in that
    /// second message, which does, within what is left of the wait.
    async fn try_claim(
        &self,
        key: &LockKey,
        fingerprint: &Bytes,
        accepted: &AcceptedCodings,
        left: Duration,
    ) -> Result<Claim, sqlx::Error> {
        let now = self.replay.wait().is_zero();
        let started = Instant::now();
        let wait = left.max(MIN_LOCK_WAIT).as_millis();
        let retention = self.replay.retention().as_millis();
        let first = self
            .tables
            .begin_and_claim(key.as_str(), fingerprint, retention, wait, now);
        let conn = match OpenTransaction::begin_with(&self.pool, first).await? {
            Begun::Open(tx) => return Ok(Claim::Ours(tx)),
            // Not this request's; or a `statement_timeout` shorter than the wait cut the
            // claim while it waited for a duplicate (`57014`): claimed again the way that
            // bounds its own `statement_timeout`, within what is left of the wait.
            Begun::Refused(error, conn)
                if has_code(&error, NOT_CLAIMED) || has_code(&error, "57014") =>
            {
                conn
            }
            Begun::Refused(error, conn) => {
                uncounted_rollback(conn);
                return Err(error);
            }
        };
        // What is left of the wait after the first claim's (which waited for the duplicate,
        // or until a `statement_timeout` cut it).
        let wait = left
            .saturating_sub(started.elapsed())
            .max(MIN_LOCK_WAIT)
            .as_millis();
        let claim = self
            .tables
            .claim(key.as_str(), fingerprint, retention, wait, now);
        let (rows, conn) = uncounted(conn, &format!("ROLLBACK; BEGIN; {claim}")).await?;
        // The rows of the statements around the claim's have other columns.
        let Some(row) = rows.into_iter().find(|r| r.len() == CLAIM_COLUMNS) else {
            uncounted_rollback(conn);
            return Err(sqlx::Error::RowNotFound);
        };
        let claimed = match row.try_get::<bool, _>(0) {
            Ok(claimed) => claimed,
            Err(error) => {
                uncounted_rollback(conn);
                return Err(error);
            }
        };
        if claimed {
            // The duplicate that held the key rolled back in between: the key is ours, in
            // a transaction sqlx is yet to count.
            return Ok(Claim::Ours(OpenTransaction::adopt(conn).await?));
        }
        // Nothing was written: roll back after this answer, on a task of its own.
        uncounted_rollback(conn);
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
            accepted.clone(),
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
        let statement = self.tables.complete_and_commit(
            key.as_str(),
            &meta,
            &body,
            self.replay.retention().as_millis(),
        );
        match tx.commit_with(&statement).await {
            Ok(_) => Ok(()),
            // Refused before the `COMMIT`: the transaction was no longer this request's.
            Err(error) if has_code(&error, NOT_OURS) => Err(Completion::NotOurs),
            // `in_failed_sql_transaction`: the record write met a transaction a failed
            // statement had aborted, a handler's mistake that no retry outlives.
            Err(error) if in_aborted_transaction(&error) => Err(Completion::Aborted),
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
