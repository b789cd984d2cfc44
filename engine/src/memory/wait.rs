//! The wait of a queued acquisition, a lock's or a permit's: until its grant is handed
//! over, its wait limit passes, or a holder's lease runs out (which may grant it).

use std::{sync::Arc, time::Duration};

use tokio::{
    sync::{Notify, oneshot},
    time::Instant,
};

use crate::{Grant, LockError};

/// A queued waiter's guard: its grant's receiver, taken once the grant is in. Dropping the
/// guard with the receiver still there removes the waiter (or gives back a grant that raced
/// in).
pub(super) trait Queued {
    fn receiver(&mut self) -> &mut Option<oneshot::Receiver<Grant>>;
}

/// What the wait asks of its table, each time it looks.
pub(super) struct Table<E, R> {
    /// Drop the holders whose lease ran out (granting who now fits), and say when the next
    /// lease runs out.
    pub(super) expire: E,
    /// The retry hint of a wait that timed out.
    pub(super) remaining: R,
}

/// Wait for `guard`'s grant. Nobody polls: the grant comes through the guard's channel,
/// and the waiter wakes otherwise only when the earliest holder expiry passes (to expire
/// it, which may grant the queue), when `changed` says that expiry moved, or at its
/// deadline.
pub(super) async fn for_grant<G: Queued>(
    mut guard: G,
    changed: Arc<Notify>,
    started: Instant,
    wait: Option<Duration>,
    mut table: Table<impl FnMut() -> Option<Instant>, impl FnOnce() -> Option<Duration>>,
) -> Result<Grant, LockError> {
    // A wait too long for the clock is a wait without limit.
    let deadline = wait.and_then(|w| started.checked_add(w));
    loop {
        // Listening before the expiry is read, so a change in between is not missed.
        let notified = changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let next_expiry = (table.expire)();
        let rx = guard
            .receiver()
            .as_mut()
            .expect("receiver present while waiting");
        tokio::select! {
            biased;
            granted = rx => {
                *guard.receiver() = None;
                // The sender is only dropped after a send or by our own guard.
                return granted.map_err(|_| LockError::Expired);
            }
            _ = &mut notified => {}
            _ = sleep_until_opt(next_expiry) => {}
            _ = sleep_until_opt(deadline) => {
                let retry_after = (table.remaining)();
                // Dropping the guard removes us (or passes on a grant that raced in).
                drop(guard);
                return Err(LockError::TimedOut { waited: started.elapsed(), retry_after });
            }
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
