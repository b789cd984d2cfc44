//! [`Tables`]: the names of the transactional layer's tables (a schema and a prefix the
//! application chooses) and every statement the layer sends, written once here.

use std::fmt;

use super::SetupError;

/// The records table and the fences table, quoted and qualified, and the statements on
/// them. Each statement is one round trip, sent unnamed (sqlx's `persistent(false)`), so
/// it runs behind PgBouncer in transaction pooling mode.
#[derive(Clone)]
pub(super) struct Tables {
    schema: String,
    records: String,
    fences: String,
}

impl fmt::Debug for Tables {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tables")
            .field("records", &self.records)
            .field("fences", &self.fences)
            .finish()
    }
}

/// A name Postgres takes unquoted and that needs no escaping: letters, digits and `_`,
/// not starting with a digit, at most 40 bytes (room for the table names' suffixes
/// within Postgres's 63).
fn plain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 40
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

impl Tables {
    pub(super) fn new(schema: &str, prefix: &str) -> Result<Self, SetupError> {
        if !plain(schema) || !(prefix.is_empty() || plain(prefix)) {
            return Err(SetupError::Name(format!("{schema:?}, prefix {prefix:?}")));
        }
        Ok(Self {
            schema: schema.to_owned(),
            records: format!("{schema}.{prefix}idempotency_records"),
            fences: format!("{schema}.{prefix}fences"),
        })
    }

    /// The records table, qualified (for error messages).
    pub(super) fn records(&self) -> &str {
        &self.records
    }

    /// Creates the schema and both tables if missing, serialized by a transaction-level
    /// advisory lock so that nodes migrating at once do not race on the catalog.
    pub(super) fn migration(&self) -> [String; 5] {
        let Self {
            schema,
            records,
            fences,
        } = self;
        [
            format!("SELECT pg_advisory_xact_lock(hashtext('tower-lock migrate {records}'))"),
            format!("CREATE SCHEMA IF NOT EXISTS {schema}"),
            // `completed_at` is NULL while the claim is uncommitted; only completed records
            // are ever committed (the claim commits with the response or a tombstone).
            format!(
                "CREATE TABLE IF NOT EXISTS {records} (
                    key text PRIMARY KEY,
                    fingerprint bytea NOT NULL,
                    meta bytea,
                    body bytea,
                    kept boolean NOT NULL DEFAULT false,
                    completed_at timestamptz,
                    expires_at timestamptz NOT NULL)"
            ),
            format!(
                "CREATE INDEX IF NOT EXISTS {}_expiry ON {records} (expires_at)",
                records.rsplit('.').next().unwrap_or("records")
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {fences} (key text PRIMARY KEY, fence bigint NOT NULL)"
            ),
        ]
    }

    /// Whether both tables exist: one row, two booleans.
    pub(super) fn exists(&self) -> String {
        format!(
            "SELECT to_regclass('{}') IS NOT NULL AND to_regclass('{}') IS NOT NULL",
            self.records, self.fences
        )
    }

    /// `$1`: the new `lock_timeout` (text). Returns the one it replaces, so that the
    /// handler's own statements run under the application's setting, not the layer's.
    pub(super) fn set_lock_timeout(&self) -> &'static str {
        "SELECT current_setting('lock_timeout'), set_config('lock_timeout', $1, true)"
    }

    /// Claims `$1` (key) with `$2` (fingerprint) for `$3` milliseconds of retention: a row
    /// back means the key is this transaction's. A concurrent claim of the same key waits
    /// here on the unique index until the other transaction ends; a committed record
    /// returns nothing, and (`DO NOTHING`) is not locked, so replays never queue.
    pub(super) fn claim(&self) -> String {
        format!(
            "INSERT INTO {} (key, fingerprint, expires_at)
             VALUES ($1, $2, clock_timestamp() + $3 * interval '1 millisecond')
             ON CONFLICT (key) DO NOTHING
             RETURNING 1",
            self.records
        )
    }

    /// The committed record of `$1`: fingerprint, meta, body, kept, completion in Unix ms,
    /// and whether it expired.
    pub(super) fn read(&self) -> String {
        format!(
            "SELECT fingerprint, meta, body, kept,
                    (extract(epoch FROM completed_at) * 1000)::int8,
                    expires_at <= clock_timestamp()
             FROM {} WHERE key = $1",
            self.records
        )
    }

    /// Deletes the record of `$1` if it expired, so that the key can be claimed again.
    pub(super) fn forget_expired(&self) -> String {
        format!(
            "DELETE FROM {} WHERE key = $1 AND expires_at <= clock_timestamp()",
            self.records
        )
    }

    /// Completes the claimed `$1` with `$2` (meta), `$3` (body), `$4` (kept).
    pub(super) fn complete(&self) -> String {
        format!(
            "UPDATE {} SET meta = $2, body = $3, kept = $4, completed_at = clock_timestamp()
             WHERE key = $1",
            self.records
        )
    }

    /// Raises the high-water mark of `$1` to `$2`: a row back when `$2` is at least the
    /// mark (the holder is current), none when a newer holder already wrote.
    pub(super) fn fence(&self) -> String {
        format!(
            "INSERT INTO {fences} AS f (key, fence) VALUES ($1, $2)
             ON CONFLICT (key) DO UPDATE SET fence = excluded.fence
               WHERE f.fence <= excluded.fence
             RETURNING fence",
            fences = self.fences
        )
    }

    /// Deletes at most `$1` expired records, skipping rows a transaction holds.
    pub(super) fn sweep(&self) -> String {
        let records = &self.records;
        format!(
            "DELETE FROM {records} WHERE key IN (
                SELECT key FROM {records} WHERE expires_at <= clock_timestamp()
                LIMIT $1 FOR UPDATE SKIP LOCKED)"
        )
    }
}
