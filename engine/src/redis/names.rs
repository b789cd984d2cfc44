//! Redis key and channel names: the prefix, the engine's hash tag, the kind word, the key.

use std::fmt::Write;

use super::super::LockKey;

/// The Redis names of one lock.
pub(super) struct Names {
    /// The FNV-1a hash of the key: its hash tag.
    pub(super) tag: u64,
    pub(super) lock: String,
    pub(super) fence: String,
    pub(super) queue: String,
    pub(super) channel: String,
}

impl Names {
    /// Every name of `key`. `sharded`: the backend runs on a Redis Cluster, and the
    /// wake-up channel is a sharded one (kind word `swake`, which tells the scripts to
    /// `SPUBLISH`).
    pub(super) fn new(prefix: &str, key: &LockKey, sharded: bool) -> Self {
        let tag = fnv1a(key.as_str().as_bytes());
        Self {
            tag,
            lock: tagged_name(prefix, tag, "lock", key),
            fence: tagged_name(prefix, tag, "fence", key),
            queue: tagged_name(prefix, tag, "queue", key),
            channel: tagged_name(prefix, tag, if sharded { "swake" } else { "wake" }, key),
        }
    }

    /// Only the lock and fence names (renewal, extend, admin set): the others stay empty.
    pub(super) fn lease(prefix: &str, key: &LockKey) -> Self {
        let tag = fnv1a(key.as_str().as_bytes());
        Self {
            tag,
            lock: tagged_name(prefix, tag, "lock", key),
            fence: tagged_name(prefix, tag, "fence", key),
            queue: String::new(),
            channel: String::new(),
        }
    }
}

/// The Redis name of one kind of object of `key` (`lock`, `num`, `pool`, ...):
/// `P:{T}:kind:K`, with `T` the 16 hex digits of the key's FNV-1a hash. One allocation of
/// the exact size, no formatting machinery: four of these are on every lock's request path.
pub(super) fn object_name(prefix: &str, kind: &str, key: &LockKey) -> String {
    tagged_name(prefix, fnv1a(key.as_str().as_bytes()), kind, key)
}

/// [`object_name`] with the key's hash already computed.
fn tagged_name(prefix: &str, tag: u64, kind: &str, key: &LockKey) -> String {
    let key = key.as_str();
    let mut name = String::with_capacity(prefix.len() + kind.len() + key.len() + 22);
    name.push_str(prefix);
    name.push_str(":{");
    // Writing to a String cannot fail.
    let _ = write!(name, "{tag:016x}");
    name.push_str("}:");
    name.push_str(kind);
    name.push(':');
    name.push_str(key);
    name
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
        let n = Names::new("app", &key, false);
        let tag = &n.lock[n.lock.find('{').unwrap()..=n.lock.find('}').unwrap()];
        assert_eq!(tag.len(), 18, "{tag}");
        assert!(tag[1..17].bytes().all(|b| b.is_ascii_hexdigit()));
        for name in [&n.fence, &n.queue, &n.channel] {
            assert!(name.starts_with(&n.lock[..n.lock.find('}').unwrap() + 1]));
        }
    }

    #[test]
    fn user_keys_cannot_spell_engine_keys() {
        // "queue:x" as a user key must not produce the queue key of "x".
        let a = Names::new("p", &LockKey::new("queue:x").unwrap(), false);
        let b = Names::new("p", &LockKey::new("x").unwrap(), false);
        for x in [&a.lock, &a.fence, &a.queue] {
            for y in [&b.lock, &b.fence, &b.queue] {
                assert_ne!(x, y);
            }
        }
    }

    #[test]
    fn the_layout_is_prefix_tag_kind_key() {
        let key = LockKey::new("k").unwrap();
        assert_eq!(
            object_name("p", "lock", &key),
            format!("p:{{{:016x}}}:lock:k", fnv1a(b"k"))
        );
    }
}
