//! A key's holders in memory ([`Holders`]), by token and by expiry. One holder is kept in
//! place, so a key held by one at a time (a lock: the common case, and the fast path's)
//! allocates nothing; a second holder moves them to maps, given back when none is left.

use std::collections::{BTreeMap, HashMap};

use tokio::time::Instant;

use crate::{HolderLabel, Mode, Token};

/// One holder's lease.
#[derive(Clone)]
pub(super) struct Holding {
    /// `None`: no expiry (only an admin sets that).
    pub(super) expires: Option<Instant>,
    /// The mode it was granted in.
    pub(super) mode: Mode,
    pub(super) fence: u64,
    /// The label its request carried (see [`AcquireRequest::label`](crate::AcquireRequest::label)).
    pub(super) label: Option<HolderLabel>,
}

#[derive(Default)]
pub(super) enum Holders {
    #[default]
    None,
    One(Token, Holding),
    Many {
        by_token: HashMap<Token, Holding>,
        /// The holders with an expiry by expiry, then fence (unique per holding): the
        /// earliest is first.
        by_expiry: BTreeMap<(Instant, u64), Token>,
    },
}

impl Holders {
    pub(super) fn len(&self) -> usize {
        match self {
            Self::None => 0,
            Self::One(..) => 1,
            Self::Many { by_token, .. } => by_token.len(),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        matches!(self, Self::None)
    }

    pub(super) fn get(&self, token: &Token) -> Option<Holding> {
        match self {
            Self::One(t, h) if t == token => Some(h.clone()),
            Self::Many { by_token, .. } => by_token.get(token).cloned(),
            _ => None,
        }
    }

    /// Add `token` (which holds nothing yet).
    pub(super) fn insert(&mut self, token: Token, holding: Holding) {
        match std::mem::take(self) {
            Self::None => *self = Self::One(token, holding),
            Self::One(first, h) => {
                let mut many = Self::Many {
                    by_token: HashMap::new(),
                    by_expiry: BTreeMap::new(),
                };
                many.add(first, h);
                many.add(token, holding);
                *self = many;
            }
            mut many => {
                many.add(token, holding);
                *self = many;
            }
        }
    }

    /// Add to the maps.
    fn add(&mut self, token: Token, holding: Holding) {
        if let Self::Many {
            by_token,
            by_expiry,
        } = self
        {
            if let Some(expires) = holding.expires {
                by_expiry.insert((expires, holding.fence), token.clone());
            }
            by_token.insert(token, holding);
        }
    }

    pub(super) fn remove(&mut self, token: &Token) -> Option<Holding> {
        let removed = match self {
            Self::One(t, h) if t == token => {
                let h = h.clone();
                *self = Self::None;
                return Some(h);
            }
            Self::Many {
                by_token,
                by_expiry,
            } => {
                let h = by_token.remove(token)?;
                if let Some(expires) = h.expires {
                    by_expiry.remove(&(expires, h.fence));
                }
                h
            }
            _ => return None,
        };
        // The last of several gone: the maps go too.
        if matches!(self, Self::Many { by_token, .. } if by_token.is_empty()) {
            *self = Self::None;
        }
        Some(removed)
    }

    /// Move `token`'s expiry to `expires`; `false` if it holds nothing.
    pub(super) fn set_expiry(&mut self, token: &Token, expires: Instant) -> bool {
        match self {
            Self::One(t, h) if t == token => h.expires = Some(expires),
            Self::Many {
                by_token,
                by_expiry,
            } => {
                let Some(h) = by_token.get_mut(token) else {
                    return false;
                };
                if let Some(old) = h.expires {
                    by_expiry.remove(&(old, h.fence));
                }
                h.expires = Some(expires);
                by_expiry.insert((expires, h.fence), token.clone());
            }
            _ => return false,
        }
        true
    }

    /// When the first holder's lease runs out, if anyone holds with an expiry.
    pub(super) fn earliest(&self) -> Option<Instant> {
        match self {
            Self::None => None,
            Self::One(_, h) => h.expires,
            Self::Many { by_expiry, .. } => by_expiry.keys().next().map(|(at, _)| *at),
        }
    }

    /// Whether every holder's lease ran out by `now` (or nobody holds).
    pub(super) fn all_expired(&self, now: Instant) -> bool {
        match self {
            Self::None => true,
            Self::One(_, h) => h.expires.is_some_and(|e| e <= now),
            Self::Many {
                by_token,
                by_expiry,
            } => {
                by_expiry.len() == by_token.len()
                    && by_expiry
                        .keys()
                        .next_back()
                        .is_none_or(|(at, _)| *at <= now)
            }
        }
    }

    /// Drop the holders whose leases ran out by `now`; whether any was.
    pub(super) fn drop_expired(&mut self, now: Instant) -> bool {
        let mut dropped = false;
        while self.earliest().is_some_and(|e| e <= now) {
            dropped = true;
            match self {
                Self::Many {
                    by_token,
                    by_expiry,
                } => {
                    let (_, token) = by_expiry.pop_first().expect("an earliest expiry");
                    by_token.remove(&token);
                    if by_token.is_empty() {
                        *self = Self::None;
                    }
                }
                _ => *self = Self::None,
            }
        }
        dropped
    }

    /// Every holder, the earliest expiry first (those without one last).
    pub(super) fn list(&self) -> Vec<(&Token, &Holding)> {
        let mut all: Vec<(&Token, &Holding)> = match self {
            Self::None => Vec::new(),
            Self::One(t, h) => vec![(t, h)],
            Self::Many { by_token, .. } => by_token.iter().collect(),
        };
        all.sort_by_key(|(_, h)| (h.expires.is_none(), h.expires, h.fence));
        all
    }
}
