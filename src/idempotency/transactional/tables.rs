//! [`Tables`]: the names of the transactional layer's tables (a schema and a prefix the
//! application chooses) and every statement the layer sends, written once here.

use std::fmt;

use super::SetupError;
use crate::fences::{FenceTable, plain};

/// The records table and the fences table, quoted and qualified, and the statements on
/// them. Each statement is one round trip, sent unnamed (sqlx's `persistent(false)`) or as
/// a simple query, so it runs behind PgBouncer in transaction pooling mode. Every name is
/// a quoted identifier (`"order"."tower_lock_fences"`), as the lock engine's are: a
/// schema or prefix that is a reserved word (`order`, `user`, `select`) is a name like
/// any other.
#[derive(Clone)]
pub(super) struct Tables {
    records: String,
    /// The fences table, shared with a plain `LockLayer`'s [`FenceTable`].
    fences: FenceTable,
    /// The claim function (see [`Tables::claim`]).
    claim: String,
    /// The claim function that refuses a key not claimed (see [`Tables::begin_and_claim`]).
    pub(super) claim_ours: String,
    /// A first request's claim (see [`Tables::first_request_functions`]).
    pub(super) claim_first: String,
    /// A first request's record write (see [`Tables::first_request_functions`]).
    pub(super) complete: String,
    /// The records table's index on `expires_at`, quoted, unqualified (an index lives in
    /// its table's schema).
    expiry_index: String,
    /// The same index, quoted and qualified: the name the migration looks up.
    expiry_index_qualified: String,
    /// The records table as `schema.table`, unquoted: the text the advisory locks' keys
    /// are hashed from (the migration's, and the claim's under `wait(0)`), unchanged from
    /// the layer's first versions so that nodes of both agree during a rolling upgrade.
    pub(super) lock_name: String,
    /// The trigger function that refuses to commit a claim without its response (see
    /// [`Tables::claim_check`]).
    check: String,
}

impl fmt::Debug for Tables {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tables")
            .field("records", &self.records)
            .field("fences", &self.fences.name())
            .finish()
    }
}

/// The SQLSTATE of the commit check's refusal (see [`Tables::claim_check`]): a class of
/// tower-lock's own.
pub(super) const UNFINISHED_CLAIM: &str = "TLK01";

/// The SQLSTATE of a claim that did not claim (see [`Tables::begin_and_claim`]): the key
/// is a committed record's or a duplicate's in flight.
pub(super) const NOT_CLAIMED: &str = "TLK02";

/// The SQLSTATE of a record write that found no record of its transaction's (see
/// [`Tables::complete_and_commit`]): the handler ended the transaction it borrowed.
pub(super) const NOT_OURS: &str = "TLK03";

/// The columns of the claim's row (see [`Tables::claim`]).
pub(super) const CLAIM_COLUMNS: usize = 6;

/// The name of the commit check's trigger on the records table.
const CHECK_TRIGGER: &str = "tower_lock_claim_check";

