//! The values that name and guard a lock: [`LockKey`], [`Token`] and [`Fence`].

use std::{fmt, sync::Arc};

use super::KeyError;

/// The longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 512;
/// The longest caller-supplied token accepted, in bytes.
pub const MAX_TOKEN_LEN: usize = 128;
/// A validated lock key: 1 to [`MAX_KEY_LEN`] bytes of UTF-8 with no control characters.
///
/// Keys are data, never syntax: backends must store any valid key without letting its
/// content change where or how it is stored. Cloning is cheap.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockKey(Arc<str>);

impl LockKey {
    /// Validate `key`.
    pub fn new(key: impl AsRef<str>) -> Result<Self, KeyError> {
        let key = key.as_ref();
        validate(key, MAX_KEY_LEN)?;
        Ok(Self(Arc::from(key)))
    }

    /// `head` followed by `value`, validated as one key, and built in place: one
    /// allocation where `LockKey::new(format!(...))` makes two (a layer builds one key
    /// per request this way).
    ///
    /// ```
    /// use tower_lock_engine::LockKey;
    ///
    /// let key = LockKey::joined("invoices/", "42")?;
    /// assert_eq!(key, LockKey::new("invoices/42")?);
    /// # Ok::<(), tower_lock_engine::KeyError>(())
    /// ```
    pub fn joined(head: &str, value: &str) -> Result<Self, KeyError> {
        validate_parts(&[head, value], MAX_KEY_LEN)?;
        // Joined on the stack (a key is at most MAX_KEY_LEN bytes), then copied into the
        // key's one allocation; a short key (most) zeroes a short buffer.
        let len = head.len() + value.len();
        let mut short = [0u8; 128];
        let mut long;
        let buf: &mut [u8] = if len <= short.len() {
            &mut short
        } else {
            long = [0u8; MAX_KEY_LEN];
            &mut long
        };
        let (h, v) = buf.split_at_mut(head.len());
        h.copy_from_slice(head.as_bytes());
        v[..value.len()].copy_from_slice(value.as_bytes());
        let text = std::str::from_utf8(&buf[..head.len() + value.len()])
            .expect("two strs one after the other are UTF-8");
        Ok(Self(Arc::from(text)))
    }

    /// The key as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

pub(crate) fn validate(s: &str, max: usize) -> Result<(), KeyError> {
    validate_parts(&[s], max)
}

/// Validate the concatenation of `parts` (without building it).
fn validate_parts(parts: &[&str], max: usize) -> Result<(), KeyError> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    if len == 0 {
        return Err(KeyError::Empty);
    }
    if len > max {
        return Err(KeyError::TooLong { len, max });
    }
    // One pass over the bytes for the common case, printable ASCII, with no decoding;
    // anything else (a control byte, or a multi-byte character, which may be a two-byte C1
    // control) is looked at by char.
    let control =
        |p: &&str| !p.bytes().all(|b| (0x20..0x7f).contains(&b)) && p.chars().any(char::is_control);
    if parts.iter().any(control) {
        return Err(KeyError::ControlCharacter);
    }
    Ok(())
}

impl fmt::Display for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl AsRef<str> for LockKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// The owner token of one acquisition. Release, extend and renew compare it atomically,
/// so nobody can release a lease that is not theirs.
///
/// [`Token::random`] makes 128 random bits (the default for every acquisition); a caller
/// may supply its own with [`Lock::token`](super::Lock::token), for example to make acquisition reentrant
/// per owner.
///
/// Two tokens are equal when their text is equal, however they were made.
#[derive(Clone)]
pub struct Token(Repr);

#[derive(Clone)]
enum Repr {
    /// A random token's hex digits, kept in place: every acquisition makes one, and a
    /// fixed-size value costs no allocation (the text is there for backends that store
    /// it, such as Redis).
    Random([u8; 32]),
    /// A caller-supplied token.
    Given(Arc<str>),
}

