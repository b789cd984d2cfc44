//! A backend that cannot be reached.

use std::time::Duration;

use tower_lock::engine::{
    AcquireRequest, Backend, BoxFuture, ExtendMode, Grant, Holder, LockKey, Mode, Renewal,
};
use tower_lock::{BackendError, BackendErrorKind, LockError, Token};

/// A backend that cannot be reached: every call fails with `Unavailable`, at once.
#[derive(Debug, Default)]
pub struct UnavailableBackend;

fn down<T>() -> Result<T, LockError> {
    Err(LockError::Backend(BackendError::new(
        BackendErrorKind::Unavailable,
        "connection refused (test backend)",
    )))
}

impl Backend for UnavailableBackend {
    fn acquire(&self, _req: AcquireRequest) -> BoxFuture<'_, Result<Grant, LockError>> {
        Box::pin(async { down() })
    }

    fn release<'a>(
        &'a self,
        _key: &'a LockKey,
        _token: &'a Token,
        _mode: Mode,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(async { down() })
    }

    fn extend<'a>(
        &'a self,
        _key: &'a LockKey,
        _token: &'a Token,
        _mode: Mode,
        _ttl: Duration,
        _how: ExtendMode,
    ) -> BoxFuture<'a, Result<Duration, LockError>> {
        Box::pin(async { down() })
    }

    fn renew<'a>(&'a self, _leases: &'a [Renewal]) -> BoxFuture<'a, Result<Vec<bool>, LockError>> {
        Box::pin(async { down() })
    }

    fn holders<'a>(&'a self, _key: &'a LockKey) -> BoxFuture<'a, Result<Vec<Holder>, LockError>> {
        Box::pin(async { down() })
    }

    fn waiters<'a>(&'a self, _key: &'a LockKey) -> BoxFuture<'a, Result<usize, LockError>> {
        Box::pin(async { down() })
    }
}
