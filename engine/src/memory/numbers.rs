//! The in-process backend's numeric values ([`Numbers`]): a map, and the expiring values
//! in the order they expire, so that each numeric call drops every value expired by then,
//! whatever key it was set under (a value nobody reads again must not stay for ever).

use std::collections::{BTreeSet, HashMap};

use tokio::time::Instant;

use crate::LockKey;

/// The numeric values by key, each with its expiry (`None`: none).
#[derive(Default)]
pub(super) struct Numbers {
    values: HashMap<LockKey, (f64, Option<Instant>)>,
    /// The expiring values by expiry: the expired ones are taken from the front.
    expiries: BTreeSet<(Instant, LockKey)>,
}

impl Numbers {
    /// Drop the values expired by `now`. Each value is dropped once, so a call costs
    /// O(log n) per value it drops, and nothing more when none has expired.
    pub(super) fn sweep(&mut self, now: Instant) {
        let mut dropped = false;
        while let Some((at, _)) = self.expiries.first()
            && *at <= now
        {
            let (_, key) = self.expiries.pop_first().expect("a first expiry");
            self.values.remove(&key);
            dropped = true;
        }
        // Give memory back after a burst of distinct keys.
        let map = &mut self.values;
        if dropped && map.capacity() > 64 && map.len() < map.capacity() / 8 {
            map.shrink_to(map.len() * 2);
        }
    }

    /// `key`'s value (swept first: an expired one is gone).
    pub(super) fn get(&mut self, key: &LockKey, now: Instant) -> Option<f64> {
        self.sweep(now);
        self.values.get(key).map(|(v, _)| *v)
    }

    /// Store `value` under `key` until `expires` (`None`: without expiry).
    pub(super) fn set(&mut self, key: &LockKey, value: f64, expires: Option<Instant>) {
        if let Some((_, Some(old))) = self.values.insert(key.clone(), (value, expires)) {
            self.expiries.remove(&(old, key.clone()));
        }
        if let Some(at) = expires {
            self.expiries.insert((at, key.clone()));
        }
    }

    /// Drop `key`'s value.
    pub(super) fn remove(&mut self, key: &LockKey) {
        if let Some((_, Some(at))) = self.values.remove(key) {
            self.expiries.remove(&(at, key.clone()));
        }
    }

    /// How many values are kept (expired ones not yet swept included).
    pub(super) fn len(&self) -> usize {
        self.values.len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::{Instant, sleep_until};

    use crate::{Compare, LockKey, MemoryBackend, NumericAction, NumericBackend, NumericOp};

    // Paused time: setting 10,000 values takes no time of the TTL's, however slow the
    // machine (a loaded CI run took longer than the TTL, and the first values were swept
    // before the last were set).
    #[tokio::test(start_paused = true)]
    async fn expired_values_of_many_keys_are_swept_without_being_read_again() {
        let backend = MemoryBackend::new();
        let ttl = Duration::from_millis(50);
        let op = NumericOp {
            compare: Compare::Greater,
            value: 1.0,
            epsilon: 0.0,
            action: NumericAction::Set { ttl: Some(ttl) },
        };
        for i in 0..10_000 {
            let key = LockKey::new(format!("n{i}")).unwrap();
            assert!(backend.compare_and_set(&key, &op).await.unwrap());
        }
        let set = Instant::now();
        assert_eq!(backend.numbers.lock().unwrap().len(), 10_000);
        // Time passes past every TTL; then numeric calls go on, on other keys.
        sleep_until(set + ttl).await;
        let other = LockKey::new("other").unwrap();
        assert_eq!(backend.numeric_get(&other).await.unwrap(), None);
        let left = backend.numbers.lock().unwrap().len();
        assert_eq!(left, 0, "{left} expired values are still kept");
        assert_eq!(backend.key_count(), 0);
    }
}
