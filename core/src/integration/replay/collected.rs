//! [`Collected`]: a request body read to its end before the lock, without a copy when it
//! arrives in one chunk.

use bytes::{Bytes, BytesMut};

/// A request body read to its end: a body that arrives in one chunk (most do) is kept as
/// it is, without a copy.
#[derive(Default)]
pub(super) enum Collected {
    #[default]
    Empty,
    One(Bytes),
    Many(BytesMut),
}

impl Collected {
    pub(super) fn len(&self) -> usize {
        match self {
            Self::Empty => 0,
            Self::One(b) => b.len(),
            Self::Many(b) => b.len(),
        }
    }

    /// Add `chunk`; `expected` is the body's declared length, if any (else 0).
    pub(super) fn push(&mut self, chunk: Bytes, expected: usize) {
        *self = match std::mem::take(self) {
            Self::Empty => Self::One(chunk),
            Self::One(first) => {
                let mut all = BytesMut::with_capacity(expected.max(first.len() + chunk.len()));
                all.extend_from_slice(&first);
                all.extend_from_slice(&chunk);
                Self::Many(all)
            }
            Self::Many(mut all) => {
                all.extend_from_slice(&chunk);
                Self::Many(all)
            }
        };
    }

    pub(super) fn into_bytes(self) -> Bytes {
        match self {
            Self::Empty => Bytes::new(),
            Self::One(b) => b,
            Self::Many(b) => b.freeze(),
        }
    }
}
