//! [`Slot`]: one record or tombstone of the in-process store in one allocation, and what
//! the store's byte budget charges for it.

use std::{
    borrow::Borrow,
    hash::{Hash, Hasher},
    ops::Range,
    sync::Arc,
};

use bytes::Bytes;

use crate::{Record, from_unix_millis};

/// What a record costs beyond its allocation: its reference in the map (16 bytes and a
/// control byte, in a table kept between 7/16 and 7/8 full: about 26 bytes on average)
/// and in its queue (16 bytes, in a ring between half full and full: about 22).
pub(super) const ENTRY: usize = 48;

/// `Arc`'s two reference counts, ahead of the slot's bytes in its allocation.
pub(super) const ARC_HEADER: usize = 16;

/// What the budget charges for a slot of `len` bytes: its allocation as the system
/// allocator rounds it (a 64-bit glibc chunk: 8 bytes of size header, rounded up to 16,
/// at least 32), plus [`ENTRY`]. Measured against the process's resident memory by
/// `benches/record_memory.rs`.
pub(super) fn charge(len: usize) -> usize {
    let chunk = (ARC_HEADER + len + 8).div_ceil(16) * 16;
    chunk.max(32) + ENTRY
}

/// One record or tombstone, in one allocation:
///
/// | bytes | what |
/// | --- | --- |
/// | 2 | key length (at most `MAX_KEY_LEN`) |
/// | 4 | fingerprint length |
/// | 4 | metadata length |
/// | 1 | 1: kept, 0: a tombstone |
/// | 8 | completion time, Unix ms |
/// | 8 | expiry, ns since the store's `base` |
/// | 8 | position in its queue |
/// | .. | key, fingerprint, metadata, body (the rest) |
///
/// Immutable once made: a record evicted to its tombstone is a new, smaller slot.
#[derive(Clone)]
pub(super) struct Slot(pub(super) Arc<[u8]>);

pub(super) const HEADER: usize = 2 + 4 + 4 + 1 + 8 + 8 + 8;

/// The parts of a slot, before it is made.
pub(super) struct Parts<'a> {
    pub(super) key: &'a [u8],
    pub(super) fingerprint: &'a [u8],
    pub(super) meta: &'a [u8],
    pub(super) body: &'a [u8],
    pub(super) kept: bool,
    pub(super) completed_at: u64,
    pub(super) expires: u64,
    pub(super) seq: u64,
}

impl Slot {
    /// A slot of `parts`, built in `scratch` (reused, so that the slot is the only
    /// allocation), or `None` when a length does not fit its field.
    pub(super) fn new(parts: &Parts<'_>, scratch: &mut Vec<u8>) -> Option<Self> {
        let key_len = u16::try_from(parts.key.len()).ok()?;
        let fp_len = u32::try_from(parts.fingerprint.len()).ok()?;
        let meta_len = u32::try_from(parts.meta.len()).ok()?;
        scratch.clear();
        scratch.extend_from_slice(&key_len.to_le_bytes());
        scratch.extend_from_slice(&fp_len.to_le_bytes());
        scratch.extend_from_slice(&meta_len.to_le_bytes());
        scratch.push(u8::from(parts.kept));
        scratch.extend_from_slice(&parts.completed_at.to_le_bytes());
        scratch.extend_from_slice(&parts.expires.to_le_bytes());
        scratch.extend_from_slice(&parts.seq.to_le_bytes());
        for part in [parts.key, parts.fingerprint, parts.meta, parts.body] {
            scratch.extend_from_slice(part);
        }
        let slot = Self(Arc::from(&scratch[..]));
        // A burst of large bodies must not leave a large scratch behind.
        if scratch.capacity() > 64 << 10 {
            *scratch = Vec::new();
        }
        Some(slot)
    }

    pub(super) fn field<const N: usize>(&self, at: usize) -> [u8; N] {
        self.0[at..at + N].try_into().expect("within the header")
    }

    pub(super) fn key_len(&self) -> usize {
        usize::from(u16::from_le_bytes(self.field(0)))
    }

    pub(super) fn fp_len(&self) -> usize {
        u32::from_le_bytes(self.field(2)) as usize
    }

    pub(super) fn meta_len(&self) -> usize {
        u32::from_le_bytes(self.field(6)) as usize
    }

    pub(super) fn kept(&self) -> bool {
        self.0[10] == 1
    }

    pub(super) fn completed_at(&self) -> u64 {
        u64::from_le_bytes(self.field(11))
    }

    pub(super) fn expires(&self) -> u64 {
        u64::from_le_bytes(self.field(19))
    }

    pub(super) fn seq(&self) -> u64 {
        u64::from_le_bytes(self.field(27))
    }

    pub(super) fn key(&self) -> &[u8] {
        &self.0[HEADER..HEADER + self.key_len()]
    }

    pub(super) fn fingerprint_range(&self) -> Range<usize> {
        let start = HEADER + self.key_len();
        start..start + self.fp_len()
    }

    pub(super) fn meta_range(&self) -> Range<usize> {
        let start = self.fingerprint_range().end;
        start..start + self.meta_len()
    }

    pub(super) fn body_range(&self) -> Range<usize> {
        self.meta_range().end..self.0.len()
    }

    pub(super) fn charge(&self) -> usize {
        charge(self.0.len())
    }

    /// The record, its parts sharing this slot's allocation (no copy).
    pub(super) fn record(&self) -> Record {
        let whole = Bytes::from_owner(Whole(self.0.clone()));
        Record {
            fingerprint: whole.slice(self.fingerprint_range()),
            meta: whole.slice(self.meta_range()),
            body: whole.slice(self.body_range()),
            completed_at: from_unix_millis(self.completed_at()),
            kept: self.kept(),
        }
    }
}

/// A slot's allocation as the owner of the [`Bytes`] a read hands out.
pub(super) struct Whole(Arc<[u8]>);

impl AsRef<[u8]> for Whole {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

// The map finds a slot by its key: equal and hashed as the key's bytes.
impl PartialEq for Slot {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Slot {}

impl Hash for Slot {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key().hash(state);
    }
}

impl Borrow<[u8]> for Slot {
    fn borrow(&self) -> &[u8] {
        self.key()
    }
}
