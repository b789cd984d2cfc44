//! The core [`Backend`] methods on Redis, in both modes: one script call each, on the
//! lock's keys and scripts or on the shared leases' (see [`shared`](super::shared)).

use crate::runtime::with_drivers;
use std::time::Duration;

use super::{
    RENEW_CHUNK, RedisBackend,
    commands::ScriptCall,
    malformed_token, millis, outcome, remaining,
    scripts::{EXTEND, HOLDER, RENEW},
};
use crate::{
    AcquireRequest, Backend, BoxFuture, Capabilities, ExtendMode, Grant, Holder, LockError,
    LockKey, Mode, Renewal, Token,
};
use crate::{BackendError, BackendErrorKind};

impl RedisBackend {
    /// One [`RENEW`] call for `chunk` of locks: whether each lease was renewed.
    async fn renew_lock_chunk(&self, chunk: &[&Renewal]) -> Result<Vec<bool>, LockError> {
        let mut inv = ScriptCall::new(&RENEW, chunk.len());
        inv.repeatable();
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

    /// One renew call for `chunk`, all of one space.
    async fn renew_chunk(&self, shared: bool, chunk: &[&Renewal]) -> Result<Vec<bool>, LockError> {
        if shared {
            self.inner.renew_shared_chunk(chunk).await
        } else {
            self.renew_lock_chunk(chunk).await
        }
    }

    /// The renewals of one space, in chunks (one per lease on a cluster).
    async fn renew_space(&self, shared: bool, leases: &[&Renewal]) -> Result<Vec<bool>, LockError> {
        let mut renewed = Vec::with_capacity(leases.len());
        if self.inner.cluster {
            // The leases' keys are in as many slots as there are leases (one hash tag per
            // key), and a script may touch only one slot: one call per lease, all at once.
            // (Grouping by slot would save calls only for leases that happen to share one.)
            let calls = leases
                .iter()
                .map(|lease| self.renew_chunk(shared, std::slice::from_ref(lease)));
            for one in futures_util::future::join_all(calls).await {
                renewed.extend(one?);
            }
            return Ok(renewed);
        }
        for chunk in leases.chunks(RENEW_CHUNK) {
            renewed.extend(self.renew_chunk(shared, chunk).await?);
        }
        Ok(renewed)
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
        mode: Mode,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        with_drivers(Box::pin(async move {
            if mode.is_shared() {
                return self.inner.release_shared(key, token).await;
            }
            self.inner.release_lock(self.inner.names(key), token).await
        }))
    }

    fn extend<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        mode: Mode,
        ttl: Duration,
        how: ExtendMode,
    ) -> BoxFuture<'a, Result<Duration, LockError>> {
        with_drivers(Box::pin(async move {
            if mode.is_shared() {
                return self.inner.extend_shared(key, token, ttl, how).await;
            }
            let mut inv = ScriptCall::new(&EXTEND, 1);
            inv.key(self.inner.names(key).lock())
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
            // The two spaces have scripts of their own: one batch each, the answers put
            // back in the order asked.
            let (shared, locks): (Vec<_>, Vec<_>) = leases
                .iter()
                .enumerate()
                .partition(|(_, r)| r.mode.is_shared());
            let mut renewed = vec![false; leases.len()];
            for (is_shared, part) in [(false, locks), (true, shared)] {
                if part.is_empty() {
                    continue;
                }
                let batch: Vec<&Renewal> = part.iter().map(|(_, r)| *r).collect();
                let answers = self.renew_space(is_shared, &batch).await?;
                for ((i, _), ok) in part.iter().zip(answers) {
                    renewed[*i] = ok;
                }
            }
            Ok(renewed)
        }))
    }

    fn holders<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<Vec<Holder>, LockError>> {
        with_drivers(Box::pin(async move {
            let mut inv = ScriptCall::new(&HOLDER, 1);
            inv.repeatable();
            inv.key(self.inner.names(key).lock());
            let lock = self.inner.call::<(String, i64)>("holder", &inv);
            let (lock, shared) =
                futures_util::future::join(lock, self.inner.shared_holders(key)).await;
            let (token, pttl) = lock?;
            let mut holders = Vec::new();
            if !token.is_empty() {
                let token = Token::new(&token).map_err(malformed_token)?;
                holders.push(Holder::new(token, remaining(pttl)));
            }
            holders.extend(shared?);
            Ok(holders)
        }))
    }

    fn waiters<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<usize, LockError>> {
        with_drivers(Box::pin(async move {
            let lock = self.inner.waiting(self.inner.names(key));
            let shared = self.inner.waiting(self.inner.shared_names(key));
            let (lock, shared) = futures_util::future::join(lock, shared).await;
            Ok(lock? + shared?)
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
