//! [`Resets`]: how a backend tells the engine that it can no longer vouch for what it
//! granted before, so that `lost()` never lags a second holder.

use std::{
    collections::VecDeque,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use tokio::{sync::Notify, time::Instant};

use super::{
    LockKey, Token,
    lost::{instant_at, since_origin},
};

/// How many revocations are remembered (the newest): an admin's force releases are rare,
/// and a lease is looked up in them only while one is remembered.
const REVOCATIONS: usize = 256;

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
    /// How many revocations were ever reported (0: none, and no lease looks further).
    revoked: AtomicU64,
    /// The newest revocations: key, token, and when (nanoseconds since the origin).
    revocations: Mutex<VecDeque<(LockKey, Token, u64)>>,
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

    /// An admin force-releases `key` from `token`'s lease (see
    /// [`LockAdmin::force_release`](crate::LockAdmin::force_release)): that lease, if
    /// granted before now, is lost at once, before the backend grants the key to anyone
    /// else where it can order the two, and the engine holding it gives the key back (the
    /// release that hands it to the next waiter). Logged at `warn`.
    pub fn revoke(&self, key: &LockKey, token: &Token) {
        let now = since_origin(Instant::now()).max(1);
        {
            let mut revocations = self.inner.revocations.lock().unwrap();
            if revocations.len() == REVOCATIONS {
                revocations.pop_front();
            }
            revocations.push_back((key.clone(), token.clone(), now));
        }
        self.inner.revoked.fetch_add(1, Ordering::AcqRel);
        tracing::warn!(%key, "lease force-released by an admin: lost");
        self.inner.notify.notify_waiters();
    }

    /// Whether `token`'s lease of `key`, granted at `granted_at`, was revoked since.
    pub(crate) fn is_revoked(&self, key: &LockKey, token: &Token, granted_at: Instant) -> bool {
        if self.inner.revoked.load(Ordering::Acquire) == 0 {
            return false;
        }
        let granted = since_origin(granted_at);
        self.inner
            .revocations
            .lock()
            .unwrap()
            .iter()
            .any(|(k, t, at)| *at >= granted && k == key && t == token)
    }

    /// How many revocations were reported so far.
    pub(crate) fn revocations(&self) -> u64 {
        self.inner.revoked.load(Ordering::Acquire)
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

#[cfg(test)]
mod tests {
    use std::{future::Future, time::Duration};

    use super::*;
    use crate::{LockEngine, altered::Altered};

    /// A lease reads lost the instant its backend reports the reset, before the watchdog
    /// (a task on the engine's runtime) has run: on a busy node that task may run only after
    /// another node has been granted the key, and `lost()` must not lag it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lease_reads_lost_the_instant_its_backend_reports_a_reset() {
        let resets = Resets::new();
        let engine = LockEngine::new(Altered {
            resets: Some(resets.clone()),
            ..Altered::default()
        });
        for round in 0..200 {
            let lease = engine
                .lock(format!("k{round}"))
                .ttl(Duration::from_secs(30))
                .acquire()
                .await
                .unwrap();
            let signal = lease.lost_signal();
            assert!(!signal.is_lost());
            resets.reset("test");
            // No await in between: nothing else has had a chance to run.
            assert!(signal.is_lost(), "round {round}: lost at the reset");
            assert!(lease.is_lost(), "round {round}: lost at the reset");
            // Without a hop either: `lost()` is ready at its first poll.
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            assert!(
                std::pin::pin!(signal.lost()).poll(&mut cx).is_ready(),
                "round {round}: lost() resolves at once"
            );
        }
        // A lease released before a reset was not lost by it.
        let lease = engine.lock("released").acquire().await.unwrap();
        let signal = lease.lost_signal();
        lease.release().await.unwrap();
        resets.reset("test");
        assert!(!signal.is_lost(), "released before the reset");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reset_loses_every_lease_granted_before_it_at_once_and_no_later_one() {
        let resets = Resets::new();
        let engine = LockEngine::new(Altered {
            resets: Some(resets.clone()),
            ..Altered::default()
        });
        let ttl = Duration::from_secs(30);
        let before = [
            engine.lock("a").ttl(ttl).acquire().await.unwrap(),
            engine
                .lock("b")
                .ttl(ttl)
                .auto_renew(false)
                .acquire()
                .await
                .unwrap(),
        ];
        assert!(before.iter().all(|l| !l.is_lost()));

        resets.reset("test");
        for lease in &before {
            tokio::time::timeout(Duration::from_secs(1), lease.lost())
                .await
                .expect("a lease granted before a reset is lost at once");
        }
        let after = engine.lock("c").ttl(ttl).acquire().await.unwrap();
        assert!(!after.is_lost(), "granted after the reset");
        assert!(resets.last().is_some_and(|r| r < Instant::now()));
        assert!(!resets.vouch_for(Instant::now() - Duration::from_secs(1)));
        assert!(resets.vouch_for(Instant::now()));
    }
}
