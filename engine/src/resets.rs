//! [`Resets`]: how a backend tells the engine that it can no longer vouch for what it
//! granted before, so that `lost()` never lags a second holder.

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use tokio::{sync::Notify, time::Instant};

use super::lost::{instant_at, since_origin};

/// The instants after which a backend can no longer vouch for the grants it made before:
/// its connection to the server was reset, or the server came back as another run (a
/// restart, a failover). A lease granted before such an instant may be gone from the
/// server while its TTL still runs there is no telling, and a second holder may be
/// granted its key the moment the server answers again. So the engine reports every lease
/// granted before a reset lost at once (told early is safe, told late is not), and
/// `acquire` never returns one.
///
/// A backend that can see resets returns its `Resets` from
/// [`Backend::resets`](crate::Backend::resets) and calls [`Resets::reset`] when it sees one.
/// Cheap to clone: clones share the instants.
#[derive(Clone, Debug, Default)]
pub struct Resets {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The last reset, in nanoseconds since the leases' common origin; 0: none yet.
    last: AtomicU64,
    notify: Notify,
}

impl Resets {
    /// No reset yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A reset now: no grant sent before this instant is vouched for any more. `why` is
    /// logged (at `warn`).
    pub fn reset(&self, why: &str) {
        let now = since_origin(Instant::now()).max(1);
        self.inner.last.fetch_max(now, Ordering::AcqRel);
        tracing::warn!(
            reason = why,
            "lock backend reset: leases granted before it are lost"
        );
        self.inner.notify.notify_waiters();
    }

    /// The instant of the last reset, if any.
    pub fn last(&self) -> Option<Instant> {
        match self.inner.last.load(Ordering::Acquire) {
            0 => None,
            nanos => Some(instant_at(nanos)),
        }
    }

    /// Whether a grant whose request was sent at `sent` is still vouched for: no reset
    /// since (a reset at the very same instant counts as after it).
    pub fn vouch_for(&self, sent: Instant) -> bool {
        match self.inner.last.load(Ordering::Acquire) {
            0 => true,
            last => last < since_origin(sent),
        }
    }

    /// The last reset as [`Resets::last`] has it, in the watchdog's units.
    pub(crate) fn last_nanos(&self) -> u64 {
        self.inner.last.load(Ordering::Acquire)
    }

    /// Resolves at the next reset (enable it before reading [`Resets::last_nanos`]).
    pub(crate) fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.inner.notify.notified()
    }
}
