//! The deliberate break of cross-mode exclusion: a backend that keeps a key's lock apart
//! from its shared leases (the model before issue 51), which the schedule's history must
//! catch on the key where lone and shared clients mix.

use std::{sync::Arc, time::Duration};

use rand::rngs::StdRng;
use tower_lock::engine::{
    AcquireRequest, Backend, BoxFuture, ExtendMode, Grant, Holder, LockError, LockKey,
    MemoryBackend, Mode, Renewal, Token,
};
use tower_lock_test_support::history::Recorder;

use super::Faults;

/// The in-process backend with each key's lock moved to a key of its own: the lock and
/// the shared leases of one key no longer exclude each other.
pub(super) struct Apart(pub(super) Arc<MemoryBackend>);

fn space(key: &LockKey, mode: Mode) -> LockKey {
    match mode {
        Mode::Exclusive => LockKey::new(format!("{key}~lock")).unwrap(),
        _ => key.clone(),
    }
}

impl Backend for Apart {
    fn acquire(&self, mut req: AcquireRequest) -> BoxFuture<'_, Result<Grant, LockError>> {
        req.key = space(&req.key, req.mode);
        self.0.acquire(req)
    }

    fn release<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        mode: Mode,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(async move { self.0.release(&space(key, mode), token, mode).await })
    }

    fn extend<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        mode: Mode,
        ttl: Duration,
        how: ExtendMode,
    ) -> BoxFuture<'a, Result<Duration, LockError>> {
        Box::pin(async move {
            self.0
                .extend(&space(key, mode), token, mode, ttl, how)
                .await
        })
    }

    fn renew<'a>(&'a self, leases: &'a [Renewal]) -> BoxFuture<'a, Result<Vec<bool>, LockError>> {
        let moved: Vec<Renewal> = leases
            .iter()
            .map(|r| Renewal {
                key: space(&r.key, r.mode),
                ..r.clone()
            })
            .collect();
        Box::pin(async move { self.0.renew(&moved).await })
    }

    fn holders<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<Vec<Holder>, LockError>> {
        Box::pin(async move {
            let mut all = self.0.holders(key).await?;
            all.extend(self.0.holders(&space(key, Mode::Exclusive)).await?);
            Ok(all)
        })
    }

    fn waiters<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<usize, LockError>> {
        Box::pin(async move {
            let lock = self.0.waiters(&space(key, Mode::Exclusive)).await?;
            Ok(self.0.waiters(key).await? + lock)
        })
    }

    fn has_shared_mode(&self) -> bool {
        true
    }
}

/// No fault from outside: the break alone is under test.
pub(super) struct NoFaults;

impl Faults for NoFaults {
    fn inject(&self, _: &mut StdRng, _: &Recorder) -> String {
        "none".to_owned()
    }
}
