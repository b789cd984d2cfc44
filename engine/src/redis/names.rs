//! Redis key and channel names: the prefix, the engine's hash tag, the kind word, the key.
//!
//! A lock's names are written straight into the command that carries them ([`Name`] is a
//! redis-rs argument): a script call costs no allocation per name.

use std::{fmt, io::Write as _};

use redis::{RedisWrite, ToRedisArgs, ToSingleRedisArg};

use super::super::LockKey;

/// The Redis names of one lock: the prefix, the key and its hash, from which each name is
/// written where it is needed. `Copy`: it borrows them.
#[derive(Clone, Copy)]
pub(super) struct Names<'a> {
    prefix: &'a str,
    key: &'a LockKey,
    /// The FNV-1a hash of the key: its hash tag.
    pub(super) tag: u64,
    sharded: bool,
}

impl<'a> Names<'a> {
    /// Every name of `key`. `sharded`: the backend runs on a Redis Cluster, and the
    /// wake-up channel is a sharded one (kind word `swake`, which tells the scripts to
    /// `SPUBLISH`).
    pub(super) fn new(prefix: &'a str, key: &'a LockKey, sharded: bool) -> Self {
        Self {
            prefix,
            key,
            tag: fnv1a(key.as_str().as_bytes()),
            sharded,
        }
    }

    /// The key these are the names of.
    pub(super) fn key(&self) -> &'a LockKey {
        self.key
    }

    fn name(&self, kind: &'static str) -> Name<'a> {
        Name {
            prefix: self.prefix,
            tag: self.tag,
            kind,
            key: self.key.as_str(),
        }
    }

    /// Who holds the key: one token alone, or shared holders (see `scripts`).
    pub(super) fn lock(&self) -> Name<'a> {
        self.name("lock")
    }

    pub(super) fn fence(&self) -> Name<'a> {
        self.name("fence")
    }

    /// The waiters' ticket ids, both modes, in arrival order.
    pub(super) fn queue(&self) -> Name<'a> {
        self.name("queue")
    }

    /// Each waiting ticket's content, by id.
    pub(super) fn tickets(&self) -> Name<'a> {
        self.name("tickets")
    }

    /// The shared holders, by token.
    pub(super) fn holders(&self) -> Name<'a> {
        self.name("holders")
    }

    /// The idempotency record (a hash).
    pub(super) fn record(&self) -> Name<'a> {
        self.name("rec")
    }

    pub(super) fn channel(&self) -> Name<'a> {
        self.name(if self.sharded { "swake" } else { "wake" })
    }
}

/// One Redis name, `P:{T}:kind:K`: written into a command as one argument, or displayed.
#[derive(Clone, Copy)]
pub(super) struct Name<'a> {
    prefix: &'a str,
    tag: u64,
    kind: &'static str,
    key: &'a str,
}

impl Name<'_> {
    /// `f` with this name as a `&str`, built on the stack (no allocation: names are at most
    /// 64 + 22 + 5 + 512 bytes).
    pub(super) fn with_str<R>(&self, f: impl FnOnce(&str) -> R) -> R {
        let mut buf = [0u8; 640];
        let mut cursor = std::io::Cursor::new(&mut buf[..]);
        // Fits: the prefix and the key are bounded (see `MAX_PREFIX_LEN`, `MAX_KEY_LEN`).
        let _ = write!(cursor, "{self}");
        let len = usize::try_from(cursor.position()).unwrap_or(0);
        f(std::str::from_utf8(&buf[..len]).unwrap_or_default())
    }
}

impl<'a> Name<'a> {
    /// The name's parts, in order: written one after the other, they are the name. (A
    /// script call writes five or six names: piece by piece, not through `format_args!`,
    /// whose machinery was a good part of a call's cost on the client.)
    fn parts<'t>(&self, tag: &'t [u8; 16]) -> [&'t [u8]; 7]
    where
        'a: 't,
    {
        [
            self.prefix.as_bytes(),
            b":{",
            tag,
            b"}:",
            self.kind.as_bytes(),
            b":",
            self.key.as_bytes(),
        ]
    }
}

/// `tag` as 16 lowercase hex digits (what `{:016x}` writes).
fn hex16(tag: u64) -> [u8; 16] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 16];
    for (i, digit) in out.iter_mut().enumerate() {
        *digit = HEX[((tag >> (60 - 4 * i)) & 0xf) as usize];
    }
    out
}

impl fmt::Display for Name<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tag = hex16(self.tag);
        for part in self.parts(&tag) {
            // Every part is UTF-8: the prefix, the key and the kind are `str`s, the rest
            // ASCII.
            f.write_str(std::str::from_utf8(part).map_err(|_| fmt::Error)?)?;
        }
        Ok(())
    }
}

