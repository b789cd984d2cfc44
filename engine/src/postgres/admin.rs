//! The admin capability on Postgres ([`AdminBackend`]): one function call each.

use std::time::Duration;

use sqlx::Row;

use super::{
    PostgresBackend,
    acquire::int,
    millis,
    sql::{Call, text_literal},
};
use crate::{ActiveKey, AdminBackend, BoxFuture, Fence, LockError, LockKey, Token};

/// How long an admin's force release waits for the holders' engines to give the key back
/// before releasing it itself.
const GIVE_BACK: Duration = Duration::from_secs(1);

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

    /// The holders first: a `NOTIFY` on the hand-off channel, `"revoke\n<token>\n<key>"`
    /// per holder, which every node's listener hears; the holder's engine reads its lease
    /// lost and gives the key back (its release hands it to the next waiter). What is
    /// still held by those tokens after `GIVE_BACK` (1 s) is released here by token (the
    /// release's own compare: a waiter granted meanwhile keeps the key).
    fn force_release<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<bool, LockError>> {
        Box::pin(async move {
            let holders = crate::Backend::holders(self, key).await?;
            if !holders.is_empty() {
                let mut sql = String::new();
                for holder in &holders {
                    sql.push_str("SELECT pg_notify(");
                    text_literal(&mut sql, &self.inner.names.channel());
                    sql.push_str(", ");
                    let payload = format!("revoke\n{}\n{}", holder.token.as_str(), key.as_str());
                    text_literal(&mut sql, &payload);
                    sql.push_str(");");
                }
                self.inner.call("revoke", sql).await?;
                let give_up = tokio::time::Instant::now() + GIVE_BACK;
                let mut left = holders;
                loop {
                    let now = crate::Backend::holders(self, key).await?;
                    left.retain(|h| now.iter().any(|n| n.token == h.token));
                    if left.is_empty() || tokio::time::Instant::now() >= give_up {
                        break;
                    }
                    // Polled: an admin's call, rare; the holders' engines answer within a
                    // round trip or two when they are there at all.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                for holder in left {
                    let lim = super::backend::lim(holder.mode);
                    let sql = Call::function(self.inner.names.release())
                        .text(key.as_str())
                        .text(holder.token.as_str())
                        .int(lim)
                        .text("")
                        .finish();
                    self.inner.call("force release", sql).await?;
                }
                return Ok(true);
            }
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
    fn last_fence<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<Fence>, LockError>> {
        Box::pin(async move {
            // The key's row keeps the last fence granted in either mode, held or not, until
            // the sweeper deletes it.
            let mut sql = String::from("SELECT fence FROM ");
            sql.push_str(&self.inner.names.table("locks"));
            sql.push_str(" WHERE key = ");
            text_literal(&mut sql, key.as_str());
            let rows = self.inner.call("last_fence", sql).await?;
            if rows.is_empty() {
                return Ok(None);
            }
            let fence = int(rows.first(), 0)?;
            Ok(u64::try_from(fence).ok().map(Fence::new))
        })
    }

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
