//! The lock pool capability on Postgres ([`PoolBackend`]): one function call each.

use sqlx::{Row, postgres::PgRow};

use super::{
    PostgresBackend, acquire::int, acquire::protocol, backend_error, remaining, sql::Call,
};
use crate::{BoxFuture, Holder, LockError, LockKey, PoolBackend, PoolHolders, PoolOp, Token};

fn text(row: &PgRow, i: usize) -> Result<Option<String>, LockError> {
    row.try_get::<Option<String>, _>(i)
        .map_err(|e| backend_error("decode", e))
}

fn member(row: &PgRow) -> Result<LockKey, LockError> {
    let member = text(row, 0)?.ok_or_else(|| protocol("a pool member is NULL"))?;
    LockKey::new(&member).map_err(|_| protocol("stored pool member is malformed"))
}

impl PoolBackend for PostgresBackend {
    fn pool_modify<'a>(
        &'a self,
        pool: &'a LockKey,
        op: &'a PoolOp,
    ) -> BoxFuture<'a, Result<usize, LockError>> {
        Box::pin(async move {
            let (name, keys): (&str, &[LockKey]) = match op {
                PoolOp::Add(keys) => ("add", keys),
                PoolOp::Remove(keys) => ("rem", keys),
                PoolOp::Replace(keys) => ("replace", keys),
                PoolOp::Clear => ("clear", &[]),
            };
            let sql = Call::function(self.inner.names.pool_modify())
                .text(pool.as_str())
                .text(name)
                .texts(keys.iter().map(LockKey::as_str))
                .finish();
            let rows = self.inner.call("pool_modify", sql).await?;
            Ok(usize::try_from(int(rows.first(), 0)?).unwrap_or(0))
        })
    }

    fn pool_members<'a>(
        &'a self,
        pool: &'a LockKey,
    ) -> BoxFuture<'a, Result<Vec<LockKey>, LockError>> {
        Box::pin(async move {
            let sql = Call::function(self.inner.names.pool_members())
                .text(pool.as_str())
                .finish();
            let rows = self.inner.call("pool_members", sql).await?;
            let mut members = rows.iter().map(member).collect::<Result<Vec<_>, _>>()?;
            // Sorted here: the database's collation need not be bytewise.
            members.sort();
            Ok(members)
        })
    }

    fn pool_holders<'a>(
        &'a self,
        pool: &'a LockKey,
    ) -> BoxFuture<'a, Result<PoolHolders, LockError>> {
        Box::pin(async move {
            let sql = Call::function(self.inner.names.pool_holders())
                .text(pool.as_str())
                .finish();
            let rows = self.inner.call("pool_holders", sql).await?;
            let mut out = Vec::with_capacity(rows.len());
            for row in &rows {
                let holder = match text(row, 1)? {
                    None => None,
                    Some(token) => Some(Holder::new(
                        Token::new(&token).map_err(|_| protocol("stored token is malformed"))?,
                        remaining(int(Some(row), 2)?),
                    )),
                };
                out.push((member(row)?, holder));
            }
            out.sort_by(|a, b| a.0.cmp(&b.0));
            Ok(out)
        })
    }
}
