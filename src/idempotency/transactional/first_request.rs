//! The statements of a first request, the layer's common case: `BEGIN` with the claim,
//! and the record write with `COMMIT`, each a call of a function whose statements the
//! server plans once per connection (PL/pgSQL caches them), where a statement sent as
//! text is parsed, analysed and planned again on every request. Measured on the project's
//! bench (16 clients, 2 cores), the server's time per request, not the round trips
//! (three either way, as for the handler in its own transaction), is what the layer adds;
//! `docs/transactional.md`, "What it costs".
//!
//! The claim is the same insert into the same unique index as [`Tables::claim`]'s (nodes
//! of the version before exclude this version's duplicates, and the other way round),
//! without the statements around it that bound its `statement_timeout`: a first
//! request waits for nothing, and a claim that a short `statement_timeout` cut while it
//! waited for a duplicate (`57014`) is made again the way that bounds it
//! ([`Tables::claim`], within what is left of the layer's `wait`).

use super::tables::{NOT_CLAIMED, NOT_OURS, Tables, bytea_literal, text_literal};

impl Tables {
    /// The functions of a first request's statements (see the module's docs), created or
    /// replaced by [`migration`](Self::migration) after the claim functions they call.
    ///
    /// The claim: under `wait(0)`, the key's transaction-level advisory lock tried first (a
    /// claimer of the same layer in flight holds it: refused at once, [`NOT_CLAIMED`]);
    /// then the insert under the layer's `lock_timeout` (a duplicate waits on the unique
    /// index for the transaction that claimed the key); on a conflict, the claim function
    /// that refuses what is not this request's ([`NOT_CLAIMED`]: a committed record, a
    /// duplicate in flight; an expired record is deleted and the key claimed again there).
    ///
    /// The completion: the record write, on the record this transaction inserted (its
    /// `xmin`) only; none (the handler ended the transaction it borrowed, and what follows
    /// runs outside it) is refused with [`NOT_OURS`], so that the `COMMIT` after it in the
    /// same message never runs.
    pub(super) fn first_request_functions(&self) -> [String; 2] {
        let records = self.records();
        let (claim_first, claim_ours, complete, lock_name) = (
            &self.claim_first,
            &self.claim_ours,
            &self.complete,
            &self.lock_name,
        );
        [
            format!(
                "CREATE OR REPLACE FUNCTION {claim_first}(
                    p_key text, p_fingerprint bytea, p_retention_ms double precision,
                    p_wait text, p_now boolean)
                RETURNS void
                LANGUAGE plpgsql AS $fn$
                DECLARE
                    previous text := current_setting('lock_timeout');
                    claimed boolean;
                BEGIN
                    IF p_now AND NOT pg_try_advisory_xact_lock(
                            hashtextextended('{lock_name} ' || p_key, 0)) THEN
                        RAISE EXCEPTION 'tower-lock: the idempotency key is not this request''s'
                            USING ERRCODE = '{NOT_CLAIMED}';
                    END IF;
                    PERFORM set_config('lock_timeout', p_wait, true);
                    INSERT INTO {records} (key, fingerprint, expires_at)
                    VALUES (p_key, p_fingerprint,
                            clock_timestamp() + p_retention_ms * interval '1 millisecond')
                    ON CONFLICT (key) DO NOTHING;
                    claimed := FOUND;
                    PERFORM set_config('lock_timeout', previous, true);
                    IF claimed THEN
                        RETURN;
                    END IF;
                    PERFORM {claim_ours}(p_key, p_fingerprint, p_retention_ms, p_wait, p_now);
                END
                $fn$"
            ),
            format!(
                "CREATE OR REPLACE FUNCTION {complete}(
                    p_key text, p_meta bytea, p_body bytea, p_retention_ms double precision)
                RETURNS void
                LANGUAGE plpgsql AS $fn$
                BEGIN
                    UPDATE {records} SET meta = p_meta, body = p_body, kept = true,
                        completed_at = clock_timestamp(),
                        expires_at = clock_timestamp() + p_retention_ms * interval '1 millisecond'
                    WHERE key = p_key AND xmin = pg_current_xact_id_if_assigned()::xid;
                    IF NOT FOUND THEN
                        RAISE EXCEPTION 'tower-lock: the request''s idempotency record is not this transaction''s: the transaction lent to the handler was ended'
                            USING ERRCODE = '{NOT_OURS}';
                    END IF;
                END
                $fn$"
            ),
        ]
    }

    /// `BEGIN` and the claim in one simple query (one round trip, sent as sqlx's `begin`
    /// statement so that sqlx counts the transaction): the first request's fast path. Its
    /// rows are not read: a key that is not this request's (a committed record, a
    /// duplicate in flight) is refused with [`NOT_CLAIMED`], which aborts the transaction;
    /// the layer then rolls back and reads the record with [`claim`](Self::claim) in the
    /// next message (as it does when a short `statement_timeout` cut this claim's wait).
    pub(super) fn begin_and_claim(
        &self,
        key: &str,
        fingerprint: &[u8],
        retention_ms: u128,
        wait_ms: u128,
        now: bool,
    ) -> String {
        format!(
            "BEGIN; SELECT {}({}, {}, {retention_ms}, '{wait_ms}ms', {now})",
            self.claim_first,
            text_literal(key),
            bytea_literal(fingerprint),
        )
    }

    /// Completes the claimed `key` with `meta` and `body`, kept `retention_ms` from now
    /// (retention counts from the completion, by the database's clock, as the claim's
    /// expiry does: a handler slower than the retention must not leave a record already
    /// expired), and commits, in one simple query (one round trip); then `BEGIN`s an empty
    /// transaction for sqlx's bookkeeping to end (see `OpenTransaction::commit_with`). The
    /// write matches only a record this transaction inserted (its `xmin`): none means the
    /// claim is no longer this transaction's (the handler ended it), refused with
    /// [`NOT_OURS`] before the `COMMIT`, and nothing of the request's was stored.
    pub(super) fn complete_and_commit(
        &self,
        key: &str,
        meta: &[u8],
        body: &[u8],
        retention_ms: u128,
    ) -> String {
        format!(
            "SELECT {}({}, {}, {}, {retention_ms}); COMMIT; BEGIN",
            self.complete,
            text_literal(key),
            bytea_literal(meta),
            bytea_literal(body),
        )
    }

    /// Whether the functions of [`first_request_functions`](Self::first_request_functions)
    /// exist, as a boolean SQL expression (see [`claim_check_exists`](Self::claim_check_exists)).
    pub(super) fn first_request_functions_exist(&self) -> String {
        format!(
            "to_regprocedure('{}(text, bytea, double precision, text, boolean)') IS NOT NULL
             AND to_regprocedure('{}(text, bytea, bytea, double precision)') IS NOT NULL",
            self.claim_first, self.complete
        )
    }
}