impl ToRedisArgs for Name<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + RedisWrite,
    {
        let mut w = out.writer_for_next_arg();
        let tag = hex16(self.tag);
        for part in self.parts(&tag) {
            // Writing to a command's buffer cannot fail.
            let _ = w.write_all(part);
        }
    }
}

impl ToSingleRedisArg for Name<'_> {}

/// The Redis name of one kind of object of `key` (`lock`, `num`, `pool`, ...):
/// `P:{T}:kind:K`, with `T` the 16 hex digits of the key's FNV-1a hash, as a `String`
/// (for the calls off the lock's request path, and the pool's stored names).
pub(super) fn object_name(prefix: &str, kind: &'static str, key: &LockKey) -> String {
    Name {
        prefix,
        tag: fnv1a(key.as_str().as_bytes()),
        kind,
        key: key.as_str(),
    }
    .to_string()
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
    fn a_name_is_written_as_it_was_formatted() {
        for (prefix, key) in [
            ("app", "k"),
            ("", "}{evil}"),
            ("tl", "ключ:1"),
            ("p", "a b"),
        ] {
            let key = LockKey::new(key).unwrap();
            let tag = fnv1a(key.as_str().as_bytes());
            for kind in ["lock", "fence", "wake", "swake", "rec"] {
                let name = Name {
                    prefix,
                    tag,
                    kind,
                    key: key.as_str(),
                };
                let expected = format!("{prefix}:{{{tag:016x}}}:{kind}:{}", key.as_str());
                assert_eq!(name.to_string(), expected);
                let mut cmd = redis::Cmd::new();
                cmd.arg(name);
                assert_eq!(cmd.args_iter().count(), 1);
                match cmd.args_iter().next() {
                    Some(redis::Arg::Simple(bytes)) => assert_eq!(bytes, expected.as_bytes()),
                    _ => panic!("{expected}: not one simple argument"),
                }
                assert_eq!(name.with_str(str::to_owned), expected);
            }
        }
        assert_eq!(&hex16(0), b"0000000000000000");
        assert_eq!(&hex16(u64::MAX), b"ffffffffffffffff");
        assert_eq!(&hex16(0x0123_4567_89ab_cdef), b"0123456789abcdef");
    }

    #[test]
    fn user_braces_never_reach_the_hash_tag() {
        let key = LockKey::new("}{evil}").unwrap();
        let n = Names::new("app", &key, false);
        let lock = n.lock().to_string();
        let tag = &lock[lock.find('{').unwrap()..=lock.find('}').unwrap()];
        assert_eq!(tag.len(), 18, "{tag}");
        assert!(tag[1..17].bytes().all(|b| b.is_ascii_hexdigit()));
        for name in [
            n.fence(),
            n.queue(),
            n.tickets(),
            n.holders(),
            n.channel(),
            n.record(),
        ] {
            assert!(
                name.to_string()
                    .starts_with(&lock[..lock.find('}').unwrap() + 1])
            );
        }
    }

    #[test]
    fn user_keys_cannot_spell_engine_keys() {
        // "queue:x" as a user key must not produce the queue key of "x".
        let (ka, kb) = (LockKey::new("queue:x").unwrap(), LockKey::new("x").unwrap());
        let (a, b) = (Names::new("p", &ka, false), Names::new("p", &kb, false));
        for x in [a.lock(), a.fence(), a.queue()] {
            for y in [b.lock(), b.fence(), b.queue()] {
                assert_ne!(x.to_string(), y.to_string());
            }
        }
    }

    #[test]
    fn the_layout_is_prefix_tag_kind_key() {
        let key = LockKey::new("k").unwrap();
        let want = format!("p:{{{:016x}}}:lock:k", fnv1a(b"k"));
        assert_eq!(object_name("p", "lock", &key), want);
        let names = Names::new("p", &key, false);
        names.lock().with_str(|s| assert_eq!(s, want));
        let mut cmd = redis::cmd("GET");
        cmd.arg(names.lock());
        assert_eq!(
            cmd.args_iter().nth(1),
            Some(redis::Arg::Simple(want.as_bytes()))
        );
    }

    #[test]
    fn the_longest_name_fits_the_stack_buffer() {
        let key = LockKey::new("k".repeat(crate::MAX_KEY_LEN)).unwrap();
        let prefix = "p".repeat(super::super::MAX_PREFIX_LEN);
        let name = Names::new(&prefix, &key, true).channel();
        name.with_str(|s| assert_eq!(s, name.to_string()));
    }
}
