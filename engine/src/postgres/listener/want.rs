//! What the listening task is asked for: whether this node must listen now (one of its
//! waiters queues, or it holds a lease an admin's revocation must reach), and a wake-up
//! when that changes.

use std::{
    collections::HashSet,
    sync::{
        Mutex, MutexGuard,
        atomic::{AtomicUsize, Ordering},
    },
};

use tokio::sync::Notify;

use crate::{LockKey, Token};

/// How many local waiters have queued, the leases this node holds (a [`lease_hash`]
/// each), and the task's wake-up.
#[derive(Default)]
pub(super) struct Want {
    pub(super) queued: AtomicUsize,
    held: Mutex<HashSet<u64>>,
    pub(super) wake: Notify,
}

/// A lease's entry in [`Want`]'s held set: no allocation per acquire.
pub(in crate::postgres) fn lease_hash(key: &LockKey, token: &Token) -> u64 {
    use std::hash::BuildHasher;
    std::hash::BuildHasherDefault::<std::hash::DefaultHasher>::default()
        .hash_one((key.as_str(), token.as_str()))
}

impl Want {
    fn held(&self) -> MutexGuard<'_, HashSet<u64>> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether the node must listen: a waiter queues or a lease is held.
    pub(super) fn listen(&self) -> bool {
        self.queued.load(Ordering::SeqCst) > 0 || !self.held().is_empty()
    }

    /// A lease is held (granted, or granted again); the task is woken by the first.
    pub(super) fn hold(&self, lease: u64) {
        let first = {
            let mut held = self.held();
            held.insert(lease) && held.len() == 1
        };
        if first {
            self.wake.notify_one();
        }
    }

    /// A lease was released (or its release attempted); the task is woken by the last.
    pub(super) fn let_go(&self, lease: u64) {
        let last = {
            let mut held = self.held();
            held.remove(&lease) && held.is_empty()
        };
        if last {
            self.wake.notify_one();
        }
    }
}
