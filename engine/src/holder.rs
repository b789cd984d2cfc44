//! [`Holder`]: one holder of a key as [`holders`](crate::Backend::holders) reports it:
//! token, lease left, mode, label and fence.

use std::time::Duration;

use super::{Fence, HolderLabel, Mode, Token};

/// One holder of a key, as seen by [`Backend::holders`](crate::Backend::holders).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Holder {
    /// The holder's token.
    pub token: Token,
    /// Remaining TTL; `None` when the lease has no expiry.
    pub ttl: Option<Duration>,
    /// How it holds the key: [`Mode::Exclusive`] for the key's lock; for a shared lease,
    /// `Shared { limit: 1 }` when it holds alone, otherwise `Shared { limit: u32::MAX }`
    /// (the limit each request brought is not kept).
    pub mode: Mode,
    /// The holder's label (see [`AcquireRequest::label`](crate::AcquireRequest::label)), if it gave one.
    pub label: Option<HolderLabel>,
    /// The fence of its grant, where the backend reports it.
    pub fence: Option<Fence>,
}

impl Holder {
    /// The key's lock holder.
    pub fn new(token: Token, ttl: Option<Duration>) -> Self {
        Self {
            token,
            ttl,
            mode: Mode::Exclusive,
            label: None,
            fence: None,
        }
    }

    /// This holder, labelled `label` (a backend reading a stored label).
    pub fn with_label(mut self, label: Option<HolderLabel>) -> Self {
        self.label = label;
        self
    }

    /// This holder, granted at `fence`.
    pub fn with_fence(mut self, fence: Fence) -> Self {
        self.fence = Some(fence);
        self
    }

    /// Who holds: the label its engine (and layer) gave, e.g. `web-3:4242 POST
    /// /orders/{id}`; `None` when it gave none (an admin's [`set`](super::LockAdmin::set),
    /// a node of an older version).
    pub fn label(&self) -> Option<&str> {
        self.label.as_ref().map(HolderLabel::as_str)
    }

    /// A holder of one of the key's shared leases, alone among them or not.
    pub fn shared(token: Token, ttl: Option<Duration>, alone: bool) -> Self {
        let limit = if alone { 1 } else { u32::MAX };
        Self {
            token,
            ttl,
            mode: Mode::Shared { limit },
            label: None,
            fence: None,
        }
    }
}
