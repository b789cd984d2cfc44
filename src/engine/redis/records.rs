//! The Redis backend's records ([`RecordBackend`]): one hash per record, under the lock's
//! hash tag (so a lock and its record share a Cluster slot), expiring after its retention.

use std::time::Duration;

use bytes::Bytes;

use super::{
    RedisBackend, backend::release_args, millis, names::object_name, outcome, scripts::COMPLETE,
};
use crate::engine::{
    BoxFuture, LockError, LockKey, Record, RecordBackend, Token, from_unix_millis, unix_millis,
};
use crate::error::{BackendError, BackendErrorKind};

impl RecordBackend for RedisBackend {
    fn record<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<Option<Record>, LockError>> {
        Box::pin(async move {
            // A plain HMGET: one round trip, and a fraction of a script's server time.
            let mut cmd = redis::cmd("HMGET");
            cmd.arg(object_name(&self.inner.prefix, "rec", key))
                .arg("fp")
                .arg("meta")
                .arg("body")
                .arg("at");
            type Fields = (
                Option<Vec<u8>>,
                Option<Vec<u8>>,
                Option<Vec<u8>>,
                Option<u64>,
            );
            let (fp, meta, body, at): Fields = self
                .inner
                .pool
                .query("record", &cmd)
                .await
                .map_err(LockError::Backend)?;
            match (fp, meta, body, at) {
                (Some(fp), Some(meta), Some(body), Some(at)) => Ok(Some(Record {
                    fingerprint: Bytes::from(fp),
                    meta: Bytes::from(meta),
                    body: Bytes::from(body),
                    completed_at: from_unix_millis(at),
                })),
                (None, None, None, None) => Ok(None),
                // Written in one HSET: a partial hash is not ours, and is never served.
                _ => Err(LockError::Backend(BackendError::new(
                    BackendErrorKind::Protocol,
                    "record hash is missing fields",
                ))),
            }
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
            let names = self.inner.names(key);
            let mut inv = COMPLETE.prepare_invoke();
            release_args(&mut inv, &names, token);
            inv.key(object_name(&self.inner.prefix, "rec", key))
                .arg(&record.fingerprint[..])
                .arg(&record.meta[..])
                .arg(&record.body[..])
                .arg(unix_millis(record.completed_at))
                .arg(millis(retention));
            outcome(self.inner.call("complete", &inv).await?)
        })
    }
}
