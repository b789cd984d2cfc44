//! A local waiter's entry in the listener's table: the nonce of its latest registration,
//! and where the grant of its ticket goes when a release notifies one.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, atomic::Ordering},
    time::Duration,
};

use tokio::sync::{oneshot, watch};

use super::want::Want;

/// A hand-off as its notification tells it.
#[derive(Clone, Copy, Debug)]
pub(in crate::postgres) struct Handed {
    pub(in crate::postgres) fence: u64,
    /// The lease's expiry the release set, from then: the waiter's claim period, or its TTL
    /// when shorter.
    pub(in crate::postgres) claim: Duration,
}

/// Each local waiter's ticket id: the nonce of its latest registration, and where its
/// grant goes.
pub(super) type Waiters = Mutex<HashMap<String, (String, oneshot::Sender<Handed>)>>;

/// A local waiter's entry: the grant of its ticket, when a release notifies one. Leaves the
/// table when dropped.
pub(in crate::postgres) struct Waiting {
    id: String,
    waiters: Arc<Waiters>,
    want: Arc<Want>,
    listening: watch::Receiver<u64>,
    /// Counted in `want.queued`.
    queued: bool,
    grant: Option<oneshot::Receiver<Handed>>,
}

impl Waiting {
    /// Enter the waiter `id` in `waiters`, on the node whose listening state is
    /// `listening`.
    pub(super) fn enter(
        id: String,
        waiters: &Arc<Waiters>,
        want: &Arc<Want>,
        listening: &watch::Receiver<u64>,
    ) -> Self {
        let (tx, rx) = oneshot::channel();
        waiters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(id.clone(), (String::new(), tx));
        Self {
            id,
            waiters: waiters.clone(),
            want: want.clone(),
            listening: listening.clone(),
            queued: false,
            grant: Some(rx),
        }
    }

    /// The ticket id the waiter registers: `<node>:<random>`, so its grant is notified on
    /// this node's channel.
    pub(in crate::postgres) fn id(&self) -> &str {
        &self.id
    }

    /// The waiter's next attempt registers (or refreshes) its ticket with `nonce`: from now
    /// on only a grant naming it is taken.
    pub(in crate::postgres) fn register(&self, nonce: &str) {
        if let Some((current, _)) = self
            .waiters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get_mut(&self.id)
        {
            nonce.clone_into(current);
        }
    }

    /// Whether the node listens now (a `LISTEN` confirmed): a grant notified from now on
    /// is heard, unless the connection is lost meanwhile.
    pub(in crate::postgres) fn heard(&self) -> bool {
        *self.listening.borrow() != 0
    }

    /// The waiter's ticket is registered: the node listens (from its first queued waiter
    /// on), if it does not already.
    pub(in crate::postgres) fn queued(&mut self) {
        if !self.queued {
            self.queued = true;
            self.want.queued.fetch_add(1, Ordering::SeqCst);
            self.want.wake.notify_one();
        }
    }

    /// What [`until_heard`](super::until_heard) waits on.
    pub(in crate::postgres) fn until_heard_handle(&self) -> watch::Receiver<u64> {
        self.listening.clone()
    }

    /// The grant of this waiter's ticket; pending for ever once the listener has gone (the
    /// fallback timer then decides).
    pub(in crate::postgres) async fn granted(&mut self) -> Handed {
        if let Some(grant) = self.grant.as_mut()
            && let Ok(handed) = grant.await
        {
            return handed;
        }
        self.grant = None;
        std::future::pending().await
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.waiters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&self.id);
        if self.queued && self.want.queued.fetch_sub(1, Ordering::SeqCst) == 1 {
            // The last one: the task starts its linger.
            self.want.wake.notify_one();
        }
    }
}
