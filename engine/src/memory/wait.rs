//! The wait of a queued acquisition, in either mode: until its grant is handed over, its
//! wait limit passes, or a holder's lease runs out (which may grant it); and the guard
//! that cleans up after a wait that ends without its grant.

use std::{sync::Arc, time::Duration};

use tokio::{
    sync::{Notify, oneshot},
    time::Instant,
};

use super::MemoryBackend;
use crate::{Grant, LockError, LockKey, Token};

/// Removes a waiter whose acquire future is dropped, or gives back a grant it never saw;
/// either way the waiters that now fit are granted.
pub(super) struct WaitGuard<'a> {
    pub(super) backend: &'a MemoryBackend,
    pub(super) key: &'a LockKey,
    pub(super) token: &'a Token,
    pub(super) id: u64,
    pub(super) rx: Option<oneshot::Receiver<Grant>>,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        let mut shard = self.backend.keys.shard(self.key);
        let now = Instant::now();
        if let Some(entry) = shard.get_mut(self.key) {
            entry.expire(now, self.backend);
            let waiters = &mut entry.queue.waiters;
            if let Some(pos) = waiters.iter().position(|w| w.id == self.id) {
                waiters.remove(pos);
            } else if let Ok(grant) = rx.try_recv() {
                // Granted before we got here. Give it back only if that grant still holds:
                // it may have run out, or been forced free, and the key passed on to
                // someone else whom we must not touch.
                entry.give_back(self.token, grant.fence.get(), now, self.backend);
            }
            // The one who left may have been the head that did not fit.
            entry.grant_waiters(now, self.backend);
        }
        shard.remove_if_empty(self.key);
    }
}

impl WaitGuard<'_> {
    /// Wait for the grant. Nobody polls: the grant comes through the channel, and the
    /// waiter wakes otherwise only when the earliest holder expiry passes (to expire it,
    /// which may grant the queue), when `changed` says that expiry moved, or at its
    /// deadline.
    pub(super) async fn for_grant(
        mut self,
        changed: Arc<Notify>,
        started: Instant,
        wait: Option<Duration>,
    ) -> Result<Grant, LockError> {
        // A wait too long for the clock is a wait without limit.
        let deadline = wait.and_then(|w| started.checked_add(w));
        loop {
            // Listening before the expiry is read, so a change in between is not missed.
            let notified = changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let next_expiry = self.expire();
            let rx = self.rx.as_mut().expect("receiver present while waiting");
            tokio::select! {
                biased;
                granted = rx => {
                    self.rx = None;
                    // The sender is only dropped after a send or by our own guard.
                    return granted.map_err(|_| LockError::Expired);
                }
                _ = &mut notified => {}
                _ = sleep_until_opt(next_expiry) => {}
                _ = sleep_until_opt(deadline) => {
                    let retry_after = self.remaining();
                    // Dropping the guard removes us (or passes on a grant that raced in).
                    drop(self);
                    return Err(LockError::TimedOut { waited: started.elapsed(), retry_after });
                }
            }
        }
    }

    /// Drop the holders whose lease ran out (granting who now fits); when the next lease
    /// runs out.
    fn expire(&self) -> Option<Instant> {
        let mut shard = self.backend.keys.shard(self.key);
        shard.get_mut(self.key).and_then(|entry| {
            entry.expire(Instant::now(), self.backend);
            entry.earliest()
        })
    }

    /// The retry hint of a wait that timed out.
    fn remaining(&self) -> Option<Duration> {
        let shard = self.backend.keys.shard(self.key);
        shard
            .get(self.key)
            .and_then(|e| e.remaining(Instant::now()))
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
