//! Statements as text, in the simple query protocol: one message, one round trip, and no
//! prepared statement on any server connection, named or unnamed (sqlx's extended protocol
//! parses with one `Sync` and executes with another, and PgBouncer in transaction mode may
//! send those to two different servers).
//!
//! Each call is preceded, in the same message, by `SET TRANSACTION ISOLATION LEVEL READ
//! COMMITTED`: the statements of one message run in one implicit transaction, and the
//! functions rely on `READ COMMITTED` (a statement that waited for a row's lock reads the
//! row again). A database, role or session default of `REPEATABLE READ` or `SERIALIZABLE`
//! (behind PgBouncer, a session setting another client left on a server connection) would
//! otherwise fail the contended cases with `could not serialize access`. Then
//! `SET LOCAL statement_timeout = '60s'` and `lock_timeout = 0`: a database default meant
//! for the application's queries (`statement_timeout = 100ms`, say) would cancel a lock
//! operation that waited for its key's row behind the key's other calls on a loaded
//! server, failing it though nothing was wrong; the engine bounds its calls itself (its
//! call timeout, and a statement that outlasts it is let land for up to a minute, see
//! `acquire`), and 60 s is that landing bound. The settings end with the message's
//! transaction, so behind PgBouncer no other client meets them. They cost a few
//! microseconds of the server's time, and no round trip.
//!
//! Values are written as literals no input can break out of: strings dollar-quoted when
//! they hold no `$` (see [`text_literal`]), else as
//! `(convert_from(decode('<hex>', 'hex'), 'UTF8') COLLATE "default")` (hex digits only
//! between the quotes, whatever `standard_conforming_strings` says), numbers as digits.
//! The collation is named because `convert_from` takes its `name` argument's, `C`, and a
//! plpgsql function's parameters take the call's: `key = k` in `C` is a comparison the
//! primary key (of the default collation) cannot serve, and every call read the whole
//! table (`tests/postgres/plans.rs`).

use std::fmt::Write;

/// Sets the isolation and the timeouts of the message's implicit transaction (see the
/// module's docs).
const ISOLATION: &str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; \
                         SET LOCAL statement_timeout = '60s'; SET LOCAL lock_timeout = 0; ";

/// A function call or query being written: `SELECT * FROM <function>(<arguments>)`, at
/// `READ COMMITTED`.
pub(super) struct Call {
    sql: String,
    first: bool,
}

impl Call {
    /// `SELECT * FROM <function>(`; `function` is a qualified, quoted name.
    pub(super) fn function(function: &str) -> Self {
        let mut sql = String::with_capacity(320);
        sql.push_str(ISOLATION);
        sql.push_str("SELECT * FROM ");
        sql.push_str(function);
        sql.push('(');
        Self { sql, first: true }
    }

    fn sep(&mut self) {
        if !self.first {
            self.sql.push_str(", ");
        }
        self.first = false;
    }

    /// A text argument.
    pub(super) fn text(mut self, value: &str) -> Self {
        self.sep();
        text_literal(&mut self.sql, value);
        self
    }

    /// A `bigint` argument.
    pub(super) fn int(mut self, value: i64) -> Self {
        self.sep();
        let _ = write!(self.sql, "{value}::bigint");
        self
    }

    /// A `bytea` argument, as hex digits.
    pub(super) fn bytes(mut self, value: &[u8]) -> Self {
        self.sep();
        self.sql.reserve(value.len() * 2 + 24);
        self.sql.push_str("decode('");
        push_hex(&mut self.sql, value);
        self.sql.push_str("', 'hex')");
        self
    }

    /// A `double precision` argument: a finite number, written as the shortest text that
    /// reads back as the same `f64` (digits, `.`, `e`, `-` only).
    pub(super) fn float(mut self, value: f64) -> Self {
        self.sep();
        let _ = write!(self.sql, "'{value:e}'::double precision");
        self
    }

