//! [`Altered`], a test backend: the in-process one with what a test changes of it.

use std::time::Duration;

use crate::{
    AcquireRequest, Backend, BoxFuture, ExtendMode, Grant, Holder, LockError, LockKey,
    MemoryBackend, Mode, Renewal, Resets, Token,
};

/// The in-process backend (seen as a backend across the network: nothing is decided
/// synchronously), whose grants carry `claim` if set (`Duration::ZERO`: every grant has run
/// out by the time it is returned), and which reports `resets` if set (the test reports
/// them by hand).
#[derive(Default)]
pub(crate) struct Altered {
    pub(crate) memory: MemoryBackend,
    pub(crate) claim: Option<Duration>,
    pub(crate) resets: Option<Resets>,
}

impl Backend for Altered {
    fn acquire(&self, req: AcquireRequest) -> BoxFuture<'_, Result<Grant, LockError>> {
        Box::pin(async move {
            let grant = self.memory.acquire(req).await?;
            Ok(match self.claim {
                Some(claim) => grant.valid_for(claim),
                None => grant,
            })
        })
    }

    fn release<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        mode: Mode,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        self.memory.release(key, token, mode)
    }

    fn extend<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        mode: Mode,
        ttl: Duration,
        how: ExtendMode,
    ) -> BoxFuture<'a, Result<Duration, LockError>> {
        self.memory.extend(key, token, mode, ttl, how)
    }

    fn renew<'a>(&'a self, leases: &'a [Renewal]) -> BoxFuture<'a, Result<Vec<bool>, LockError>> {
        self.memory.renew(leases)
    }

    fn holders<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<Vec<Holder>, LockError>> {
        self.memory.holders(key)
    }

    fn waiters<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<usize, LockError>> {
        self.memory.waiters(key)
    }

    fn resets(&self) -> Option<Resets> {
        self.resets.clone()
    }
}
