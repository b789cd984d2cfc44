//! [`LockOptions`]: how a lock is acquired and how long a lease lasts.

use std::time::Duration;

use tokio::time::Instant;

#[allow(unused_imports)] // for rustdoc links
use super::{Lease, Lock, LockError};

/// The longest lease accepted (365 days): a longer TTL, or an extension past it, is
/// [`LockError::InvalidValue`]. Longer waits need no limit: they are waits without one.
pub const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// The shortest lease (10 ms): [`LockOptions::ttl`] rounds a shorter TTL up to it.
///
/// A lease is trusted for its TTL less a millisecond (a server that counts whole
/// milliseconds may start its expiry that much before the command was sent; see
/// [`Lease::valid_until`]): a TTL of a millisecond or two would leave a grant nothing, or
/// next to nothing, to be valid for, and a waiter handed the key would find it run out
/// before its task could return it.
pub const MIN_TTL: Duration = Duration::from_millis(10);

/// How [`Lease::extend`]-style operations change a lease's remaining time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExtendMode {
    /// Add the duration to the remaining TTL.
    Add,
    /// Replace the remaining TTL with the duration.
    Replace,
}

/// Options for acquiring a lock. Every field has a default; see each setter (and its
/// getter, for code that reads options it was given).
///
/// ```
/// use std::time::Duration;
/// use tower_lock_engine::LockOptions;
///
/// let options = LockOptions::new().ttl(Duration::from_secs(10)).fifo(true);
/// assert_eq!(options.lease_ttl(), Duration::from_secs(10));
/// assert!(options.is_fifo() && options.wait_limit().is_none());
/// ```
#[derive(Clone, Debug)]
pub struct LockOptions {
    pub(crate) ttl: Duration,
    pub(crate) wait: Option<Duration>,
    pub(crate) fifo: bool,
    pub(crate) max_waiters: Option<usize>,
    pub(crate) auto_renew: bool,
}

impl Default for LockOptions {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(30),
            wait: None,
            fifo: false,
            max_waiters: None,
            auto_renew: true,
        }
    }
}

impl LockOptions {
    /// The defaults: TTL 30 s, wait without limit, not FIFO, no waiter limit, auto-renew on.
    pub fn new() -> Self {
        Self::default()
    }

    /// The lease length. The watchdog renews a live lease at a third of it. A TTL under
    /// [`MIN_TTL`] (10 ms, `Duration::ZERO` included) is rounded up to it; more than
    /// [`MAX_TTL`] makes acquisition fail with [`LockError::InvalidValue`].
    #[inline]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl.max(MIN_TTL);
        self
    }

    /// How long [`Lock::acquire`] waits for a held key; `Duration::ZERO` makes it
    /// non-blocking. Default: no limit (and so is a wait too long for the clock, such as
    /// `Duration::MAX`).
    #[inline]
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Wait without a limit (the default).
    pub fn wait_forever(mut self) -> Self {
        self.wait = None;
        self
    }

    /// Grant the key strictly in arrival order (across all nodes on Redis). Default: off.
    #[inline]
    pub fn fifo(mut self, fifo: bool) -> Self {
        self.fifo = fifo;
        self
    }

    /// At most this many waiters per key; more get [`LockError::QueueFull`]. Default: none.
    #[inline]
    pub fn max_waiters(mut self, max: usize) -> Self {
        self.max_waiters = Some(max);
        self
    }

    /// Renew the lease in the background while its [`Lease`] lives. Default: on.
    #[inline]
    pub fn auto_renew(mut self, on: bool) -> Self {
        self.auto_renew = on;
        self
    }

    /// The lease length (see [`ttl`](Self::ttl)).
    pub fn lease_ttl(&self) -> Duration {
        self.ttl
    }

    /// How long an acquire waits for a held key; `None`: without a limit (see
    /// [`wait`](Self::wait)).
    pub fn wait_limit(&self) -> Option<Duration> {
        self.wait
    }

    /// Whether the key is granted in arrival order (see [`fifo`](Self::fifo)).
    pub fn is_fifo(&self) -> bool {
        self.fifo
    }

    /// The most waiters per key, if limited (see [`max_waiters`](Self::max_waiters)).
    pub fn waiter_limit(&self) -> Option<usize> {
        self.max_waiters
    }

    /// Whether a live lease is renewed in the background (see
    /// [`auto_renew`](Self::auto_renew)).
    pub fn renews(&self) -> bool {
        self.auto_renew
    }
}

/// A TTL the engine accepts: at most [`MAX_TTL`].
pub(crate) fn check_ttl(ttl: Duration) -> Result<(), LockError> {
    if ttl > MAX_TTL {
        return Err(LockError::InvalidValue(
            "a lease TTL may be at most MAX_TTL (365 days)",
        ));
    }
    Ok(())
}

/// How early a backend's expiry may start before the command that set it was sent: Redis
/// counts time in whole milliseconds, so a command it runs at 10.7 ms sets an expiry
/// counted from 10 ms.
const CLOCK_STEP: Duration = Duration::from_millis(1);

/// The latest a lease can be trusted when a command sent at `sent` set its expiry `ttl`
/// later on the backend: one [`CLOCK_STEP`] short of `sent + ttl`, so never later than the
/// backend's own expiry whatever the backend's clock resolution (up to a millisecond).
pub(crate) fn expires_by(sent: Instant, ttl: Duration) -> Instant {
    let at = after(sent, ttl);
    at.checked_sub(CLOCK_STEP).unwrap_or(at).max(sent)
}

/// `at + d`, or a century later when that is past what the clock can represent.
pub(crate) fn after(at: Instant, d: Duration) -> Instant {
    at.checked_add(d)
        .or_else(|| at.checked_add(Duration::from_secs(100 * 365 * 24 * 60 * 60)))
        .unwrap_or(at)
}
