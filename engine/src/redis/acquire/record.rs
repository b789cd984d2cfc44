//! [`RecordBackend::acquire_or_record`](crate::RecordBackend::acquire_or_record) on Redis:
//! the first attempt reads the record in the same script; a grant after a wait reads it
//! again, and gives the key back if it is there.

use std::sync::Arc;

use super::super::{
    Inner,
    names::Names,
    records::{Fields, stored},
    release::{release_args, release_call},
    scripts::RELEASE,
};
use crate::{AcquireRequest, GrantOrRecord, LockError, LockKey, Token};

impl Inner {
    /// [`RecordBackend::acquire_or_record`](crate::RecordBackend::acquire_or_record): the
    /// first attempt reads the record in the same script; a grant after a wait reads it
    /// again (the holder before may have completed), and gives the key back if it is there.
    pub(in crate::redis) async fn acquire_or_record(
        self: Arc<Self>,
        req: AcquireRequest,
    ) -> Result<GrantOrRecord, LockError> {
        let (key, token) = (req.key.clone(), req.token.clone());
        if req.mode.is_shared() {
            // Records live beside the key's lock.
            return Err(LockError::Unsupported("records of shared leases"));
        }
        let (found, at_once) = self.clone().acquire_inner(req, true).await?;
        let grant = match found {
            GrantOrRecord::Grant(grant) if !at_once => grant,
            decided => return Ok(decided),
        };
        // The key is ours from here, but no lease holds it yet: a caller that goes away
        // during the read below (or the give-back) must not leave it held by nobody.
        let mut unclaimed = Unclaimed {
            inner: self.clone(),
            key: key.clone(),
            token: token.clone(),
            armed: true,
        };
        let names = self.names(&key);
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(names.record())
            .arg("fp")
            .arg("meta")
            .arg("body")
            .arg("at");
        let read = self.commands.query::<Fields>("record", &cmd).await;
        let answer = match read {
            Ok(fields) => match stored(fields.0, fields.1, fields.2, fields.3) {
                Ok(None) => {
                    unclaimed.armed = false;
                    return Ok(GrantOrRecord::Grant(grant));
                }
                Ok(Some(record)) => Ok(GrantOrRecord::Record(record)),
                Err(e) => Err(e),
            },
            Err(e) => Err(LockError::Backend(e)),
        };
        // Given back before the answer, so that a caller told of the record finds the key
        // free. A caller gone during this give-back gives it back again (harmless: the
        // second finds nothing of this token's).
        self.give_back(names, &token).await;
        unclaimed.armed = false;
        answer
    }

    /// Release a grant nobody will use (best effort: the lease's TTL frees it otherwise).
    async fn give_back(&self, names: Names<'_>, token: &Token) {
        let mut inv = release_call(&RELEASE, names, 0);
        release_args(&mut inv, names, token);
        inv.repeatable();
        match self.call::<i64>("release", &inv).await {
            Ok(code) => self.released(names, code),
            Err(error) => tracing::debug!(%error, "giving back a grant failed; its TTL frees it"),
        }
    }
}

/// A grant this acquire has received but not handed to its caller: given back (on the
/// engine's runtime, which outlives the caller's) if the acquire is dropped first.
struct Unclaimed {
    inner: Arc<Inner>,
    key: LockKey,
    token: Token,
    armed: bool,
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (inner, key, token) = (self.inner.clone(), self.key.clone(), self.token.clone());
        crate::runtime::handle().spawn(async move {
            inner.give_back(inner.names(&key), &token).await;
        });
    }
}
