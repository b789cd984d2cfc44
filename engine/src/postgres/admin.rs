//! The admin capability on Postgres ([`AdminBackend`]): one function call each.

use std::time::Duration;

use super::{PostgresBackend, acquire::int, millis, sql::Call};
use crate::{AdminBackend, BoxFuture, LockError, LockKey, Token};

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
}