/// `bytes` as a `bytea` expression of hexadecimal digits only: nothing in them can end the
/// literal, whatever `standard_conforming_strings` says.
pub(super) fn bytea_literal(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut literal = String::with_capacity(bytes.len() * 2 + 16);
    literal.push_str("decode('");
    for b in bytes {
        literal.push(char::from(DIGITS[usize::from(b >> 4)]));
        literal.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    literal.push_str("', 'hex')");
    literal
}

/// `text` as a `text` expression. Dollar-quoted (`$l$…$l$`) when it holds no `$` and no
/// NUL: taken as it is, no escape, whatever `standard_conforming_strings` says, nothing
/// in it can end the literal early, and it costs the server no function call per value.
/// Otherwise its UTF-8 bytes in hexadecimal (see [`bytea_literal`]); `convert_from` takes
/// the collation of its `name` argument (`C`), which no index on a `text` column of the
/// default collation serves, so that expression names the default.
pub(super) fn text_literal(text: &str) -> String {
    if !text.contains(['$', '\0']) {
        return format!("$l${text}$l$");
    }
    format!(
        "(convert_from({}, 'UTF8') COLLATE \"default\")",
        bytea_literal(text.as_bytes())
    )
}

impl Tables {
    pub(super) fn new(schema: &str, prefix: &str) -> Result<Self, SetupError> {
        if !plain(schema) || !(prefix.is_empty() || plain(prefix)) {
            return Err(SetupError::Name(format!("{schema:?}, prefix {prefix:?}")));
        }
        let qualified = |name: &str| format!("\"{schema}\".\"{prefix}{name}\"");
        Ok(Self {
            records: qualified("idempotency_records"),
            fences: FenceTable::new(schema, prefix)
                .map_err(|_| SetupError::Name(format!("{schema:?}, prefix {prefix:?}")))?,
            claim: qualified("idempotency_claim"),
            claim_ours: qualified("idempotency_claim_ours"),
            claim_first: qualified("idempotency_claim_first"),
            complete: qualified("idempotency_complete"),
            expiry_index: format!("\"{prefix}idempotency_records_expiry\""),
            expiry_index_qualified: qualified("idempotency_records_expiry"),
            lock_name: format!("{schema}.{prefix}idempotency_records"),
            check: qualified("idempotency_claim_check"),
        })
    }

    /// The fences table.
    pub(super) fn fences(&self) -> &FenceTable {
        &self.fences
    }

    /// The records table, quoted and qualified (for error messages).
    pub(super) fn records(&self) -> &str {
        &self.records
    }

    /// Creates the schema and both tables if missing, serialized by a transaction-level
    /// advisory lock so that nodes migrating at once do not race on the catalog,
    /// without the server's "already exists, skipping" notices.
    ///
    /// A step that takes a lock on a table (an index, the commit check's trigger) first
    /// looks its object up in the catalog and is skipped when it exists: `CREATE INDEX IF
    /// NOT EXISTS` takes its `SHARE` lock on the table before it checks, which waits for
    /// every request in flight (their claims hold `ROW EXCLUSIVE` until they commit), and
    /// every new claim would queue behind it (under `wait(0)`, a fresh key's `409`). A
    /// migration of tables that exist so takes no lock a request conflicts with.
    ///
    /// `statement_timeout` and `lock_timeout` are off for the migration's transaction: it
    /// waits for a concurrent migration's advisory lock (and, creating the index or adding
    /// the commit check to older tables, for the requests in flight on them), which a
    /// database's or role's short timeout would cut (`57014`); bound `migrate()` with a
    /// timeout of your own.
    pub(super) fn migration(&self) -> Vec<String> {
        let Self {
            records,
            fences,
            claim,
            claim_ours,
            expiry_index,
            expiry_index_qualified,
            lock_name,
            ..
        } = self;
        // Timeouts off and the migrations' advisory lock (the `FenceTable`'s, whose key
        // is this table's `lock_name`); then the schema and the fences table: the
        // `FenceTable`'s own migration, which also quiets the notices of the whole
        // migration's transaction (`SET LOCAL`).
        let mut statements = Vec::from(fences.serialized());
        statements.extend(fences.migration());
        statements.extend([
            // `completed_at` is NULL while the claim is uncommitted; only completed records
            // are ever committed (the claim commits with the response or a tombstone).
            // `expires_at` is set again by the completion: retention counts from it.
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
            // Looked up first: `CREATE INDEX IF NOT EXISTS` locks the table before it checks
            // (see above).
            format!(
                "DO $do$ BEGIN
                    IF to_regclass('{expiry_index_qualified}') IS NULL THEN
                        CREATE INDEX {expiry_index} ON {records} (expires_at);
                    END IF;
                END $do$"
            ),
            // The claim, one round trip: under the layer's `lock_timeout` (a duplicate
            // waits on the unique index for the transaction that claimed the key), insert
            // the claim, or read the committed record (an expired one is deleted and the
            // key claimed again). `DO NOTHING` locks no committed record: replays never
            // queue. The application's `lock_timeout` is back for the handler's statements.
            // Returns one row: claimed, or the record (fingerprint NULL: still in flight).
            //
            // A layer that does not wait (`p_now`) first takes the key's transaction-level
            // advisory lock without waiting: a claimer of the same layer in flight holds
            // it, and is answered from the committed record (a replay holds it too) or as
            // in flight at once, where the insert would wait out its `lock_timeout` (which
            // cannot be shorter than a table extension may take).
            format!(
                "CREATE OR REPLACE FUNCTION {claim}(
                    p_key text, p_fingerprint bytea, p_retention_ms double precision,
                    p_wait text, p_now boolean)
                RETURNS TABLE (o_claimed boolean, o_fingerprint bytea, o_meta bytea,
                               o_body bytea, o_kept boolean, o_completed_ms bigint)
                LANGUAGE plpgsql AS $fn$
                DECLARE
                    previous text := current_setting('lock_timeout');
                BEGIN
                    IF p_now AND NOT pg_try_advisory_xact_lock(
                            hashtextextended('{lock_name} ' || p_key, 0)) THEN
                        RETURN QUERY SELECT false, r.fingerprint, r.meta, r.body, r.kept,
                            (extract(epoch FROM r.completed_at) * 1000)::bigint
                        FROM {records} r
                        WHERE r.key = p_key AND r.completed_at IS NOT NULL
                            AND r.expires_at > clock_timestamp();
                        IF NOT FOUND THEN
                            RETURN QUERY SELECT false, NULL::bytea, NULL::bytea, NULL::bytea,
                                NULL::boolean, NULL::bigint;
                        END IF;
                        RETURN;
                    END IF;
                    PERFORM set_config('lock_timeout', p_wait, true);
                    FOR attempt IN 1..3 LOOP
                        INSERT INTO {records} (key, fingerprint, expires_at)
                        VALUES (p_key, p_fingerprint,
                                clock_timestamp() + p_retention_ms * interval '1 millisecond')
                        ON CONFLICT (key) DO NOTHING;
                        IF FOUND THEN
                            PERFORM set_config('lock_timeout', previous, true);
                            RETURN QUERY SELECT true, NULL::bytea, NULL::bytea, NULL::bytea,
                                NULL::boolean, NULL::bigint;
                            RETURN;
                        END IF;
                        DELETE FROM {records} r
                        WHERE r.key = p_key AND r.expires_at <= clock_timestamp();
                        IF NOT FOUND THEN
                            RETURN QUERY SELECT false, r.fingerprint, r.meta, r.body, r.kept,
                                (extract(epoch FROM r.completed_at) * 1000)::bigint
                            FROM {records} r WHERE r.key = p_key;
                            IF FOUND THEN
                                PERFORM set_config('lock_timeout', previous, true);
                                RETURN;
                            END IF;
                        END IF;
                    END LOOP;
                    PERFORM set_config('lock_timeout', previous, true);
                    RETURN QUERY SELECT false, NULL::bytea, NULL::bytea, NULL::bytea,
                        NULL::boolean, NULL::bigint;
                END
                $fn$"
            ),
            // The claim as the first request's fast path uses it: the same claim, which
            // refuses (`NOT_CLAIMED`) what is not this request's, so that `BEGIN` and the
            // claim travel in the one message whose rows sqlx's `begin` does not return
            // (see `Tables::begin_and_claim`).
            format!(
                "CREATE OR REPLACE FUNCTION {claim_ours}(
                    p_key text, p_fingerprint bytea, p_retention_ms double precision,
                    p_wait text, p_now boolean)
                RETURNS void
                LANGUAGE plpgsql AS $fn$
                BEGIN
                    IF NOT (SELECT c.o_claimed
                            FROM {claim}(p_key, p_fingerprint, p_retention_ms, p_wait, p_now) c)
                    THEN
                        RAISE EXCEPTION 'tower-lock: the idempotency key is not this request''s'
                            USING ERRCODE = '{NOT_CLAIMED}';
                    END IF;
                END
                $fn$"
            ),
        ]);
        statements.extend(self.first_request_functions());
        statements
    }

    /// The commit check, after [`migration`](Self::migration) (and the upgrade of tables
    /// made before it): a constraint trigger deferred to the commit, on every claim
    /// inserted, that re-reads the claimed row and refuses the commit (SQLSTATE
    /// [`UNFINISHED_CLAIM`]) while it is still a claim without its response. The layer's
    /// own commit always writes the response first; any other commit of the request's
    /// transaction (a handler's `COMMIT` statement on the lent connection) would leave a
    /// half-written record that blocks the key for its retention and commit the handler's
    /// rows with no response stored: the database refuses it, and rolls it all back.
    /// One index read per claim, at its commit.
    ///
    /// A named limit: `SET CONSTRAINTS ALL IMMEDIATE` on the request's transaction
    /// (Django's `check_constraints`) fires every pending deferred trigger at once, this
    /// one too, while the claim still has no response; Postgres offers no way to exempt a
    /// constraint trigger from `ALL`, and the trigger cannot tell that firing from a
    /// commit (after it, nothing is left to fire at the commit). It refuses then too, its
    /// message naming both causes: a handler sets its constraints by name.
    pub(super) fn claim_check(&self) -> [String; 2] {
        let Self { records, check, .. } = self;
        [
            format!(
                "CREATE OR REPLACE FUNCTION {check}() RETURNS trigger
                LANGUAGE plpgsql AS $fn$
                BEGIN
                    PERFORM FROM {records} r WHERE r.key = NEW.key AND r.completed_at IS NULL;
                    IF FOUND THEN
                        RAISE EXCEPTION 'tower-lock: the commit check fired before the request''s idempotency record was written: the transaction was committed early, or SET CONSTRAINTS ALL IMMEDIATE ran on it (set your constraints by name); nothing was committed'
                            USING ERRCODE = '{UNFINISHED_CLAIM}',
                                  HINT = 'the transactional idempotency layer ends the transaction it lends to the handler: the handler must not commit it (begin() on the lent transaction makes a savepoint), nor make every constraint immediate (SET CONSTRAINTS ALL IMMEDIATE fires this check at once; name your own constraints instead)';
                    END IF;
                    RETURN NULL;
                END
                $fn$"
            ),
            format!(
                "DO $do$ BEGIN
                    IF NOT EXISTS (SELECT FROM pg_trigger
                            WHERE tgrelid = '{records}'::regclass AND tgname = '{CHECK_TRIGGER}') THEN
                        CREATE CONSTRAINT TRIGGER {CHECK_TRIGGER} AFTER INSERT ON {records}
                            DEFERRABLE INITIALLY DEFERRED
                            FOR EACH ROW EXECUTE FUNCTION {check}();
                    END IF;
                END $do$"
            ),
        ]
    }

    /// Whether the records table has the commit check of [`claim_check`](Self::claim_check),
    /// the claim function that refuses a key not claimed, and the functions of a first
    /// request ([`first_request_functions`](Self::first_request_functions)): one row, one
    /// boolean (false for tables made before them, or none).
    pub(super) fn claim_check_exists(&self) -> String {
        format!(
            "SELECT EXISTS (SELECT FROM pg_trigger
                WHERE tgrelid = to_regclass('{}') AND tgname = '{CHECK_TRIGGER}')
                AND to_regprocedure('{}(text, bytea, double precision, text, boolean)') IS NOT NULL
                AND {}",
            self.records,
            self.claim_ours,
            self.first_request_functions_exist()
        )
    }

    /// Whether both tables and the claim function exist: one row, one boolean.
    pub(super) fn exists(&self) -> String {
        format!(
            "SELECT to_regclass('{}') IS NOT NULL AND to_regclass('{}') IS NOT NULL
                AND to_regprocedure('{}(text, bytea, double precision, text, boolean)') IS NOT NULL",
            self.records,
            self.fences.name(),
            self.claim
        )
    }

    /// Claims `key` with `fingerprint` for `retention_ms` of retention (in the transaction
    /// the layer began), waiting at most `wait_ms` for a duplicate in flight, or (`now`)
    /// not at all for one of this layer: one simple query (one round trip), whose second
    /// statement's row ([`CLAIM_COLUMNS`] columns) is `claimed` or the committed record (see
    /// the function in [`migration`](Self::migration)). Every value is inlined as
    /// hexadecimal digits, a number or a keyword, so nothing a client sends is SQL.
    ///
    /// The claim waits on a duplicate's claim for up to `wait_ms`, each of its (at most
    /// three) inserts, which a database's or role's shorter `statement_timeout` would cut
    /// (`57014`, a `503`). Postgres (13+) times each statement of a simple query apart, so
    /// the first statement sets a transaction-local `statement_timeout` for the claim (three
    /// waits and a second, or the application's when that is longer or off), keeping the
    /// application's value in `tower_lock.statement_timeout`; the last puts it back before
    /// the handler runs.
    pub(super) fn claim(
        &self,
        key: &str,
        fingerprint: &[u8],
        retention_ms: u128,
        wait_ms: u128,
        now: bool,
    ) -> String {
        let call = format!(
            "SELECT * FROM {}({}, {}, {retention_ms}, '{wait_ms}ms', {now})",
            self.claim,
            text_literal(key),
            bytea_literal(fingerprint),
        );
        Self::bounded(&call, wait_ms)
    }

    /// The claim statement `call` between the statements that give it its own
    /// `statement_timeout` (see [`claim`](Self::claim)) and put the application's back.
    fn bounded(call: &str, wait_ms: u128) -> String {
        let bound = wait_ms * 3 + 1000;
        format!(
            "SELECT set_config('tower_lock.statement_timeout', s.t, true),
                set_config('statement_timeout', CASE
                    WHEN s.t::interval = interval '0'
                        OR s.t::interval >= interval '{bound} milliseconds' THEN s.t
                    ELSE '{bound}ms' END, true)
             FROM (SELECT current_setting('statement_timeout') AS t OFFSET 0) s;
             {call};
             SELECT set_config('statement_timeout',
                current_setting('tower_lock.statement_timeout'), true)"
        )
    }

    /// Deletes at most `batch` expired records, skipping rows a transaction holds. The
    /// batch is written in (digits only), not bound: a statement with parameters goes out in
    /// the extended protocol, whose two halves PgBouncer in transaction mode may send to two
    /// server connections when it is not inside a transaction.
    pub(super) fn sweep(&self, batch: i64) -> String {
        let records = &self.records;
        format!(
            "DELETE FROM {records} WHERE key IN (
                SELECT key FROM {records} WHERE expires_at <= clock_timestamp()
                LIMIT {batch} FOR UPDATE SKIP LOCKED)"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inlined_values_are_taken_as_they_are_whatever_a_client_sends() {
        let quoted = "k'); DROP TABLE payments; -- \\'";
        assert_eq!(text_literal(quoted), format!("$l${quoted}$l$"));
        let hostile = "k'); DROP TABLE payments; -- \\' $$ \u{0}";
        let literal = text_literal(hostile);
        let digits = literal
            .strip_prefix("(convert_from(decode('")
            .and_then(|rest| rest.strip_suffix("', 'hex'), 'UTF8') COLLATE \"default\")"))
            .expect("the literal's shape");
        assert!(digits.bytes().all(|b| b.is_ascii_hexdigit()), "{literal}");
        assert_eq!(digits.len(), hostile.len() * 2);
        assert_eq!(
            bytea_literal(&[0x00, 0xab, 0xff]),
            "decode('00abff', 'hex')"
        );
    }
}
