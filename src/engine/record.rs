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
}

impl Record {
    /// A record completed now.
    pub fn new(fingerprint: Bytes, meta: Bytes, body: Bytes) -> Self {
        Record {
            fingerprint,
            meta,
            body,
            completed_at: from_unix_millis(unix_millis(SystemTime::now())),
        }
    }

    /// The bytes the record occupies in a store, roughly: what budgets count.
    pub fn size(&self) -> usize {
        self.fingerprint.len() + self.meta.len() + self.body.len() + 8
    }
}

/// Milliseconds since the Unix epoch (0 before it).
pub(crate) fn unix_millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

pub(crate) fn from_unix_millis(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}
