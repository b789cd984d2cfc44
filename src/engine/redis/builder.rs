//! [`RedisBackendBuilder`]: validates the configuration, connects, loads the scripts.

use std::{sync::Arc, time::Duration};

use super::{
    FALLBACK_CAP, Inner, MAX_PREFIX_LEN, RedisBackend,
    connection::{Connector, Pool},
    millis, scripts,
    wakeup::Wakeup,
};
use crate::error::{BackendError, BackendErrorKind};

/// Builds a [`RedisBackend`]; see [`RedisBackend::builder`].
#[derive(Clone, Debug)]
pub struct RedisBackendBuilder {
    pub(super) url: String,
    pub(super) prefix: String,
    pub(super) command_timeout: Duration,
    pub(super) pool_size: u32,
}

impl RedisBackendBuilder {
    /// The namespace of every Redis key and channel (default `"tower-lock"`): 1 to
    /// [`MAX_PREFIX_LEN`] bytes, no `{`, `}` or control characters.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The limit on every Redis call, connection check-out included (default 500 ms).
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// How many multiplexed connections the pool keeps at most (default 16).
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = size;
        self
    }

    /// Validate the configuration, connect, and check that the server answers.
    ///
    /// Fails with a [`BackendErrorKind::Config`] error for a bad URL, prefix, pool size or
    /// timeout, and with `Unavailable` / `Timeout` when the server cannot be reached.
    pub async fn build(self) -> Result<RedisBackend, BackendError> {
        let config = |msg: String| BackendError::new(BackendErrorKind::Config, msg);
        if self.prefix.is_empty()
            || self.prefix.len() > MAX_PREFIX_LEN
            || self
                .prefix
                .chars()
                .any(|c| c == '{' || c == '}' || c.is_control())
        {
            return Err(config(format!(
                "redis key prefix {:?} must be 1 to {MAX_PREFIX_LEN} bytes without braces or control characters",
                self.prefix
            )));
        }
        if self.pool_size == 0 {
            return Err(config("redis pool size must be at least 1".into()));
        }
        if self.command_timeout.is_zero() {
            return Err(config("redis command timeout must be positive".into()));
        }
        let client = redis::Client::open(self.url.as_str())
            .map_err(|e| config("invalid redis URL".into()).with_source(e))?;
        let connector = Arc::new(Connector::new(client.clone(), self.command_timeout));
        let pool = Pool::new(connector.clone(), self.pool_size, self.command_timeout);
        // Load the scripts now, so first calls are one EVALSHA each (after a server restart
        // redis-rs reloads them on NOSCRIPT).
        pool.load(&scripts::all()).await?;
        let ticket_ttl = (3 * (self.command_timeout + FALLBACK_CAP)).max(Duration::from_secs(3));
        Ok(RedisBackend {
            inner: Arc::new(Inner {
                wakeup: Wakeup::new(client, connector, self.command_timeout),
                pool,
                prefix: self.prefix,
                ticket_ttl_ms: millis(ticket_ttl),
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn misconfiguration_is_refused_at_build_time() {
        // Port 1: nothing listens, but none of these gets as far as connecting.
        let builder = || RedisBackend::builder("redis://127.0.0.1:1");
        for bad in [
            builder().prefix("a{b}"),
            builder().prefix(""),
            builder().prefix("x".repeat(MAX_PREFIX_LEN + 1)),
            builder().pool_size(0),
            builder().command_timeout(Duration::ZERO),
            RedisBackend::builder("not a url"),
        ] {
            let err = bad.build().await.unwrap_err();
            assert_eq!(err.kind(), BackendErrorKind::Config, "{err}");
        }
        let err = builder().build().await.unwrap_err();
        assert_eq!(err.kind(), BackendErrorKind::Unavailable, "{err}");
    }
}
