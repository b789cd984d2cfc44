//! [`Releasing`]: the releases this engine has begun and its backend has not answered yet,
//! by key, so that an acquire of one of those keys from this engine first lets them land.
//!
//! A release begun as a response ends (the lease dropped, or completed with its record)
//! goes out at once, but on a network backend it can take another connection than the
//! next acquire from the same node: a client that read its whole response and at once
//! asks again could reach the server before its own release did and find its own lease
//! (a `423`, or an idempotent retry told `409` instead of getting the replay). An acquire
//! that finds its key here waits for that release's answer first, at most
//! [`RELEASE_WAIT`]: the order the node's own calls were made in is the order the backend
//! sees them, whatever connections they take. The in-process backend releases on the spot
//! and never registers here.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use tokio::sync::Notify;

use crate::LockKey;

/// How long an acquire waits for this engine's own release of its key before it goes
/// ahead anyway (a release stuck on a stalled server must not stall acquires past it).
pub(crate) const RELEASE_WAIT: Duration = Duration::from_secs(1);

/// Shards of the table: a release and an acquire of different keys rarely share a lock.
const SHARDS: usize = 16;

/// The releases in flight of the keys that hash to one shard.
type Shard = Mutex<Vec<(LockKey, Arc<Ending>)>>;

/// The releases in flight, by key.
pub(crate) struct Releasing {
    shards: [Shard; SHARDS],
}

/// One release in flight: done once its backend call returned (or was given up).
#[derive(Default)]
struct Ending {
    done: AtomicBool,
    notify: Notify,
}

/// Registers one release until dropped (when the release's call has returned).
pub(crate) struct InFlight {
    releasing: Arc<Releasing>,
    key: LockKey,
    ending: Arc<Ending>,
}

impl Default for Releasing {
    fn default() -> Self {
        Self {
            shards: std::array::from_fn(|_| Mutex::new(Vec::new())),
        }
    }
}

impl Releasing {
    fn shard(&self, key: &LockKey) -> &Shard {
        use std::hash::BuildHasher;
        let hash = std::hash::BuildHasherDefault::<std::hash::DefaultHasher>::default()
            .hash_one(key.as_str());
        &self.shards[(hash % SHARDS as u64) as usize]
    }

    /// A release of `key` begins now; it is in flight until the returned guard drops.
    pub(crate) fn begin(self: &Arc<Self>, key: &LockKey) -> InFlight {
        let ending = Arc::new(Ending::default());
        self.shard(key)
            .lock()
            .unwrap()
            .push((key.clone(), ending.clone()));
        InFlight {
            releasing: self.clone(),
            key: key.clone(),
            ending,
        }
    }

    /// Until this engine's releases of `key` begun before this call have been answered,
    /// at most [`RELEASE_WAIT`].
    pub(crate) async fn landed(&self, key: &LockKey) {
        let pending: Vec<Arc<Ending>> = {
            let shard = self.shard(key).lock().unwrap();
            if shard.is_empty() {
                return;
            }
            shard
                .iter()
                .filter(|(k, _)| k == key)
                .map(|(_, e)| e.clone())
                .collect()
        };
        if pending.is_empty() {
            return;
        }
        let all = async {
            for ending in pending {
                ending.wait().await;
            }
        };
        let _ = tokio::time::timeout(RELEASE_WAIT, all).await;
    }
}

impl Ending {
    async fn wait(&self) {
        let notified = self.notify.notified();
        let mut notified = std::pin::pin!(notified);
        notified.as_mut().enable();
        if self.done.load(Ordering::Acquire) {
            return;
        }
        notified.await;
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.releasing
            .shard(&self.key)
            .lock()
            .unwrap()
            .retain(|(_, e)| !Arc::ptr_eq(e, &self.ending));
        self.ending.done.store(true, Ordering::Release);
        self.ending.notify.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_acquire_waits_for_the_release_of_its_key_and_no_longer_than_the_bound() {
        let releasing = Arc::new(Releasing::default());
        let (a, b) = (LockKey::new("a").unwrap(), LockKey::new("b").unwrap());
        // Nothing in flight: at once.
        releasing.landed(&a).await;
        let in_flight = releasing.begin(&a);
        // Another key: at once.
        releasing.landed(&b).await;
        let waiter = {
            let releasing = releasing.clone();
            let a = a.clone();
            tokio::spawn(async move { releasing.landed(&a).await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!waiter.is_finished());
        drop(in_flight);
        waiter.await.unwrap();
        // A release that never answers holds an acquire back for the bound only.
        let _stuck = releasing.begin(&a);
        let started = tokio::time::Instant::now();
        releasing.landed(&a).await;
        assert_eq!(started.elapsed(), RELEASE_WAIT);
    }
}
