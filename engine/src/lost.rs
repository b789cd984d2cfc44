//! [`LostSignal`]: how a holder learns that its lease is gone.

use std::{
    fmt,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::{sync::Notify, time::Instant};

use super::{
    LockKey, Mode, Resets, Token,
    lease::{LeaseState, LeaseTimes},
};

/// Resolves when a lease is lost: renewal failed or found the key gone, or the local
/// validity deadline passed without a confirmed renewal. Cheap to clone; a handler can
/// `select!` on it to stop work that is no longer protected.
///
/// It shares the lease's state (one allocation per lease, not a second one for the flag).
#[derive(Clone)]
pub struct LostSignal(pub(super) Arc<LeaseState>);

impl fmt::Debug for LostSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LostSignal")
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl LostSignal {
    /// Wait until the lease is lost. Never resolves for a lease that is released normally.
    pub async fn lost(&self) {
        self.0.wait_lost().await
    }

    /// `true` once the lease is lost.
    pub fn is_lost(&self) -> bool {
        self.0.is_lost_at(Instant::now())
    }

    /// The key of the lease this signal is about (the signal shares the lease's state:
    /// a holder of the signal needs no copy of its own).
    pub fn key(&self) -> &LockKey {
        &self.0.key
    }

    /// A signal about no lease at all, on `key`: it never fires. For a holder that runs
    /// without a lease but is handed the same interface as one that has one (a layer's dry
    /// run, whose requests run whether or not they got the key).
    pub fn never(key: LockKey) -> Self {
        // The state of no lease: no deadline, no resets to listen for, no watchdog that
        // knows it, so it is never lost.
        let now = Instant::now();
        Self(Arc::new(LeaseState {
            mode: Mode::Exclusive,
            key,
            token: Token::random_local(),
            ttl_nanos: AtomicU64::new(0),
            configured_ttl: Duration::ZERO,
            auto_renew: false,
            lost: Lost::default(),
            released: AtomicBool::new(false),
            filed: AtomicBool::new(false),
            epoch: AtomicU64::new(0),
            granted_at: now,
            resets: None,
            slot: None,
            times: Mutex::new(LeaseTimes {
                deadline: now,
                renew_at: None,
            }),
        }))
    }

    /// [`is_lost`](Self::is_lost) as of `now`, an instant the caller has just read: one
    /// clock read then serves this and the caller's own timing.
    pub fn is_lost_at(&self, now: Instant) -> bool {
        self.0.is_lost_at(now)
    }
}

/// A one-way flag with waiters, inside the lease's state. Every request clones a handle on
/// it (into its `LeaseInfo`), so that handle is a plain reference count.
///
/// It also knows the lease's validity deadline, so that [`Lost::is_set`] is exact at any
/// instant, not only once the watchdog's timer has fired: a fenced write checked against
/// it cannot slip in between the deadline and the watchdog's wake-up.
#[derive(Debug)]
pub(super) struct Lost {
    pub(super) set: AtomicBool,
    /// The validity deadline, in nanoseconds since [`origin`]; `u64::MAX`: none.
    deadline: AtomicU64,
    notify: Notify,
}

impl Default for Lost {
    fn default() -> Self {
        Self {
            set: AtomicBool::new(false),
            deadline: AtomicU64::new(u64::MAX),
            notify: Notify::new(),
        }
    }
}

/// The origin of [`Lost::deadline`]: some instant before any lease.
fn origin() -> Instant {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

/// `at`, in nanoseconds since [`origin`] (0 for any instant before it).
pub(super) fn since_origin(at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(origin()).as_nanos()).unwrap_or(u64::MAX)
}

/// The instant `nanos` after [`origin`].
pub(super) fn instant_at(nanos: u64) -> Instant {
    origin() + std::time::Duration::from_nanos(nanos)
}

impl Lost {
    pub(super) fn is_set(&self) -> bool {
        self.is_set_at(Instant::now())
    }

    pub(super) fn is_set_at(&self, now: Instant) -> bool {
        self.set.load(Ordering::Acquire)
            || since_origin(now) >= self.deadline.load(Ordering::Acquire)
    }

    pub(super) fn valid_until(&self, deadline: Instant) {
        self.deadline
            .store(since_origin(deadline), Ordering::Release);
    }

    pub(super) fn set(&self) {
        self.set.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }

    /// Until `lost` holds, read again at every `set` and every reset of `resets`.
    pub(super) async fn wait_until(&self, resets: Option<&Resets>, lost: impl Fn() -> bool) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            // Registered before `lost` is read, so a `set` or a reset in between is not
            // missed.
            notified.as_mut().enable();
            let mut reset = std::pin::pin!(resets.map(Resets::notified));
            if let Some(reset) = reset.as_mut().as_pin_mut() {
                reset.enable();
            }
            if lost() {
                return;
            }
            let reset = async {
                match reset.as_mut().as_pin_mut() {
                    Some(reset) => reset.await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = &mut notified => {}
                () = reset => {}
            }
        }
    }
}
