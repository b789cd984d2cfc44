//! The numeric capability on Postgres ([`NumericBackend`]): one function call each.

use sqlx::Row;

use super::{PostgresBackend, acquire::int, backend_error, millis, sql::Call};
use crate::{BoxFuture, LockError, LockKey, NumericAction, NumericBackend, NumericOp};

impl NumericBackend for PostgresBackend {
    fn compare_and_set<'a>(
        &'a self,
        key: &'a LockKey,
        op: &'a NumericOp,
    ) -> BoxFuture<'a, Result<bool, LockError>> {
        Box::pin(async move {
            let (action, ttl) = match op.action {
                NumericAction::Set { ttl } => ("set", ttl.map_or(-1, millis)),
                NumericAction::Delete => ("del", -1),
            };
            let sql = Call::function(self.inner.names.compare_and_set())
                .text(key.as_str())
                .text(op.compare.as_str())
                .float(op.value)
                .float(op.epsilon)
                .text(action)
                .int(ttl)
                .finish();
            let row = self.inner.call("compare_and_set", sql).await?;
            Ok(int(row.first(), 0)? == 1)
        })
    }

    fn numeric_get<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<f64>, LockError>> {
        Box::pin(async move {
            let sql = Call::function(self.inner.names.numeric_get())
                .text(key.as_str())
                .finish();
            let rows = self.inner.call("numeric_get", sql).await?;
            let Some(row) = rows.first() else {
                return Ok(None);
            };
            row.try_get::<f64, _>(0)
                .map(Some)
                .map_err(|e| backend_error("decode", e))
        })
    }
}
