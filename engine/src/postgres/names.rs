//! [`Names`]: the qualified, quoted names of one schema and table prefix (tables,
//! functions, the `NOTIFY` channel, the advisory locks' class), validated once.

use super::{
    MAX_NAME_LEN,
    schema::{SCHEMA_VERSION, migration},
};
use crate::{BackendError, BackendErrorKind};

/// The qualified, quoted names of one schema and table prefix.
#[derive(Clone, Debug)]
pub(super) struct Names {
    schema: String,
    prefix: String,
    /// `"<schema>"."<prefix>"`, to which a table or function name is appended.
    qualified: String,
    /// The first key of the advisory locks: a hash of schema and prefix, so that two
    /// deployments in one database never wait for each other.
    class: i32,
    acquire: String,
    release: String,
    leave: String,
    extend: String,
    renew: String,
    holder: String,
    waiters: String,
    sweep: String,
    admin_set: String,
    force_release: String,
    compare_and_set: String,
    numeric_get: String,
    pool_modify: String,
    pool_members: String,
    pool_holders: String,
    complete: String,
    record: String,
    forget: String,
}

impl Names {
    /// The names for `schema` and `prefix`, if both are plain lower-case identifiers.
    pub(super) fn new(schema: &str, prefix: &str) -> Result<Self, BackendError> {
        let plain = |s: &str| {
            s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        };
        if schema.is_empty()
            || schema.len() > MAX_NAME_LEN
            || !plain(schema)
            || schema.as_bytes()[0].is_ascii_digit()
        {
            return Err(BackendError::new(
                BackendErrorKind::Config,
                format!(
                    "schema {schema:?}: 1 to {MAX_NAME_LEN} bytes of a-z, 0-9 and _, not \
                     starting with a digit"
                ),
            ));
        }
        if prefix.len() > MAX_NAME_LEN || !plain(prefix) {
            return Err(BackendError::new(
                BackendErrorKind::Config,
                format!("table prefix {prefix:?}: at most {MAX_NAME_LEN} bytes of a-z, 0-9 and _"),
            ));
        }
        let qualified = format!("\"{schema}\".\"{prefix}");
        let function = |name: &str| format!("{qualified}{name}\"");
        // FNV-1a: stable across builds and platforms (the class must agree between nodes).
        let mut hash: u32 = 0x811c_9dc5;
        for byte in schema.bytes().chain([b'.']).chain(prefix.bytes()) {
            hash = (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193);
        }
        Ok(Self {
            schema: schema.to_owned(),
            prefix: prefix.to_owned(),
            class: i32::from_ne_bytes(hash.to_ne_bytes()),
            acquire: function("acquire"),
            release: function("release"),
            leave: function("leave"),
            extend: function("extend"),
            renew: function("renew"),
            holder: function("holder"),
            waiters: function("waiters"),
            sweep: function("sweep"),
            admin_set: function("admin_set"),
            force_release: function("force_release"),
            compare_and_set: function("compare_and_set"),
            numeric_get: function("numeric_get"),
            pool_modify: function("pool_modify"),
            pool_members: function("pool_members"),
            pool_holders: function("pool_holders"),
            complete: function("complete"),
            record: function("record"),
            forget: function("forget"),
            qualified,
        })
    }

    pub(super) fn schema(&self) -> &str {
        &self.schema
    }

    pub(super) fn prefix(&self) -> &str {
        &self.prefix
    }

    pub(super) fn acquire(&self) -> &str {
        &self.acquire
    }

    pub(super) fn release(&self) -> &str {
        &self.release
    }

    pub(super) fn leave(&self) -> &str {
        &self.leave
    }

    pub(super) fn extend(&self) -> &str {
        &self.extend
    }

    pub(super) fn renew(&self) -> &str {
        &self.renew
    }

    pub(super) fn holder(&self) -> &str {
        &self.holder
    }

    pub(super) fn waiters(&self) -> &str {
        &self.waiters
    }

    pub(super) fn sweep(&self) -> &str {
        &self.sweep
    }

    pub(super) fn admin_set(&self) -> &str {
        &self.admin_set
    }

    pub(super) fn force_release(&self) -> &str {
        &self.force_release
    }

    pub(super) fn compare_and_set(&self) -> &str {
        &self.compare_and_set
    }

    pub(super) fn numeric_get(&self) -> &str {
        &self.numeric_get
    }

    pub(super) fn pool_modify(&self) -> &str {
        &self.pool_modify
    }

    pub(super) fn pool_members(&self) -> &str {
        &self.pool_members
    }

    pub(super) fn pool_holders(&self) -> &str {
        &self.pool_holders
    }

    pub(super) fn complete(&self) -> &str {
        &self.complete
    }

    pub(super) fn record(&self) -> &str {
        &self.record
    }