    /// A `text[]` argument.
    pub(super) fn texts<'a>(mut self, values: impl Iterator<Item = &'a str>) -> Self {
        self.sep();
        self.sql.push_str("ARRAY[");
        for (i, value) in values.enumerate() {
            if i > 0 {
                self.sql.push_str(", ");
            }
            text_literal(&mut self.sql, value);
        }
        self.sql.push_str("]::text[]");
        self
    }

    /// A `bigint[]` argument.
    pub(super) fn ints(mut self, values: impl Iterator<Item = i64>) -> Self {
        self.sep();
        self.sql.push_str("ARRAY[");
        for (i, value) in values.enumerate() {
            if i > 0 {
                self.sql.push_str(", ");
            }
            let _ = write!(self.sql, "{value}");
        }
        self.sql.push_str("]::bigint[]");
        self
    }

    /// The statement.
    pub(super) fn finish(mut self) -> String {
        self.sql.push(')');
        self.sql
    }
}

/// `value` as a text literal: dollar-quoted (`$l$…$l$`) when it holds no `$` and no NUL,
/// so that its text is taken as it is, with no escape and whatever
/// `standard_conforming_strings` says, and no `$l$` can end it early; otherwise
/// `(convert_from(decode('<hex>', 'hex'), 'UTF8') COLLATE "default")`, hex digits only
/// between the quotes. The dollar-quoted form is the usual one: it costs the server no
/// function calls to parse, analyse and run per argument (about a tenth of an uncontended
/// lock cycle's server time went to those), and an untyped literal takes the parameter's
/// type and the default collation.
pub(super) fn text_literal(out: &mut String, value: &str) {
    if !value.contains(['$', '\0']) {
        out.reserve(value.len() + 6);
        out.push_str("$l$");
        out.push_str(value);
        out.push_str("$l$");
        return;
    }
    out.reserve(value.len() * 2 + 40);
    out.push_str("(convert_from(decode('");
    push_hex(out, value.as_bytes());
    out.push_str("', 'hex'), 'UTF8') COLLATE \"default\")");
}

/// `bytes` as two lowercase hex digits each, from a table: a `write!` per byte showed in
/// the profile of an uncontended lock cycle (about 5% of the client's CPU; a cycle writes
/// some 200 digits).
fn push_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0xf)]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_read_back_exactly() {
        let sql = Call::function("f").float(9.995).float(-1e-300).finish();
        assert_eq!(
            sql,
            "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; \
             SET LOCAL statement_timeout = '60s'; SET LOCAL lock_timeout = 0; \
             SELECT * FROM f('9.995e0'::double precision, '-1e-300'::double precision)"
        );
    }

    #[test]
    fn bytes_are_hex_digits() {
        let sql = Call::function("f")
            .bytes(&[0x00, 0x7f, 0xab, 0xff])
            .finish();
        assert!(
            sql.ends_with("SELECT * FROM f(decode('007fabff', 'hex'))"),
            "{sql}"
        );
    }

    #[test]
    fn values_are_dollar_quoted_or_hex_literals() {
        let sql = Call::function("\"s\".\"f\"")
            .text("a'b\\c")
            .int(-2)
            .texts(["x", "y$"].into_iter())
            .ints([1, 2].into_iter())
            .text("n\0ul")
            .finish();
        assert_eq!(
            sql,
            "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; \
             SET LOCAL statement_timeout = '60s'; SET LOCAL lock_timeout = 0; \
             SELECT * FROM \"s\".\"f\"($l$a'b\\c$l$, -2::bigint, \
             ARRAY[$l$x$l$, (convert_from(decode('7924', 'hex'), 'UTF8') COLLATE \"default\")]::text[], \
             ARRAY[1, 2]::bigint[], \
             (convert_from(decode('6e00756c', 'hex'), 'UTF8') COLLATE \"default\"))"
        );
    }
}