impl Token {
    /// A fresh token of 128 random bits, hex encoded.
    pub fn random() -> Self {
        Self(Repr::Random(random_hex()))
    }

    /// A fresh token of 128 random bits for the in-process backend, from this thread's
    /// cryptographic generator rather than a system call (see [`local_random_hex`]).
    pub(crate) fn random_local() -> Self {
        Self(Repr::Random(local_random_hex()))
    }

    /// A caller-supplied token: 1 to [`MAX_TOKEN_LEN`] bytes, no control characters.
    pub fn new(token: impl AsRef<str>) -> Result<Self, KeyError> {
        let token = token.as_ref();
        validate(token, MAX_TOKEN_LEN)?;
        Ok(Self(Repr::Given(Arc::from(token))))
    }

    /// The token as a string.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            Repr::Random(text) => std::str::from_utf8(text).expect("hex digits are ASCII"),
            Repr::Given(text) => text,
        }
    }
}

/// 128 random bits from the operating system, as 32 hex digits: owner tokens and the
/// Redis backend's waiter tickets. The OS generator (`getrandom`) is what every
/// cryptographic generator seeds from; a token costs one system call and no allocation.
pub(crate) fn random_hex() -> [u8; 32] {
    let mut bits = [0u8; 16];
    // Fails only where the OS has no generator at all, which no lock can do without.
    getrandom::fill(&mut bits).expect("the operating system's random number generator failed");
    hex(bits)
}

/// 128 random bits from this thread's cryptographic generator (`rand`'s `ThreadRng`:
/// ChaCha12, seeded from the operating system and reseeded from it every 64 KiB), as 32
/// hex digits: the owner tokens of the in-process backend, where a system call per token
/// was most of an uncontended acquisition's cost. Not for tokens that leave the process
/// (Redis, Postgres): a generator's state is copied into a forked child, whose tokens would
/// then repeat its parent's, which only a shared server could confuse.
pub(crate) fn local_random_hex() -> [u8; 32] {
    use rand::RngCore;
    let mut bits = [0u8; 16];
    // One fill, not a draw per byte (what sampling a `[u8; 16]` does).
    rand::rng().fill_bytes(&mut bits);
    hex(bits)
}

/// `bits` as 32 lowercase hex digits.
fn hex(bits: [u8; 16]) -> [u8; 32] {
    // A byte's two digits at once, from a table: every acquisition makes a token, and a
    // digit at a time was a good part of an in-process acquisition's cost.
    const PAIRS: [[u8; 2]; 256] = {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut pairs = [[0u8; 2]; 256];
        let mut i = 0;
        while i < 256 {
            pairs[i] = [HEX[i >> 4], HEX[i & 0xf]];
            i += 1;
        }
        pairs
    };
    let mut text = [0u8; 32];
    for (pair, byte) in text.chunks_exact_mut(2).zip(bits) {
        pair.copy_from_slice(&PAIRS[usize::from(byte)]);
    }
    text
}

impl PartialEq for Token {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (Repr::Random(a), Repr::Random(b)) => a == b,
            _ => self.as_str() == other.as_str(),
        }
    }
}

impl Eq for Token {}

impl std::hash::Hash for Token {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // By text, as equality is.
        self.as_str().hash(state);
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Tokens are capabilities: show only a prefix in logs.
        let shown: String = self.as_str().chars().take(8).collect();
        write!(f, "Token({shown}…)")
    }
}

/// A fencing token: strictly increases with every acquisition of the same key.
///
/// Pass it to the storage the lock protects and have the storage refuse writes carrying a
/// fence lower than the highest it has seen. That is what keeps storage safe when a lease
/// expires while its holder still runs (a paused process, a network partition): leases
/// alone are not consensus.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Fence(u64);

impl Fence {
    /// Wrap a raw fence value (for backends).
    pub const fn new(value: u64) -> Self {
        Self(value)
    }

