//! [`Contended`]: the keys this backend saw contended lately, so that their next acquire
//! looks at the lock before the tombstone.
//!
//! An acquire script takes a free key in two commands when it tries the tombstone first
//! (`GETDEL`, then `SET`), and a held key costs that `GETDEL` for nothing. Whether a key
//! was last seen held is a good guess of which it will be: a waiter's release hands the
//! key on, and the releasing worker, arriving again, finds it held. The guess only orders
//! the script's reads; it never changes an outcome.

use std::sync::atomic::{AtomicU64, Ordering};

/// Slots, each holding the hash tag of one key (direct-mapped: a newer key takes an older
/// one's slot).
const SLOTS: usize = 256;

/// A lock-free, fixed-size set of recently contended keys, by hash tag.
pub(super) struct Contended(Box<[AtomicU64; SLOTS]>);

impl Contended {
    pub(super) fn new() -> Self {
        Self(Box::new(std::array::from_fn(|_| AtomicU64::new(0))))
    }

    fn slot(&self, tag: u64) -> &AtomicU64 {
        // The tag is a hash already: its low bits spread.
        &self.0[usize::try_from(tag % SLOTS as u64).unwrap_or(0)]
    }

    /// Whether the key with `tag` was last seen contended.
    pub(super) fn seen(&self, tag: u64) -> bool {
        self.slot(tag).load(Ordering::Relaxed) == tag
    }

    /// The key with `tag` was held by another, or handed to a waiter.
    pub(super) fn mark(&self, tag: u64) {
        self.slot(tag).store(tag, Ordering::Relaxed);
    }

    /// The key with `tag` was released with nobody waiting.
    pub(super) fn clear(&self, tag: u64) {
        let _ = self
            .slot(tag)
            .compare_exchange(tag, 0, Ordering::Relaxed, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_seen_from_its_mark_to_its_clear() {
        let c = Contended::new();
        assert!(!c.seen(7));
        c.mark(7);
        assert!(c.seen(7));
        // Another key in the same slot takes it over.
        c.mark(7 + SLOTS as u64);
        assert!(!c.seen(7));
        c.mark(7);
        c.clear(7 + SLOTS as u64);
        assert!(c.seen(7), "clearing another key leaves it");
        c.clear(7);
        assert!(!c.seen(7));
    }
}
