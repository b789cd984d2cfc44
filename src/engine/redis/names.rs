//! Redis key and channel names: the prefix, the engine's hash tag, the kind word, the key.

use super::super::LockKey;

/// The Redis names of one lock.
pub(super) struct Names {
    pub(super) lock: String,
    pub(super) fence: String,
    pub(super) queue: String,
    pub(super) wait: String,
    pub(super) channel: String,
}

impl Names {
    pub(super) fn new(prefix: &str, key: &LockKey) -> Self {
        let base = tagged_base(prefix, key);
        let key = key.as_str();
        let name = |kind: &str| format!("{base}{kind}:{key}");
        Names {
            lock: name("lock"),
            fence: name("fence"),
            queue: name("queue"),
            wait: name("wait"),
            channel: name("wake"),
        }
    }
}

/// `P:{T}:`, the start of every Redis name of `key`: the prefix and the engine's hash tag.
fn tagged_base(prefix: &str, key: &LockKey) -> String {
    format!("{prefix}:{{{:016x}}}:", fnv1a(key.as_str().as_bytes()))
}

/// The Redis name of one kind of object of `key` (`lock`, `num`, `pool`, ...), laid out
/// as [`Names`] lays out a lock's.
pub(super) fn object_name(prefix: &str, kind: &str, key: &LockKey) -> String {
    format!("{}{kind}:{}", tagged_base(prefix, key), key.as_str())
}

/// FNV-1a, 64 bits: stable across processes and versions (unlike `std`'s hasher), which
/// the hash tag needs; it only spreads keys over slots, so it need not be cryptographic.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_braces_never_reach_the_hash_tag() {
        let key = LockKey::new("}{evil}").unwrap();
        let n = Names::new("app", &key);
        let tag = &n.lock[n.lock.find('{').unwrap()..=n.lock.find('}').unwrap()];
        assert_eq!(tag.len(), 18, "{tag}");
        assert!(tag[1..17].bytes().all(|b| b.is_ascii_hexdigit()));
        for name in [&n.fence, &n.queue, &n.wait, &n.channel] {
            assert!(name.starts_with(&n.lock[..n.lock.find('}').unwrap() + 1]));
        }
    }

    #[test]
    fn user_keys_cannot_spell_engine_keys() {
        // "queue:x" as a user key must not produce the queue key of "x".
        let a = Names::new("p", &LockKey::new("queue:x").unwrap());
        let b = Names::new("p", &LockKey::new("x").unwrap());
        for x in [&a.lock, &a.fence, &a.queue, &a.wait] {
            for y in [&b.lock, &b.fence, &b.queue, &b.wait] {
                assert_ne!(x, y);
            }
        }
    }
}
