//! The admin capability on Postgres ([`AdminBackend`]): one function call each.

use std::time::Duration;

use sqlx::Row;

use super::{
    PostgresBackend,
    acquire::int,
    millis,
    sql::{Call, text_literal},
};
use crate::{ActiveKey, AdminBackend, BoxFuture, LockError, LockKey, Token};

impl AdminBackend for PostgresBackend {
    fn admin_set<'a>(
        &'a self,
        key: &'a LockKey,
        value: &'a Token,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(async move {
            let sql = Call::function(self.inner.names.admin_set())
                .text(key.as_str())
                .text(value.as_str())
                .int(ttl.map_or(-1, millis))
                .finish();
            int(self.inner.call("admin_set", sql).await?.first(), 0)?;
            Ok(())
        })
    }

    fn force_release<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<bool, LockError>> {
        Box::pin(async move {
            let sql = Call::function(self.inner.names.force_release())
                .text(key.as_str())
                .finish();
            let row = self.inner.call("force_release", sql).await?;
            Ok(int(row.first(), 0)? == 1)
        })
    }

    /// One statement on the key rows, in the order of their primary key from `after`: an
    /// index range scan, stopped at `limit` rows that hold or queue (a row holds while its
    /// lock's or a shared lease's expiry is ahead; `queued` says tickets exist).
    fn active_keys<'a>(
        &'a self,
        after: Option<&'a LockKey>,
        starts_with: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<ActiveKey>, LockError>> {
        Box::pin(async move {
            let mut sql = String::from("SELECT key, held, queued FROM (SELECT key, ");
            sql.push_str("(token IS NOT NULL AND expires_at > clock_timestamp()) ");
            sql.push_str("OR shared_until > clock_timestamp() AS held, queued FROM ");
            sql.push_str(&self.inner.names.table("locks"));
            sql.push_str(" WHERE key > ");
            text_literal(&mut sql, after.map_or("", LockKey::as_str));
            sql.push_str(" AND key >= ");
            text_literal(&mut sql, starts_with);
            sql.push_str(" AND starts_with(key, ");
            text_literal(&mut sql, starts_with);
            sql.push_str(") ORDER BY key) k WHERE held OR queued ORDER BY key LIMIT ");
            sql.push_str(&limit.min(10_000).to_string());
            let rows = self.inner.call("active_keys", sql).await?;
            rows.iter()
                .map(|row| {
                    let decode = |e| super::backend_error("decode", e);
                    let key: String = row.try_get(0).map_err(decode)?;
                    Ok(ActiveKey::new(
                        LockKey::new(&key)?,
                        row.try_get(1).map_err(decode)?,
                        row.try_get(2).map_err(decode)?,
                    ))
                })
                .collect()
        })
    }
}
