//! The rule for the schema and prefix names of tower-lock's own Postgres tables (the
//! fences table, the transactional layer's records table).

/// The names taken, in the characters the Postgres lock engine takes: lower-case ASCII
/// letters, digits and `_`, not starting with a digit (so a name needs no escaping inside
/// its quotes, and one spelling is one name: no `"Order"` beside `order`), at most 40
/// bytes (room for the table names' suffixes within Postgres's 63). Quoted wherever they
/// are used, so reserved words are fine.
pub(crate) fn plain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 40
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}
