//! The core [`Backend`] methods on Redis: one script call each.

use std::time::Duration;

use super::{
    FENCE_MARGIN, RENEW_CHUNK, RedisBackend,
    acquire::Target,
    commands::ScriptCall,
    malformed_token, millis,
    names::Names,
    outcome, remaining,
    scripts::{EXTEND, HOLDER, RELEASE, RENEW, WAITERS},
};
use crate::{
    AcquireRequest, Backend, BoxFuture, Capabilities, ExtendMode, Grant, Holder, LockError,
    LockKey, Renewal, Token,
};
use crate::{BackendError, BackendErrorKind};

impl RedisBackend {
    /// One [`RENEW`] call for `chunk`: whether each lease was renewed.
    async fn renew_chunk(&self, chunk: &[Renewal]) -> Result<Vec<bool>, LockError> {
        let mut inv = ScriptCall::new(&RENEW, chunk.len());
        for lease in chunk {
            inv.key(self.inner.names(&lease.key).lock());
        }
        for lease in chunk {
            inv.arg(lease.token.as_str()).arg(millis(lease.ttl));
        }
        let results: Vec<i64> = self.inner.call("renew", &inv).await?;
        if results.len() != chunk.len() {
            return Err(LockError::Backend(BackendError::new(
                BackendErrorKind::Protocol,
                "renew script answered the wrong number of results",
            )));
        }
        Ok(results.into_iter().map(|r| r == 1).collect())
    }
}

/// The keys and arguments of [`RELEASE`], which [`COMPLETE`](super::scripts::COMPLETE)
/// also takes first. (A hand-off lasts the waiter's claim period, which its ticket carries.)
/// `extra_keys`: keys the caller adds after these (before any argument).
pub(super) fn release_call(
    script: &redis::Script,
    names: Names<'_>,
    extra_keys: usize,
) -> ScriptCall {
    let mut inv = ScriptCall::new(script, 3 + extra_keys);
    inv.key(names.lock()).key(names.fence()).key(names.queue());
    inv
}

/// The arguments of [`RELEASE`], after every key.
pub(super) fn release_args(inv: &mut ScriptCall, names: Names<'_>, token: &Token) {
    inv.arg(token.as_str())
        .arg(names.channel())
        .arg(millis(FENCE_MARGIN));
}

impl super::Inner {
    /// What a release script answered tells which way the key's next acquire should look
    /// (see [`Contended`](super::contended::Contended)).
    pub(super) fn released(&self, names: Names<'_>, code: i64) {
        match code {
            2 => self.contended.mark(names.tag),
            1 => self.contended.clear(names.tag),
            _ => {}
        }
    }
}

impl Backend for RedisBackend {
    fn acquire(&self, req: AcquireRequest) -> BoxFuture<'_, Result<Grant, LockError>> {
        Box::pin(self.inner.clone().acquire(req, Target::Lock))
    }

    fn release<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(async move {
            let names = self.inner.names(key);
            let mut inv = release_call(&RELEASE, names, 0);
            release_args(&mut inv, names, token);
            let released = self.inner.call("release", &inv).await?;
            self.inner.released(names, released);
            outcome(released)
        })
    }

    fn extend<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        ttl: Duration,
        mode: ExtendMode,
    ) -> BoxFuture<'a, Result<Duration, LockError>> {
        Box::pin(async move {
            let mut inv = ScriptCall::new(&EXTEND, 1);
            inv.key(self.inner.names(key).lock())
                .arg(token.as_str())
                .arg(millis(ttl))
                .arg(match mode {
                    ExtendMode::Add => "add",
                    ExtendMode::Replace => "replace",
                });
            let left: i64 = self.inner.call("extend", &inv).await?;
            outcome(left)?;
            Ok(Duration::from_millis(u64::try_from(left).unwrap_or(1)))
        })
    }

    fn renew<'a>(&'a self, leases: &'a [Renewal]) -> BoxFuture<'a, Result<Vec<bool>, LockError>> {
        Box::pin(async move {
            if self.inner.cluster {
                // The leases' keys are in as many slots as there are leases (one hash tag
                // per lock), and a script may touch only one slot: one call per lease, all
                // at once. (Grouping by slot would save calls only for leases that happen
                // to share one.)
                let calls = leases
                    .iter()
                    .map(|lease| self.renew_chunk(std::slice::from_ref(lease)));
                let mut renewed = Vec::with_capacity(leases.len());
                for one in futures_util::future::join_all(calls).await {
                    renewed.extend(one?);
                }
                return Ok(renewed);
            }
            let mut renewed = Vec::with_capacity(leases.len());
            for chunk in leases.chunks(RENEW_CHUNK) {
                renewed.extend(self.renew_chunk(chunk).await?);
            }
            Ok(renewed)
        })
    }

    fn holder<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<Option<Holder>, LockError>> {
        Box::pin(async move {
            let mut inv = ScriptCall::new(&HOLDER, 1);
            inv.key(self.inner.names(key).lock());
            let (token, pttl): (String, i64) = self.inner.call("holder", &inv).await?;
            if token.is_empty() {
                return Ok(None);
            }
            let token = Token::new(&token).map_err(malformed_token)?;
            Ok(Some(Holder::new(token, remaining(pttl))))
        })
    }

    fn waiters<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<usize, LockError>> {
        Box::pin(async move {
            let mut inv = ScriptCall::new(&WAITERS, 1);
            inv.key(self.inner.names(key).queue());
            let n: i64 = self.inner.call("waiters", &inv).await?;
            Ok(usize::try_from(n).unwrap_or(0))
        })
    }

    fn resets(&self) -> Option<crate::Resets> {
        Some(self.inner.resets.clone())
    }

    fn capabilities(&self) -> Capabilities<'_> {
        let capabilities = Capabilities::none()
            .with_admin(self)
            .with_numeric(self)
            .with_records(self)
            .with_permits(self);
        if self.inner.cluster {
            // A pool's holders are read in one script over every member's lock key, which
            // lie in as many slots: not valid in a cluster (see the module docs).
            return capabilities;
        }
        capabilities.with_pools(self)
    }
}
