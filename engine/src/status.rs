//! [`LockStatus`]: what a key looks like from outside.

use std::time::Duration;

#[allow(unused_imports)] // for rustdoc links
use super::LockAdmin;
use super::{Holder, Token};

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
    /// Held with a TTL longer than the expected bound: reserved on purpose
    /// ([`LockAdmin::set`], e.g. a printer taken out of service) or held by a client using
    /// other settings.
    Reserved {
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
            None => Self::Free,
            Some(Holder {
                token, ttl: None, ..
            }) => Self::NoExpiry { owner: token },
            Some(Holder {
                token,
                ttl: Some(ttl),
                ..
            }) if ttl <= expected_ttl => Self::Locked { owner: token, ttl },
            Some(Holder {
                token,
                ttl: Some(ttl),
                ..
            }) => Self::Reserved { owner: token, ttl },
        }
    }

    /// `true` unless the key is free.
    pub fn is_held(&self) -> bool {
        !matches!(self, Self::Free)
    }
}
