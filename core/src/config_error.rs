//! [`ConfigError`]: why a `LockLayerBuilder` refused to build.

use std::{error::Error as StdError, fmt, time::Duration};

use crate::{engine::KeyError, options::BackendFailurePolicy};

/// A `LockLayerBuilder` configuration that cannot work.
///
/// Its `Debug` is its `Display`, so that `fn main() -> Result<(), ConfigError>` (or a `?`
/// into `Box<dyn Error>` returned from `main`) prints what to change, not a variant name.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// No key extractor was set.
    NoKeyExtractor,
    /// The lease TTL is zero.
    ZeroTtl,
    /// The lease TTL is under 1 ms, the engine's resolution (it is not rounded up).
    TtlTooShort(Duration),
    /// `max_waiters` is zero: every request that finds its key held would be answered
    /// `429` at once. Not waiting at all (a zero wait) answers it `423` instead.
    ZeroMaxWaiters,
    /// The named option only applies to waiting requests, and the wait limit is zero.
    NeedsWait(&'static str),
    /// The named duration (`ttl` or `wait`) is longer than a day.
    TooLong(&'static str),
    /// `wait` on the idempotency preset without replay
    /// (`IdempotencyLayer::builder(..).without_replay()`): nothing is stored, so a
    /// duplicate that waited would run again after the first; it is answered `409` at
    /// once instead. (With replay, `wait` is allowed: a waiting duplicate gets the
    /// replay.)
    IdempotencyWait,
    /// `methods` was given an empty list: the layer would lock nothing.
    NoMethods,
    /// `methods` was given a name that is not an HTTP method token, or a standard method
    /// in the wrong case (methods are case-sensitive: `post` would lock nothing).
    InvalidMethod(String),
    /// The named setting (`replayed_header`, `fingerprint_headers`, `key_header`) was given
    /// a name that is not a valid HTTP header name.
    InvalidHeaderName {
        /// The setter that was given the name.
        option: &'static str,
        /// The name as given.
        name: String,
    },
    /// The base of problem types is not a valid URI.
    ProblemTypeBase(String),
    /// The key extractor's own configuration is unusable (for example a header name
    /// given as text that is not one); the reason from
    /// [`KeyExtractor::validate`](crate::key::KeyExtractor::validate).
    Extractor(String),
    /// The key extractor (its kind here) reads a principal from the request's `http`
    /// extensions, and the framework the middleware was made for (actix-web) carries none:
    /// no request would ever have a key.
    NeedsExtensions(String),
    /// The namespace (or, with it, the extractor's kind) is not valid key material: a
    /// control character, or too long to leave room for a value.
    Namespace(KeyError),
    /// Idempotency replay: the engine's backend does not keep records
    /// ([`RecordBackend`](crate::engine::RecordBackend)).
    RecordsUnsupported,
    /// `permits` or `shared_for` on an engine whose backend has no shared mode
    /// ([`Backend::has_shared_mode`](crate::engine::Backend::has_shared_mode)).
    PermitsUnsupported,
    /// Idempotency replay: the named limit (or the retention) is zero.
    ZeroLimit(&'static str),
    /// Idempotency replay: no scope was chosen, so one caller could be handed another's
    /// stored response. Choose `per_principal::<P>()`, `scope_by(extractor)` or
    /// `unscoped()`.
    IdempotencyScope,
    /// Idempotency replay: a failure policy other than fail-closed would run a request
    /// without its record, so a completed request could run twice.
    IdempotencyFailurePolicy(BackendFailurePolicy),
    /// `permits(0)`: no request could ever hold a key.
    ZeroPermits,
    /// `shared_for` was given an empty list (for no shared methods, do not call it).
    NoSharedMethods,
    /// `permits` or `shared_for` on the idempotency preset: two requests with one
    /// idempotency key must never run at once.
    IdempotencyPermits,
}

impl fmt::Debug for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoKeyExtractor => f.write_str("no key extractor: call .key(..)"),
            Self::PermitsUnsupported => f.write_str(
                "`permits` and `shared_for` need a backend with shared mode (the in-process and Redis backends have it)",
            ),
            Self::RecordsUnsupported => f.write_str(
                "idempotency replay needs a backend that keeps records (the in-process and Redis backends do); use .without_replay() otherwise",
            ),
            Self::ZeroLimit(name) => write!(f, "`{name}` must be greater than zero"),
            Self::IdempotencyScope => f.write_str(
                "the idempotency preset needs a scope, or it would replay one caller's stored response to any other caller who sends the same key: \
                 .per_principal::<P>() (an identity your authentication layer put in the request extensions), \
                 .scope_by(extractor) (a scope the server derives, e.g. a verified tenant), \
                 or .unscoped() for anonymous public endpoints",
            ),
            Self::IdempotencyFailurePolicy(policy) => write!(
                f,
                "the idempotency preset cannot use {policy:?}: running a request without its record would run a completed request twice; it fails closed (503) while the backend is down"
            ),
            Self::ZeroTtl => f.write_str("the lease TTL must be greater than zero"),
            Self::TtlTooShort(ttl) => {
                write!(f, "the lease TTL must be at least 1 ms, not {ttl:?}")
            }
            Self::ProblemTypeBase(base) => {
                write!(f, "the problem type base {base:?} is not a valid URI")
            }
            Self::NoMethods => f.write_str(
                "`methods` needs at least one method (for the default, every method but GET, HEAD, OPTIONS and TRACE, do not call it)",
            ),
            Self::InvalidMethod(name) => {
                if crate::integration::is_miscased(name) {
                    let upper = name.to_ascii_uppercase();
                    write!(
                        f,
                        "`methods`: {name:?} is not {upper:?} (methods are case-sensitive)"
                    )
                } else {
                    write!(f, "`methods`: {name:?} is not a valid HTTP method")
                }
            }
            Self::InvalidHeaderName { option, name } => {
                write!(f, "`{option}`: {name:?} is not a valid HTTP header name")
            }
            Self::ZeroMaxWaiters => f.write_str(
                "`max_waiters` must be at least 1 (for no waiting at all, set no wait limit)",
            ),
            Self::NeedsWait(option) => {
                write!(f, "`{option}` needs a wait limit greater than zero")
            }
            Self::TooLong(option) => {
                write!(f, "`{option}` is longer than a day")
            }
            Self::IdempotencyWait => f.write_str(
                "`wait` with `without_replay()`: without a stored response a duplicate that \
                 waited would run again, so it is answered 409 at once; drop the wait, or keep \
                 replay (a waiting duplicate then gets the first one's response)",
            ),
            Self::Extractor(reason) => write!(f, "invalid key extractor: {reason}"),
            Self::NeedsExtensions(kind) => write!(
                f,
                "the key `{kind}` reads a principal from the request's http extensions, which actix-web requests do not carry, so no request would have a key: \
                 scope by a `key::from_fn` closure that reads actix's extensions through `tower_lock_actix::http_request` \
                 (what your authentication middleware put there), or by a header only a gateway that vouches for it can set"
            ),
            Self::ZeroPermits => f.write_str("`permits` must be at least 1"),
            Self::NoSharedMethods => f.write_str(
                "`shared_for` needs at least one method (for none, do not call it)",
            ),
            Self::IdempotencyPermits => f.write_str(
                "the idempotency preset takes its key alone: `permits` and `shared_for` would run two requests with one idempotency key at once",
            ),
            Self::Namespace(e) => write!(f, "invalid key namespace: {e}"),
        }
    }
}

impl StdError for ConfigError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            Self::Namespace(e) => Some(e),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ConfigError;

    /// `main` returning a `ConfigError` prints its `Debug`: the fix, not a variant name.
    #[test]
    fn debug_says_what_to_change() {
        let debug = format!("{:?}", ConfigError::NeedsWait("fifo"));
        assert_eq!(debug, ConfigError::NeedsWait("fifo").to_string());
        assert!(debug.contains("`fifo` needs a wait limit"), "{debug}");
    }
}