    /// The raw value.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// The fence as the `i64` a SQL `bigint` column takes: `i64::try_from(lease.fence())?`.
///
/// Every backend's fences fit (microseconds since 1970, or a counter, and a `bigint` on
/// Postgres); the conversion fails only for a value a third-party backend made past
/// `i64::MAX`, which must not be stored wrapped round to a negative number.
impl TryFrom<Fence> for i64 {
    type Error = std::num::TryFromIntError;

    fn try_from(fence: Fence) -> Result<Self, Self::Error> {
        Self::try_from(fence.0)
    }
}

#[cfg(test)]
mod tests {
    use std::hash::BuildHasher;

    use super::*;

    #[test]
    fn a_fence_converts_to_a_bigint_exactly_or_not_at_all() {
        assert_eq!(
            i64::try_from(Fence::new(1_764_000_000_000_000)),
            Ok(1_764_000_000_000_000)
        );
        assert_eq!(i64::try_from(Fence::new(i64::MAX as u64)), Ok(i64::MAX));
        assert!(i64::try_from(Fence::new(i64::MAX as u64 + 1)).is_err());
    }

    #[test]
    fn a_joined_key_is_the_concatenation_validated_as_one() {
        let key = LockKey::joined("ns/header=x/", "acme").unwrap();
        assert_eq!(key, LockKey::new("ns/header=x/acme").unwrap());
        assert_eq!(key.as_str(), "ns/header=x/acme");
        assert!(matches!(LockKey::joined("", ""), Err(KeyError::Empty)));
        assert!(matches!(
            LockKey::joined("h/", "a\nb"),
            Err(KeyError::ControlCharacter)
        ));
        let long = "x".repeat(MAX_KEY_LEN);
        assert!(matches!(
            LockKey::joined("h/", &long),
            Err(KeyError::TooLong { len, .. }) if len == MAX_KEY_LEN + 2
        ));
    }

    #[test]
    fn hex_is_every_byte_as_two_lowercase_digits() {
        for start in (0..=255u8).step_by(16) {
            let bits: [u8; 16] = std::array::from_fn(|i| start + i as u8);
            let expected: String = bits.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(std::str::from_utf8(&hex(bits)).unwrap(), expected);
        }
    }

    #[test]
    fn control_characters_are_refused_in_either_part_ascii_or_not() {
        for bad in ["a\u{7f}", "\u{0}", "tab\there", "\u{85}é", "é\u{9f}"] {
            assert!(
                matches!(LockKey::joined("h/", bad), Err(KeyError::ControlCharacter)),
                "{bad:?}"
            );
            assert!(
                matches!(LockKey::joined(bad, "v"), Err(KeyError::ControlCharacter)),
                "{bad:?}"
            );
        }
        for good in ["~ !", "é", "日本/語", "a b"] {
            assert!(LockKey::joined("h/", good).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn tokens_are_equal_by_text_however_made() {
        let random = Token::random();
        assert_eq!(random.as_str().len(), 32);
        let given = Token::new(random.as_str()).unwrap();
        assert_eq!(random, given);
        let state = std::collections::hash_map::RandomState::new();
        assert_eq!(state.hash_one(&random), state.hash_one(&given));
        assert_ne!(random, Token::random());
    }

    #[test]
    fn in_process_tokens_are_fresh_hex_on_every_thread() {
        let tokens: std::collections::HashSet<String> = (0..4)
            .map(|_| std::thread::spawn(|| Token::random_local().as_str().to_owned()))
            .map(|t| t.join().unwrap())
            .chain((0..1000).map(|_| Token::random_local().as_str().to_owned()))
            .collect();
        assert_eq!(
            tokens.len(),
            1004,
            "no token repeats, within a thread or across"
        );
        assert!(tokens.iter().all(|t| {
            t.len() == 32
                && t.bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        }));
    }
}
