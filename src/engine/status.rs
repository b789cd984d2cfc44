//! Key inspection ([`LockStatus`]) and administrative operations ([`LockAdmin`]).

use std::time::Duration;

use super::{Holder, LockEngine, LockError, LockKey, Token};

/// What a key looks like from outside, judged against the TTL a well-behaved holder uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockStatus {
    /// Nobody holds the key.
    Free,
    /// Held, with a remaining TTL within the expected bound.
    Locked {
        /// The holder's token (owner value).
        owner: Token,
        /// Remaining TTL.
        ttl: Duration,
    },
    /// Held with a TTL longer than the expected bound: marked unavailable on purpose
    /// ([`LockAdmin::set`]) or held by a client using other settings.
    Unavailable {
        /// The holder's token (owner value).
        owner: Token,
        /// Remaining TTL.
        ttl: Duration,
    },
    /// Held with no expiry at all: an error (a crashed holder would block it forever).
    NoExpiry {
        /// The holder's token (owner value).
        owner: Token,
    },
}

impl LockStatus {
    /// Classify a holder record against `expected_ttl`.
    pub fn from_holder(holder: Option<Holder>, expected_ttl: Duration) -> Self {
        match holder {
            None => LockStatus::Free,
            Some(Holder {
                token, ttl: None, ..
            }) => LockStatus::NoExpiry { owner: token },
            Some(Holder {
                token,
                ttl: Some(ttl),
                ..
            }) if ttl <= expected_ttl => LockStatus::Locked { owner: token, ttl },
            Some(Holder {
                token,
                ttl: Some(ttl),
                ..
            }) => LockStatus::Unavailable { owner: token, ttl },
        }
    }

    /// `true` unless the key is free.
    pub fn is_held(&self) -> bool {
        !matches!(self, LockStatus::Free)
    }
}

/// Operations that ignore ownership. Every call is logged at `warn`.
///
/// ```
/// use std::time::Duration;
/// use tower_lock::{LockEngine, engine::{LockStatus, Token}};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_lock::LockError> {
/// let engine = LockEngine::in_memory();
/// // Take the printer out of service for an hour.
/// let maintenance = Token::new("maintenance").unwrap();
/// engine.admin().set("printer", &maintenance, Some(Duration::from_secs(3600))).await?;
/// let status = engine.lock("printer").ttl(Duration::from_secs(30)).status().await?;
/// assert!(matches!(status, LockStatus::Unavailable { .. }));
/// assert!(engine.admin().force_release("printer").await?);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct LockAdmin {
    engine: LockEngine,
}

impl LockAdmin {
    pub(crate) fn new(engine: LockEngine) -> Self {
        LockAdmin { engine }
    }

    /// Make `value` the holder of `key` for `ttl` (`None`: no expiry), whoever holds it.
    pub async fn set(
        &self,
        key: impl AsRef<str>,
        value: &Token,
        ttl: Option<Duration>,
    ) -> Result<(), LockError> {
        let key = LockKey::new(key)?;
        tracing::warn!(%key, ?ttl, "admin: setting lock holder");
        self.engine.backend().admin_set(&key, value, ttl).await
    }

    /// Release `key` whoever holds it; the next waiter gets it. Returns whether it was held.
    pub async fn force_release(&self, key: impl AsRef<str>) -> Result<bool, LockError> {
        let key = LockKey::new(key)?;
        tracing::warn!(%key, "admin: force-releasing lock");
        self.engine.backend().force_release(&key).await
    }
}
