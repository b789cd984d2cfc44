//! The Redis backend's records ([`RecordBackend`]): one hash per record, under the lock's
//! hash tag (so a lock and its record share a Cluster slot), expiring after its retention.

use crate::runtime::with_drivers;
use std::time::Duration;

use bytes::Bytes;

use super::{
    RedisBackend, millis, outcome,
    release::{release_args, release_call},
    scripts::COMPLETE,
};
use crate::{
    AcquireRequest, Backend, BoxFuture, GrantOrRecord, LockError, LockKey, Mode, Record,
    RecordBackend, Token, from_unix_millis, unix_millis,
};
use crate::{BackendError, BackendErrorKind};

impl RecordBackend for RedisBackend {
    fn record<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<Option<Record>, LockError>> {
        with_drivers(Box::pin(async move {
            // A plain HMGET: one round trip, and a fraction of a script's server time.
            let mut cmd = redis::cmd("HMGET");
            cmd.arg(self.inner.names(key).record())
                .arg("fp")
                .arg("meta")
                .arg("body")
                .arg("at");
            let (fp, meta, body, at): Fields = self
                .inner
                .commands
                .query("record", &cmd)
                .await
                .map_err(LockError::Backend)?;
            stored(fp, meta, body, at)
        }))
    }

    fn record_expiry<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<Duration>, LockError>> {
        with_drivers(Box::pin(async move {
            // The hash's own expiry, which the completion set to the retention.
            let mut cmd = redis::cmd("PTTL");
            cmd.arg(self.inner.names(key).record());
            let left: i64 = self
                .inner
                .commands
                .query("record expiry", &cmd)
                .await
                .map_err(LockError::Backend)?;
            Ok(u64::try_from(left).ok().map(Duration::from_millis))
        }))
    }

    fn acquire_or_record(
        &self,
        req: AcquireRequest,
    ) -> BoxFuture<'_, Result<GrantOrRecord, LockError>> {
        with_drivers(Box::pin(self.inner.clone().acquire_or_record(req)))
    }

    fn forget<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<bool, LockError>> {
        with_drivers(Box::pin(async move {
            // A plain DEL of the record's hash: the lock, its queue and its fence live
            // under other names, so a holder keeps the key. An expired hash is already
            // gone, so the count is "one within its retention".
            let mut cmd = redis::cmd("DEL");
            cmd.arg(self.inner.names(key).record());
            let deleted: u64 = self
                .inner
                .commands
                .query("forget record", &cmd)
                .await
                .map_err(LockError::Backend)?;
            Ok(deleted > 0)
        }))
    }

    fn complete<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        record: &'a Record,
        retention: Duration,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        with_drivers(Box::pin(async move {
            let names = self.inner.names(key);
            let mut inv = release_call(&COMPLETE, names, 1);
            inv.key(names.record());
            release_args(&mut inv, names, token);
            // A tombstone keeps no output, whatever the record carries.
            let (meta, body) = match record.kept {
                true => (&record.meta[..], &record.body[..]),
                false => (&[][..], &[][..]),
            };
            inv.arg(&record.fingerprint[..])
                .arg(meta)
                .arg(body)
                .arg(to_at(record))
                .arg(millis(retention));
            let failed = match self.inner.call("complete", &inv).await {
                Err(LockError::Backend(e)) if connection_level(&e) => e,
                first => {
                    let code = first?;
                    self.inner.released(names, code);
                    return outcome(code);
                }
            };
            // The connection died (or stalled) with the completion on it: it may have landed
            // or not. Left there, the key would stay held for the rest of the lease's TTL
            // (every retry a 409), and then the request would run again. Once more, on a
            // fresh connection (the failure retired the old ones): safe, because the script
            // compares the token. If the first one did land, the key is no longer ours, and
            // the record it wrote is what tells.
            tracing::debug!(%key, error = %failed, "completion met a connection failure; sending it again");
            match self.inner.call::<i64>("complete", &inv).await {
                Ok(1 | 2) => Ok(()),
                Ok(code) => match self.record(key).await {
                    Ok(Some(stored)) if same_record(&stored, record) => Ok(()),
                    _ => outcome(code),
                },
                Err(again) => {
                    // Still nothing: give the key back by token rather than leave retries
                    // facing a 409 for the whole TTL. (Unless the first attempt landed
                    // unseen, the response is not stored, and a retry runs the request.)
                    if let Err(error) = self.release(key, token, Mode::Exclusive).await {
                        tracing::debug!(%key, %error, "releasing after a failed completion failed too; the lease's TTL frees the key");
                    }
                    Err(again)
                }
            }
        }))
    }
}

