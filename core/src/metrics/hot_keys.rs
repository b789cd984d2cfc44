//! [`HotKeys`]: which keys of a layer meet contention, as a label set with a cap, so that a
//! dashboard can show the hottest keys without one series per key a client ever sent.
//!
//! The first distinct keys that meet contention get a label of their own, up to
//! [`HOT_KEYS`] label values with [`OTHER`]; contention on any other key is counted under
//! [`OTHER`] (no lock key is `other`: every
//! one holds a `/`). A key that is hot for long is met early, so it almost always has its
//! own label; and the set never grows past the cap, whatever clients send.

use std::sync::Mutex;

/// How many `key` label values a layer has at most, [`OTHER`] included.
pub const HOT_KEYS: usize = 16;

/// The label of contention on the keys past the cap.
pub const OTHER: &str = "other";

/// The contended keys of one layer and their counts, in the order they were first met.
#[derive(Debug, Default)]
pub(super) struct HotKeys {
    counts: Mutex<Vec<(String, u64)>>,
}

impl HotKeys {
    /// Count one contention on `key`: the label it is counted under (its own, or
    /// [`OTHER`]).
    pub(super) fn count(&self, key: &str) -> String {
        let mut counts = self.counts.lock().unwrap();
        if let Some((label, n)) = counts.iter_mut().find(|(k, _)| k == key) {
            *n += 1;
            return label.clone();
        }
        // `OTHER` takes the last place when the cap is reached.
        let label = if counts.len() + 1 < HOT_KEYS {
            key
        } else {
            OTHER
        };
        match counts.iter_mut().find(|(k, _)| k == label) {
            Some((_, n)) => *n += 1,
            None => counts.push((label.to_owned(), 1)),
        }
        label.to_owned()
    }

    /// The counts, the most contended first.
    pub(super) fn snapshot(&self) -> Vec<(String, u64)> {
        let mut counts = self.counts.lock().unwrap().clone();
        counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_past_the_cap_share_one_label() {
        let hot = HotKeys::default();
        for i in 0..40 {
            hot.count(&format!("/k/{i}"));
        }
        for _ in 0..5 {
            assert_eq!(hot.count("/k/3"), "/k/3");
        }
        assert_eq!(hot.count("/k/39"), OTHER);
        let snap = hot.snapshot();
        assert_eq!(snap.len(), HOT_KEYS);
        assert_eq!(snap[0], (OTHER.to_owned(), 26));
        assert_eq!(snap[1], ("/k/3".to_owned(), 6));
    }
}
