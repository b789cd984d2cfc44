//! TLS to Redis (feature `redis-tls`): which targets speak TLS, and whether rustls has a
//! crypto provider for them, checked before the first connection.
//!
//! rustls needs one crypto provider per process (`ring`, `aws-lc-rs`, or another). The
//! engine enables none, so it never forces one on an application that uses the other:
//! the application installs the one it uses (`CryptoProvider::install_default`). Without
//! one, rustls would pick one from its crate features when redis-rs makes its first TLS
//! configuration, and panic where those name none or both; rustls offers no way to ask
//! beforehand whether that pick would succeed (rustls#2595). So the engine asks for the
//! installed provider only, and refuses to build a TLS backend without one: a
//! configuration error that says how to fix it, never a panic on a connection task.

use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo};

use crate::BackendError;

/// Whether connections to `info` speak TLS.
pub(super) fn is_tls(info: &ConnectionInfo) -> bool {
    matches!(info.addr(), ConnectionAddr::TcpTls { .. })
}

/// Whether `url` is a TLS address (`rediss://`). A URL that does not parse is not: the
/// connect reports it as invalid.
pub(super) fn is_tls_url(url: &str) -> bool {
    url.into_connection_info().is_ok_and(|info| is_tls(&info))
}

/// `Ok` when rustls has a crypto provider for this process; otherwise a
/// [`NoTlsProvider`](crate::ConfigError::NoTlsProvider) error that says how to install one.
#[cfg(feature = "redis-tls")]
pub(super) fn provider_installed() -> Result<(), BackendError> {
    if rustls::crypto::CryptoProvider::get_default().is_some() {
        return Ok(());
    }
    Err(crate::ConfigError::NoTlsProvider.into())
}

/// Without `redis-tls` redis-rs has no TLS: it refuses a TLS address itself, as an
/// invalid client configuration, when the backend connects.
#[cfg(not(feature = "redis-tls"))]
pub(super) fn provider_installed() -> Result<(), BackendError> {
    Ok(())
}
