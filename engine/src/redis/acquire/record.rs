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
use crate::{AcquireRequest, GrantOrRecord, LockError, Token};

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
        let names = self.names(&key);
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(names.record())
            .arg("fp")
            .arg("meta")
            .arg("body")
            .arg("at");
        let read = self.commands.query::<Fields>("record", &cmd).await;
        let fields = match read {
            Ok(fields) => fields,
            Err(e) => {
                self.give_back(names, &token).await;
                return Err(LockError::Backend(e));
            }
        };
        match stored(fields.0, fields.1, fields.2, fields.3) {
            Ok(None) => Ok(GrantOrRecord::Grant(grant)),
            Ok(Some(record)) => {
                self.give_back(names, &token).await;
                Ok(GrantOrRecord::Record(record))
            }
            Err(e) => {
                self.give_back(names, &token).await;
                Err(e)
            }
        }
    }

    /// Release a grant nobody will use (best effort: the lease's TTL frees it otherwise).
    async fn give_back(&self, names: Names<'_>, token: &Token) {
        let mut inv = release_call(&RELEASE, names, 0);
        release_args(&mut inv, names, token);
        match self.call::<i64>("release", &inv).await {
            Ok(code) => self.released(names, code),
            Err(error) => tracing::debug!(%error, "giving back a grant failed; its TTL frees it"),
        }
    }
}
