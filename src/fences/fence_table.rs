//! [`FenceTable`]: the per-key high-water marks of lease fences, its migration and its
//! check, in the transaction of the writes a lock guards.

use std::{fmt, sync::Arc};

use sqlx::{PgConnection, PgPool, Row};

use super::{FenceError, plain};
use crate::LeaseInfo;

/// The fences table (`"<schema>"."<prefix>fences"`, by default
/// `public.tower_lock_fences`: the transactional idempotency layer's, with the same schema
/// and prefix) and the check of a lease's fence against it. Cheap to clone.
///
/// The schema and prefix follow the transactional layer's rule: lower-case ASCII letters,
/// digits and `_`, not starting with a digit, at most 40 bytes (a prefix may be empty);
/// every name is a quoted identifier, so a reserved word (`order`) is fine.
#[derive(Clone)]
pub struct FenceTable {
    /// The table, quoted and qualified.
    table: Arc<str>,
    /// The schema, quoted.
    schema: Arc<str>,
    /// The key of the migrations' advisory lock: the transactional layer's of the same
    /// schema and prefix, so that its migration and this table's serialize.
    migration_lock: Arc<str>,
}

impl fmt::Debug for FenceTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("FenceTable").field(&self.table).finish()
    }
}

impl Default for FenceTable {
    /// `public.tower_lock_fences`.
    fn default() -> Self {
        Self::new("public", "tower_lock_").expect("the default names are plain")
    }
}

impl FenceTable {
    /// The fences table of `schema` and `prefix` ([`FenceError::Name`] for a name outside
    /// the rule).
    pub fn new(schema: &str, prefix: &str) -> Result<Self, FenceError> {
        if !plain(schema) || !(prefix.is_empty() || plain(prefix)) {
            return Err(FenceError::Name(format!("{schema:?}, prefix {prefix:?}")));
        }
        Ok(Self {
            table: format!("\"{schema}\".\"{prefix}fences\"").into(),
            schema: format!("\"{schema}\"").into(),
            migration_lock: format!(
                "SELECT pg_advisory_xact_lock(hashtext('tower-lock migrate {schema}.{prefix}idempotency_records'))"
            )
            .into(),
        })
    }

    /// The table, quoted and qualified.
    pub fn name(&self) -> &str {
        &self.table
    }

    /// Create the schema and the table if they are missing (idempotent; the transactional
    /// layer's `migrate()` creates it too). Safe from several nodes at once: serialized by
    /// the transactional layer's transaction-level advisory lock (concurrent `CREATE ... IF
    /// NOT EXISTS` race on the catalog, `23505`), with `statement_timeout` and
    /// `lock_timeout` off for its transaction, as the layer's; bound it with a timeout of
    /// your own.
    pub async fn migrate(&self, pool: &PgPool) -> Result<(), FenceError> {
        let mut tx = pool.begin().await.map_err(FenceError::Database)?;
        for statement in self.serialized().into_iter().chain(self.migration()) {
            sqlx::raw_sql(&statement)
                .execute(&mut *tx)
                .await
                .map_err(FenceError::Database)?;
        }
        tx.commit().await.map_err(FenceError::Database)
    }

    /// The first statements of a migration's transaction: timeouts off (it waits for a
    /// concurrent migration), then the migrations' advisory lock.
    pub(crate) fn serialized(&self) -> [String; 3] {
        [
            "SET LOCAL statement_timeout = 0".to_owned(),
            "SET LOCAL lock_timeout = 0".to_owned(),
            self.migration_lock.to_string(),
        ]
    }

    /// The statements that create the schema and the table if missing, for a migration
    /// that runs them in its own transaction; the first quiets the server's notices for
    /// the rest of that transaction.
    pub(crate) fn migration(&self) -> [String; 3] {
        [
            // Every `IF NOT EXISTS` on what exists is a notice ("already exists,
            // skipping"), which sqlx logs at `INFO`: about 25 lines at every start. A
            // warning or an error still comes through.
            "SET LOCAL client_min_messages = warning".to_owned(),
            format!("CREATE SCHEMA IF NOT EXISTS {}", self.schema),
            format!(
                "CREATE TABLE IF NOT EXISTS {} (key text PRIMARY KEY, fence bigint NOT NULL)",
                self.table
            ),
        ]
    }

    /// Refuse the writes of `conn`'s transaction if a newer holder of `lease`'s lock
    /// already wrote: raises the key's high-water mark to the lease's fence (one upsert,
    /// sent unnamed, so it works behind PgBouncer in transaction mode), or finds it higher:
    /// [`FenceError::Stale`]; roll that transaction back then. Call it on the connection
    /// of a transaction (`&mut tx` of sqlx's `Transaction`, or a borrowed one), before the
    /// writes it guards: the mark's row stays locked until the transaction ends, so a stale
    /// holder's check also waits for a newer holder in flight, and then refuses. Outside a
    /// transaction the mark is committed at once and guards nothing.
    ///
    /// A dry run's lease ([`LeaseInfo::is_dry_run`]) guards nothing: its fence may be `0`
    /// (a request the layer would have refused runs anyway), so the check is `Ok` without
    /// touching the table, and a dry run never changes an answer.
    pub async fn check(
        &self,
        conn: &mut PgConnection,
        lease: &LeaseInfo,
    ) -> Result<(), FenceError> {
        if lease.is_dry_run() {
            return Ok(());
        }
        let key = lease.key().as_str();
        let fence = lease.fence().get();
        // Fences are microseconds since 1970 or a counter: far below `i64::MAX`.
        let value = i64::try_from(fence).unwrap_or(i64::MAX);
        let raised = sqlx::query(&self.statement())
            .persistent(false)
            .bind(key)
            .bind(value)
            .fetch_optional(conn)
            .await
            .map_err(FenceError::Database)?;
        match raised {
            Some(row) if row.try_get::<i64, _>(0).is_ok() => Ok(()),
            _ => Err(FenceError::Stale {
                key: key.to_owned(),
                fence,
            }),
        }
    }

    /// Raises the high-water mark of `$1` to `$2`: a row back when `$2` is at least the
    /// mark (the holder is current), none when a newer holder already wrote.
    fn statement(&self) -> String {
        format!(
            "INSERT INTO {fences} AS f (key, fence) VALUES ($1, $2)
             ON CONFLICT (key) DO UPDATE SET fence = excluded.fence
               WHERE f.fence <= excluded.fence
             RETURNING fence",
            fences = self.table
        )
    }
}
