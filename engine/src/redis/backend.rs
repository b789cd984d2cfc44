//! The core [`Backend`] methods on Redis, in both modes: one script call each, on the
//! key's one space (see `scripts`).

use crate::runtime::with_drivers;
use std::time::Duration;

use super::{
    RENEW_CHUNK, RedisBackend,
    commands::ScriptCall,
    malformed_token, millis, outcome, remaining,
    scripts::{EXTEND, HOLDERS, RENEW, WAITERS},
};
use crate::{
    AcquireRequest, Backend, BoxFuture, Capabilities, ExtendMode, Fence, Grant, Holder,
    HolderLabel, LockError, LockKey, Mode, Renewal, Token,
};
use crate::{BackendError, BackendErrorKind};

impl RedisBackend {
    /// One [`RENEW`] call for `chunk` of leases, of either mode: whether each was renewed.
    async fn renew_chunk(&self, chunk: &[&Renewal]) -> Result<Vec<bool>, LockError> {
        let mut inv = ScriptCall::new(&RENEW, 2 * chunk.len());
        inv.repeatable();
        for lease in chunk {
            let names = self.inner.names(&lease.key);
            inv.key(names.lock()).key(names.holders());
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

impl Backend for RedisBackend {
    fn acquire(&self, req: AcquireRequest) -> BoxFuture<'_, Result<Grant, LockError>> {
        with_drivers(Box::pin(self.inner.clone().acquire(req)))
    }

    fn release<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        _mode: Mode,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        // One space per key: the script finds the token alone or among the shared holders.
        with_drivers(Box::pin(
            self.inner.release_lock(self.inner.names(key), token),
        ))
    }

    fn extend<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        _mode: Mode,
        ttl: Duration,
        how: ExtendMode,
    ) -> BoxFuture<'a, Result<Duration, LockError>> {
        with_drivers(Box::pin(async move {
            let names = self.inner.names(key);
            let mut inv = ScriptCall::new(&EXTEND, 2);
            inv.key(names.lock())
                .key(names.holders())
                .arg(token.as_str())
                .arg(millis(ttl))
                .arg(match how {
                    ExtendMode::Add => "add",
                    ExtendMode::Replace => "replace",
                });
            let left: i64 = self.inner.call("extend", &inv).await?;
            outcome(left)?;
            Ok(Duration::from_millis(u64::try_from(left).unwrap_or(1)))
        }))
    }

    fn renew<'a>(&'a self, leases: &'a [Renewal]) -> BoxFuture<'a, Result<Vec<bool>, LockError>> {
        with_drivers(Box::pin(async move {
            let leases: Vec<&Renewal> = leases.iter().collect();
            let mut renewed = Vec::with_capacity(leases.len());
            if self.inner.cluster {
                // The leases' keys are in as many slots as there are leases (one hash tag
                // per key), and a script may touch only one slot: one call per lease, all
                // at once.
                let calls = leases
                    .iter()
                    .map(|lease| self.renew_chunk(std::slice::from_ref(lease)));
                for one in futures_util::future::join_all(calls).await {
                    renewed.extend(one?);
                }
                return Ok(renewed);
            }
            for chunk in leases.chunks(RENEW_CHUNK) {
                renewed.extend(self.renew_chunk(chunk).await?);
            }
            Ok(renewed)
        }))
    }

    fn holders<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<Vec<Holder>, LockError>> {
        with_drivers(Box::pin(async move {
            let names = self.inner.names(key);
            let mut inv = ScriptCall::new(&HOLDERS, 2);
            inv.repeatable();
            inv.key(names.lock()).key(names.holders());
            let flat: Vec<(String, i64, String, String, String)> =
                self.inner.call("holders", &inv).await?;
            flat.into_iter()
                .map(|(token, pttl, mode, fence, label)| {
                    let token = Token::new(&token).map_err(malformed_token)?;
                    let holder = match mode.as_str() {
                        "x" => Holder::new(token, remaining(pttl)),
                        alone => Holder::shared(token, remaining(pttl), alone == "a"),
                    }
                    .with_label(HolderLabel::stored(&label));
                    Ok(match fence.parse() {
                        Ok(fence) => holder.with_fence(Fence::new(fence)),
                        Err(_) => holder,
                    })
                })
                .collect()
        }))
    }

    fn waiters<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<usize, LockError>> {
        with_drivers(Box::pin(async move {
            let mut inv = ScriptCall::new(&WAITERS, 1);
            inv.repeatable();
            inv.key(self.inner.names(key).tickets());
            let n: i64 = self.inner.call("waiters", &inv).await?;
            Ok(usize::try_from(n).unwrap_or(0))
        }))
    }

    fn has_shared_mode(&self) -> bool {
        true
    }

    fn resets(&self) -> Option<crate::Resets> {
        Some(self.inner.resets.clone())
    }

    fn capabilities(&self) -> Capabilities<'_> {
        let capabilities = Capabilities::none()
            .with_admin(self)
            .with_numeric(self)
            .with_records(self);
        if self.inner.cluster {
            // A pool's holders are read in one script over every member's lock key, which
            // lie in as many slots: not valid in a cluster (see the module docs).
            return capabilities;
        }
        capabilities.with_pools(self)
    }
}