    pub(super) fn forget(&self) -> &str {
        &self.forget
    }

    /// The qualified name of table `name`.
    pub(super) fn table(&self, name: &str) -> String {
        format!("{}{name}\"", self.qualified)
    }

    /// The base of the `NOTIFY` channels of hand-offs: a node's is `<base>_<node>` (8 hex
    /// digits), at most 2 × 24 + 5 + 9 = 62 bytes: under the 63 of an identifier. (A
    /// version 4 node listens on the base itself.)
    pub(super) fn channel(&self) -> String {
        format!("{}.{}wake", self.schema, self.prefix)
    }

    /// The statement that reads the schema's version.
    pub(super) fn version_query(&self) -> String {
        format!(
            "SELECT max(version)::bigint FROM {}",
            self.table("schema_version")
        )
    }

    /// The whole migration, one multi-statement message (one implicit transaction),
    /// serialized against concurrent migrations by an advisory lock.
    pub(super) fn migration(&self) -> String {
        let channel = self.channel();
        migration()
            .replace("@schema@", &format!("\"{}\"", self.schema))
            .replace("@locks@", &self.table("locks"))
            .replace("@tickets@", &self.table("tickets"))
            .replace("@numbers@", &self.table("numbers"))
            .replace("@shared@", &self.table("shared_leases"))
            .replace(
                "@old_shared_fences@",
                &format!("\"{}shared_fences\"", self.prefix),
            )
            .replace(
                "@old_shared_tickets@",
                &format!("\"{}shared_tickets\"", self.prefix),
            )
            .replace("@old@", &self.qualified)
            .replace("@records@", &self.table("records"))
            .replace("@complete@", &self.complete)
            .replace("@record@", &self.record)
            .replace("@forget@", &self.forget)
            .replace("@pools@", &self.table("pools"))
            .replace("@pool_modify@", &self.pool_modify)
            .replace("@pool_members@", &self.pool_members)
            .replace("@pool_holders@", &self.pool_holders)
            .replace("@compare_and_set@", &self.compare_and_set)
            .replace("@numeric_get@", &self.numeric_get)
            .replace("@version@", &self.table("schema_version"))
            .replace(
                "@locks_expiry@",
                &format!("\"{}locks_expiry\"", self.prefix),
            )
            .replace(
                "@locks_queued@",
                &format!("\"{}locks_queued\"", self.prefix),
            )
            .replace(
                "@tickets_deadline@",
                &format!("\"{}tickets_deadline\"", self.prefix),
            )
            .replace(
                "@shared_expiry@",
                &format!("\"{}shared_expiry\"", self.prefix),
            )
            .replace(
                "@numbers_expiry@",
                &format!("\"{}numbers_expiry\"", self.prefix),
            )
            .replace(
                "@records_expiry@",
                &format!("\"{}records_expiry\"", self.prefix),
            )
            .replace(
                "@queue_index@",
                &format!("\"{}tickets_queue\"", self.prefix),
            )
            .replace("@handoff@", &format!("{}handoff\"", self.qualified))
            .replace("@pump@", &format!("{}pump\"", self.qualified))
            .replace("@us@", &format!("{}us\"", self.qualified))
            .replace("@ms@", &format!("{}ms\"", self.qualified))
            .replace("@admin_set@", &self.admin_set)
            .replace("@force_release@", &self.force_release)
            .replace("@acquire@", &self.acquire)
            .replace("@release@", &self.release)
            .replace("@leave@", &self.leave)
            .replace("@extend@", &self.extend)
            .replace("@renew@", &self.renew)
            .replace("@holder@", &self.holder)
            .replace("@waiters@", &self.waiters)
            .replace("@sweep@", &self.sweep)
            .replace("@class@", &self.class.to_string())
            .replace("@channel@", &format!("'{channel}'"))
            .replace("@schema_version@", &SCHEMA_VERSION.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_plain_identifiers() {
        assert!(Names::new("tower_lock", "").is_ok());
        assert!(Names::new("s1", "app_").is_ok());
        for (schema, prefix) in [
            ("", ""),
            ("1s", ""),
            ("Upper", ""),
            ("s\"x", ""),
            ("s", "a b"),
            ("s", &"p".repeat(MAX_NAME_LEN + 1)),
        ] {
            let e = Names::new(schema, prefix).unwrap_err();
            assert_eq!(e.kind(), BackendErrorKind::Config);
        }
    }

    #[test]
    fn the_migration_names_everything() {
        let sql = Names::new("s", "p_").unwrap().migration();
        assert!(!sql.contains('@'), "an unfilled name: {sql}");
        assert!(sql.contains("\"s\".\"p_locks\""));
        assert!(sql.contains("'s.p_wake'"));
    }
}
