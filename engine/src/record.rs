//! [`Record`]: the stored outcome of a completed operation, written atomically with the
//! release of the lock that guarded it (see [`Lease::complete`](super::Lease::complete)).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;

/// The outcome of a completed operation, kept by a backend with the
/// [`RecordBackend`](super::RecordBackend) capability under the operation's lock key.
///
/// The engine does not interpret it: idempotency replay stores a request fingerprint, an
/// encoded response head and a response body in it. A record appears only in the atomic
/// step that releases the lock of the holder that wrote it, so a caller that holds a key
/// and finds no record knows that no earlier holder completed.
///
/// A store that cannot keep a record whole for its retention (the in-process backend past
/// its byte budget, or a record larger than the whole budget) keeps a *tombstone* instead:
/// the fingerprint and the completion time, with [`kept`](Record#structfield.kept) `false`
/// and no metadata or body. A tombstone still says "this operation completed", so a caller
/// never runs it a second time within the retention; it only cannot be given the output.
///
/// ```
/// use bytes::Bytes;
/// use tower_lock_engine::Record;
///
/// let record = Record::new(Bytes::from("fp"), Bytes::from("head"), Bytes::from("body"));
/// assert!(record.kept);
/// let tombstone = Record::tombstone(record.fingerprint.clone(), record.completed_at);
/// assert!(!tombstone.kept && tombstone.body.is_empty() && tombstone.meta.is_empty());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// What identifies the operation's input (idempotency replay: a SHA-256 of the request).
    pub fingerprint: Bytes,
    /// Opaque metadata (idempotency replay: the response status and headers).
    pub meta: Bytes,
    /// The operation's output (idempotency replay: the response body).
    pub body: Bytes,
    /// When the operation completed, to the millisecond.
    pub completed_at: SystemTime,
    /// Whether the output was kept. `false`: a tombstone, whose `meta` and `body` are
    /// empty because the store could not keep them; the operation did complete.
    pub kept: bool,
}

impl Record {
    /// A record completed now.
    pub fn new(fingerprint: Bytes, meta: Bytes, body: Bytes) -> Self {
        Self {
            fingerprint,
            meta,
            body,
            completed_at: from_unix_millis(unix_millis(SystemTime::now())),
            kept: true,
        }
    }

    /// The tombstone of an operation that completed at `completed_at` (to the millisecond)
    /// with input `fingerprint`, whose output was not kept.
    pub fn tombstone(fingerprint: Bytes, completed_at: SystemTime) -> Self {
        Self {
            fingerprint,
            meta: Bytes::new(),
            body: Bytes::new(),
            completed_at: from_unix_millis(unix_millis(completed_at)),
            kept: false,
        }
    }

    /// This record's tombstone: what a store keeps of it when it cannot keep it whole.
    pub fn to_tombstone(&self) -> Self {
        Self::tombstone(self.fingerprint.clone(), self.completed_at)
    }

    /// The bytes of the record's own data: fingerprint, metadata, body and completion
    /// time. A store adds its own bookkeeping to that (the in-process budget charges what
    /// the record costs in memory; see
    /// [`MemoryBackend::with_record_budget`](crate::MemoryBackend::with_record_budget)).
    pub fn size(&self) -> usize {
        self.fingerprint.len() + self.meta.len() + self.body.len() + 8
    }
}

/// What [`Lock::acquire_or_record`](super::Lock::acquire_or_record) found: the lease of a
/// key with no record stored, or the record stored under it (nothing acquired). The seam's
/// counterpart is [`GrantOrRecord`](super::GrantOrRecord).
#[derive(Debug)]
pub enum Acquired {
    /// The key is held, and no record was stored when it was granted.
    Lease(super::Lease),
    /// A record is stored under the key; the key was not acquired.
    Record(Record),
}

/// Milliseconds since the Unix epoch (0 before it).
pub(crate) fn unix_millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

pub(crate) fn from_unix_millis(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}
