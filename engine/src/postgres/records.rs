//! The record capability on Postgres ([`RecordBackend`]): one function call each. The
//! engine's default `acquire_or_record` (read, acquire, read again) serves that method.

use std::time::Duration;

use bytes::Bytes;
use sqlx::{Row, postgres::PgRow};

use super::{
    PostgresBackend,
    acquire::{int, protocol},
    backend_error, millis,
    sql::Call,
};
use crate::{BoxFuture, LockError, LockKey, Record, RecordBackend, Token};

/// Column `i` of `row`, hex text, as bytes.
fn hex(row: &PgRow, i: usize) -> Result<Bytes, LockError> {
    let text: String = row.try_get(i).map_err(|e| backend_error("decode", e))?;
    let digit = |b: u8| match b {
        b'0'..=b'9' => Ok(b - b'0'),
        b'a'..=b'f' => Ok(b - b'a' + 10),
        _ => Err(protocol("a stored record is not hex")),
    };
    let text = text.as_bytes();
    if !text.len().is_multiple_of(2) {
        return Err(protocol("a stored record is not hex"));
    }
    text.chunks_exact(2)
        .map(|pair| Ok(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect::<Result<Vec<u8>, _>>()
        .map(Bytes::from)
}

impl RecordBackend for PostgresBackend {
    fn record<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<Option<Record>, LockError>> {
        Box::pin(async move {
            let sql = Call::function(self.inner.names.record())
                .text(key.as_str())
                .finish();
            let rows = self.inner.call("record", sql).await?;
            let Some(row) = rows.first() else {
                return Ok(None);
            };
            let at = crate::from_unix_millis(
                u64::try_from(int(Some(row), 3)?).map_err(|_| protocol("negative record time"))?,
            );
            let fingerprint = hex(row, 0)?;
            let record = if int(Some(row), 4)? == 1 {
                let mut record = Record::new(fingerprint, hex(row, 1)?, hex(row, 2)?);
                record.completed_at = at;
                record
            } else {
                Record::tombstone(fingerprint, at)
            };
            Ok(Some(record))
        })
    }

    fn record_expiry<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<Duration>, LockError>> {
        Box::pin(async move {
            // A read of the table (the schema's `record` function answers no expiry, and
            // changing its columns would need a schema version).
            let mut sql = String::from(
                "SELECT ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint FROM ",
            );
            sql.push_str(&self.inner.names.table("records"));
            sql.push_str(" WHERE key = ");
            super::sql::text_literal(&mut sql, key.as_str());
            sql.push_str(" AND expires_at > clock_timestamp()");
            let rows = self.inner.call("record expiry", sql).await?;
            if rows.is_empty() {
                return Ok(None);
            }
            let left = int(rows.first(), 0)?;
            Ok(Some(Duration::from_millis(
                u64::try_from(left).unwrap_or(0),
            )))
        })
    }

    fn complete<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        record: &'a Record,
        retention: Duration,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(async move {
            let at = i64::try_from(crate::unix_millis(record.completed_at)).unwrap_or(i64::MAX);
            let sql = Call::function(self.inner.names.complete())
                .text(key.as_str())
                .text(token.as_str())
                .bytes(&record.fingerprint)
                .bytes(if record.kept { &record.meta } else { &[] })
                .bytes(if record.kept { &record.body } else { &[] })
                .int(at)
                .int(i64::from(record.kept))
                .int(millis(retention))
                .finish();
            let rows = self.inner.call("complete", sql).await?;
            match int(rows.first(), 0)? {
                -1 => Err(LockError::NotOwned),
                c if c < 0 => Err(LockError::Expired),
                _ => Ok(()),
            }
        })
    }

    fn forget<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<bool, LockError>> {
        Box::pin(async move {
            let sql = Call::function(self.inner.names.forget())
                .text(key.as_str())
                .finish();
            let rows = self.inner.call("forget", sql).await?;
            Ok(int(rows.first(), 0)? == 1)
        })
    }
}
