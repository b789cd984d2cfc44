//! [`LeaseState`]: what the watchdog and a [`Lease`](super::Lease) share about one live
//! lease, and when it is next renewed.

use std::{
    sync::{
        Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::time::Instant;

use crate::{LockKey, MAX_TTL, Mode, Token, lost::Lost};

pub(crate) fn renew_interval(ttl: Duration) -> Duration {
    ttl / 3
}

/// What the watchdog and the [`Lease`] share about one live lease.
pub(crate) struct LeaseState {
    /// How it holds the key: the key's lock, or one of its shared leases.
    pub(crate) mode: Mode,
    pub(crate) key: LockKey,
    pub(crate) token: Token,
    /// Lease length used by renewals, in nanoseconds (extend may change it).
    pub(crate) ttl_nanos: AtomicU64,
    /// The lease length it was acquired with; `reacquire` resets to it.
    pub(crate) configured_ttl: Duration,
    pub(crate) auto_renew: bool,
    pub(crate) lost: Lost,
    /// Set when a release begins: from then on a renewal that finds the key gone is that
    /// release, not a lost lease.
    pub(crate) released: AtomicBool,
    /// Set when the watchdog files the lease (moves it from its incoming list to its
    /// schedule): only then does a release have to take it off the schedule.
    pub(crate) filed: AtomicBool,
    /// Bumped when an extend begins. A renewal sent under an older epoch may have landed
    /// before or after the extend; it renews the lease but does not move its deadline.
    pub(crate) epoch: AtomicU64,
    /// When the request that was granted was sent: a backend reset after it (see
    /// [`Resets`](crate::Resets)) loses the lease.
    pub(crate) granted_at: Instant,
    /// The backend's resets, read by [`is_lost_at`](Self::is_lost_at) itself: a reset is
    /// seen the moment the backend reports it, not once the watchdog (a task on the
    /// engine's runtime, which a busy node may run after another node was granted the key)
    /// has marked the lease.
    pub(crate) resets: Option<crate::Resets>,
    /// The backend's [`Grant::slot`] of the key, which its release is handed.
    pub(crate) slot: Option<u64>,
    pub(crate) times: Mutex<LeaseTimes>,
}

#[derive(Clone, Copy)]
pub(crate) struct LeaseTimes {
    /// Past this instant the backend may have expired the lease. Only ever an instant the
    /// backend confirmed: a send time plus a TTL the backend acknowledged.
    pub(crate) deadline: Instant,
    /// When the next renewal is due (`None` while one is in flight, or without auto-renew).
    pub(crate) renew_at: Option<Instant>,
}

impl LeaseTimes {
    /// When the watchdog must next look at the lease: its renewal, or its deadline.
    pub(crate) fn due(&self) -> Instant {
        self.renew_at
            .map_or(self.deadline, |r| r.min(self.deadline))
    }
}

impl LeaseState {
    pub(crate) fn ttl(&self) -> Duration {
        Duration::from_nanos(self.ttl_nanos.load(Ordering::Relaxed))
    }

    pub(crate) fn set_ttl(&self, ttl: Duration) {
        let nanos = u64::try_from(ttl.min(MAX_TTL).as_nanos()).unwrap_or(u64::MAX);
        self.ttl_nanos.store(nanos, Ordering::Relaxed);
    }

    pub(crate) fn is_released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }

    /// Lost as of `now`: marked lost, or, until it is released, past its validity deadline
    /// or granted before a reset its backend reported. (A lease lost by then when its
    /// release began was marked so, see [`set_released`](Self::set_released).)
    pub(crate) fn is_lost_at(&self, now: Instant) -> bool {
        self.lost.set.load(Ordering::Acquire)
            || (!self.is_released() && (self.lost.is_set_at(now) || self.unvouched()))
    }

    fn unvouched(&self) -> bool {
        self.resets.as_ref().is_some_and(|r| {
            !r.vouch_for(self.granted_at) || r.is_revoked(&self.key, &self.token, self.granted_at)
        })
    }

    /// Its release begins as of `now`: a lease lost by then stays lost (it is marked so,
    /// before the flag is set); one valid then is never lost afterwards, not by a deadline
    /// it will not be renewed past, nor by a later reset.
    pub(crate) fn set_released(&self, now: Instant, order: Ordering) {
        if !self.is_released() && (self.lost.is_set_at(now) || self.unvouched()) {
            self.lost.set();
        }
        self.released.store(true, order);
    }

    /// Until the lease is lost (see [`is_lost_at`](Self::is_lost_at)).
    pub(crate) async fn wait_lost(&self) {
        // A released lease listens for no reset: it can no longer be lost by one.
        let resets = self.resets.as_ref().filter(|_| !self.is_released());
        self.lost
            .wait_until(resets, || self.is_lost_at(Instant::now()))
            .await;
    }

    pub(crate) fn mark_lost(&self, why: &'static str) {
        if self.is_released() {
            return;
        }
        if !self.lost.set.load(Ordering::Acquire) {
            tracing::warn!(key = %self.key, reason = why, "lease lost");
            self.lost.set();
        }
    }

    /// Move the validity deadline (an instant the backend confirmed). Once a deadline has
    /// passed, the lease stays lost: a confirmation arriving after it changes nothing.
    pub(crate) fn set_deadline(&self, t: &mut LeaseTimes, deadline: Instant) {
        if self.lost.is_set() {
            return;
        }
        t.deadline = deadline;
        self.lost.valid_until(deadline);
    }
}
