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
        Ok(LockKey(Arc::from(key)))
    }

    /// The key as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn validate(s: &str, max: usize) -> Result<(), KeyError> {
    if s.is_empty() {
        return Err(KeyError::Empty);
    }
    if s.len() > max {
        return Err(KeyError::TooLong { len: s.len(), max });
    }
    if s.chars().any(char::is_control) {
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
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Token(Arc<str>);

impl Token {
    /// A fresh token of 128 random bits, hex encoded.
    pub fn random() -> Self {
        // Hex digits written in place: one allocation (the `Arc`), no formatting machinery.
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut bits = rand::random::<u128>();
        let mut text = [0u8; 32];
        for b in text.iter_mut().rev() {
            *b = HEX[(bits & 0xf) as usize];
            bits >>= 4;
        }
        Token(Arc::from(
            std::str::from_utf8(&text).expect("hex digits are ASCII"),
        ))
    }

    /// A caller-supplied token: 1 to [`MAX_TOKEN_LEN`] bytes, no control characters.
    pub fn new(token: impl AsRef<str>) -> Result<Self, KeyError> {
        let token = token.as_ref();
        validate(token, MAX_TOKEN_LEN)?;
        Ok(Token(Arc::from(token)))
    }

    /// The token as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Tokens are capabilities: show only a prefix in logs.
        let shown: String = self.0.chars().take(8).collect();
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
        Fence(value)
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
