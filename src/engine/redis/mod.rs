#![doc = include_str!("README.md")]

mod acquire;
mod backend;
mod builder;
mod capabilities;
mod connection;
mod names;
mod records;
mod scripts;
mod wakeup;

use std::{fmt, sync::Arc, time::Duration};

pub use builder::RedisBackendBuilder;

use self::{connection::Pool, wakeup::Wakeup};
use super::{KeyError, LockError};
use crate::error::{BackendError, BackendErrorKind};

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "tower-lock";
/// The longest prefix accepted, in bytes.
pub const MAX_PREFIX_LEN: usize = 64;
/// Waiters retry at least this often, whatever the pub/sub connection does.
pub(super) const FALLBACK_CAP: Duration = Duration::from_millis(250);
/// How much longer than the lease the fence tombstone lives.
const FENCE_MARGIN: Duration = Duration::from_secs(10);
/// Leases renewed per script call.
const RENEW_CHUNK: usize = 256;

/// The Redis backend: see the [module docs](self) for the key layout, the scripts and the
/// failure behaviour. Cheap to clone; clones share the pool and the subscriber.
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    wakeup: Wakeup,
    prefix: String,
    /// How long a waiter's ticket lives unrefreshed, in ms; also the claim period of a
    /// hand-off (how long a waiter that has gone can hold the key it was handed).
    ticket_ttl_ms: u64,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("prefix", &self.inner.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// A builder for `url` (`redis://host:port/db`, `rediss://…` with TLS where enabled).
    pub fn builder(url: impl Into<String>) -> RedisBackendBuilder {
        RedisBackendBuilder {
            url: url.into(),
            prefix: DEFAULT_PREFIX.to_owned(),
            command_timeout: Duration::from_millis(500),
            pool_size: 16,
        }
    }

    /// Connect with the defaults: prefix `"tower-lock"`, 500 ms timeout, 16 connections.
    pub async fn connect(url: impl Into<String>) -> Result<RedisBackend, BackendError> {
        Self::builder(url).build().await
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }
}

fn malformed_member(e: KeyError) -> LockError {
    LockError::Backend(
        BackendError::new(
            BackendErrorKind::Protocol,
            "stored pool member is malformed",
        )
        .with_source(e),
    )
}

fn malformed_token(e: KeyError) -> LockError {
    LockError::Backend(
        BackendError::new(BackendErrorKind::Protocol, "stored token is malformed").with_source(e),
    )
}

/// Milliseconds, rounded up, at least 1: a lease is never shorter on the server than asked.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000))
        .unwrap_or(u64::MAX)
        .max(1)
}

/// A remaining TTL reported by a script (`< 0`: none).
fn remaining(pttl: i64) -> Option<Duration> {
    u64::try_from(pttl).ok().map(Duration::from_millis)
}

fn outcome(code: i64) -> Result<(), LockError> {
    match code {
        -1 => Err(LockError::NotOwned),
        -2 | 0 => Err(LockError::Expired),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_round_up() {
        assert_eq!(millis(Duration::from_micros(1)), 1);
        assert_eq!(millis(Duration::from_micros(1500)), 2);
        assert_eq!(millis(Duration::ZERO), 1);
    }
}
