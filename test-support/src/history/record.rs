//! [`History`]: what a soak recorded, every operation with its invocation and completion
//! instants on one monotonic clock.

use std::{collections::BTreeMap, time::Duration};

/// How an acquisition holds its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Alone: the key's lock, or a shared lease with a limit of 1; nobody else beside
    /// it, in either mode.
    Exclusive,
    /// A shared lease, granted while nobody holds alone and fewer than `limit` hold.
    Shared {
        /// The most shared holders this request admits at its grant, itself included.
        limit: usize,
    },
}

/// One call to acquire a key, granted or not. Instants are offsets from the history's
/// origin (one monotonic clock, see [`History`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acquisition {
    /// The engine (node, process) that made the call.
    pub process: u32,
    /// The task within that process.
    pub task: u32,
    /// The key acquired.
    pub key: String,
    /// Exclusive, or one of N permits.
    pub mode: Mode,
    /// Whether the call asked for first-come-first-served order.
    pub fifo: bool,
    /// When `acquire` was called.
    pub invoked: Duration,
    /// When it returned (or was given up on).
    pub completed: Duration,
    /// What it was granted; `None` when it failed, timed out or was dropped.
    pub grant: Option<Grant>,
}

/// What a granted acquisition held, and what the engine said about its validity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The lease's owner token.
    pub token: String,
    /// The lease's fencing token.
    pub fence: u64,
    /// The validity deadline the engine reported last (at the grant, moved on by renewals).
    pub granted_until: Duration,
    /// When the holder was told its lease was lost (`is_lost()` true, or `lost()`
    /// resolved), if it was, before it released.
    pub lost_at: Option<Duration>,
    /// When the holder began to release (or dropped) the lease; `None`: held to the end
    /// of the history.
    pub released: Option<Duration>,
}

/// One write to a fenced register (a store that refuses a write whose fence is below the
/// highest it has accepted): `value`, computed from the `read` value, under `fence`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Write {
    /// The engine (node, process) of the writer.
    pub process: u32,
    /// The writer's task.
    pub task: u32,
    /// The register (one per lock key).
    pub key: String,
    /// The fence the write carried.
    pub fence: u64,
    /// The register's value the writer read, and computed `value` from.
    pub read: u64,
    /// The value written.
    pub value: u64,
    /// Whether the register accepted it.
    pub accepted: bool,
    /// When the write was sent.
    pub invoked: Duration,
    /// When the register answered.
    pub completed: Duration,
}

/// An administrative force release of a key: from its invocation on, whoever held the key
/// before it, or was being granted it while it ran, no longer holds it, told or not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Revocation {
    /// The key released.
    pub key: String,
    /// When the force release was called.
    pub invoked: Duration,
    /// When it returned.
    pub completed: Duration,
}

/// A stretch during which the backend lost its state (a restart without persistence, a
/// failover that lost writes): queues and tickets from before it are gone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outage {
    /// When the fault began.
    pub began: Duration,
    /// When the backend was back.
    pub ended: Duration,
}

/// A recorded history: acquisitions, register writes, force releases, outages, and each
/// register's final value.
///
/// Every instant is an offset from one origin on one monotonic clock. The
/// [`Recorder`](super::Recorder) reads `std::time::Instant` in one process (the soaks run
/// their engines as threads of the test process); a history gathered from several
/// processes must convert their instants to offsets of one shared `CLOCK_MONOTONIC`
/// origin (the same clock `Instant` reads on Linux) before merging.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    /// Every acquisition, in the order recorded.
    pub acquisitions: Vec<Acquisition>,
    /// Every register write.
    pub writes: Vec<Write>,
    /// Every force release.
    pub revocations: Vec<Revocation>,
    /// Every outage that lost the backend's state.
    pub outages: Vec<Outage>,
    /// Each register's value at the end (a register starts at 0).
    pub finals: BTreeMap<String, u64>,
}

impl History {
    /// The last instant recorded: where a hold never released ends.
    pub fn end(&self) -> Duration {
        let acquisitions = self.acquisitions.iter().flat_map(|a| {
            let grant = a.grant.as_ref();
            [
                Some(a.completed),
                grant.and_then(|g| g.released),
                grant.and_then(|g| g.lost_at),
            ]
        });
        let writes = self.writes.iter().map(|w| Some(w.completed));
        let revocations = self.revocations.iter().map(|r| Some(r.completed));
        acquisitions
            .chain(writes)
            .chain(revocations)
            .flatten()
            .max()
            .unwrap_or_default()
    }

    /// The granted acquisitions of each key.
    pub(super) fn grants_by_key(&self) -> BTreeMap<&str, Vec<(&Acquisition, &Grant)>> {
        let mut keys: BTreeMap<&str, Vec<_>> = BTreeMap::new();
        for a in &self.acquisitions {
            if let Some(g) = &a.grant {
                keys.entry(a.key.as_str()).or_default().push((a, g));
            }
        }
        keys
    }

    /// The instant a granted acquisition stopped holding its key: its release, the moment
    /// it was told its lease was lost, or the first force release of the key that may
    /// have followed its grant, whichever came first.
    ///
    /// A force release that returned after the acquire was invoked may have cut a grant
    /// still on its way back to the caller (nobody tells that holder), so it ends the hold
    /// where it began: an acquisition in flight across a force release is not checked for
    /// exclusion (its fence still is).
    /// `end` is [`end`](Self::end), computed once by the caller (it reads the whole
    /// history).
    pub(super) fn hold_end(&self, a: &Acquisition, g: &Grant, end: Duration) -> Duration {
        let revoked = self
            .revocations
            .iter()
            .filter(|r| r.key == a.key && r.completed > a.invoked)
            .map(|r| r.invoked)
            .min();
        [g.released.or(Some(end)), g.lost_at, revoked]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or_default()
    }
}