/// The fields of a record hash, as `HMGET fp meta body at` reads them.
pub(super) type Fields = (
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Option<i64>,
);

/// The record the fields of a hash make, if any.
pub(super) fn stored(
    fp: Option<Vec<u8>>,
    meta: Option<Vec<u8>>,
    body: Option<Vec<u8>>,
    at: Option<i64>,
) -> Result<Option<Record>, LockError> {
    match (fp, meta, body, at) {
        (Some(fp), Some(meta), Some(body), Some(at)) => {
            let (completed, kept) = from_at(at);
            Ok(Some(Record {
                fingerprint: Bytes::from(fp),
                meta: Bytes::from(meta),
                body: Bytes::from(body),
                completed_at: from_unix_millis(completed),
                kept,
            }))
        }
        (None, None, None, None) => Ok(None),
        // Written in one HSET: a partial hash is not ours, and is never served.
        _ => Err(LockError::Backend(BackendError::new(
            BackendErrorKind::Protocol,
            "record hash is missing fields",
        ))),
    }
}

/// A failure that says nothing about whether the call ran: the connection broke or the
/// reply did not come in time. (A refusal says it did not run: the lease sends it again,
/// with backoff, see [`Lease::complete`](crate::Lease::complete).)
fn connection_level(e: &BackendError) -> bool {
    matches!(
        e.kind(),
        BackendErrorKind::Unavailable | BackendErrorKind::Timeout
    ) && !e.is_refusal()
}

/// Whether `stored` is the record this completion wrote (same request, same response, same
/// completion time to the millisecond).
fn same_record(stored: &Record, ours: &Record) -> bool {
    stored.fingerprint == ours.fingerprint
        && stored.kept == ours.kept
        && (!ours.kept || (stored.meta == ours.meta && stored.body == ours.body))
        && unix_millis(stored.completed_at) == unix_millis(ours.completed_at)
}

/// The `at` field of a record hash: the completion time in Unix ms, negated (minus one,
/// so that 0 stays apart) for a tombstone. Kept in the existing field so that the
/// completion script stays as it is and a hash stays one `HSET`.
fn to_at(record: &Record) -> i64 {
    let ms = i64::try_from(unix_millis(record.completed_at)).unwrap_or(i64::MAX);
    if record.kept { ms } else { -ms - 1 }
}

/// The completion time (Unix ms) and whether the output was kept, from an `at` field.
fn from_at(at: i64) -> (u64, bool) {
    if at >= 0 {
        (at.unsigned_abs(), true)
    } else {
        ((-(at + 1)).unsigned_abs(), false)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use bytes::Bytes;

    use super::*;

    #[test]
    fn the_at_field_carries_the_completion_time_and_the_tombstone_mark() {
        for ms in [0u64, 1, 1_764_000_000_123] {
            let at = UNIX_EPOCH + Duration::from_millis(ms);
            let mut kept = Record::new(Bytes::from("fp"), Bytes::new(), Bytes::new());
            kept.completed_at = at;
            assert_eq!(from_at(to_at(&kept)), (ms, true));
            let tombstone = Record::tombstone(Bytes::from("fp"), at);
            assert_eq!(from_at(to_at(&tombstone)), (ms, false));
        }
    }
}
