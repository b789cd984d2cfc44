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
//! sees them, whatever connections they take. The in-process backend handed to
//! `LockEngine::new` releases on the spot and never registers here; reached through the
//! `Backend` trait (a wrapper, `LockEngine::from_arc`), it registers like any other.
//!
//! A waiting FIFO acquire also takes its place here as it is called, and its first attempt
//! goes once the releases and first attempts of its key called before it have been
//! answered (see [`AcquireRequest::leave_line`](crate::AcquireRequest::leave_line)): the
//! queue takes this node's waiters in the order they called (FIFO), not in the order their
//! connections happened to reach the server, and an acquire that waits for a release to
//! land is not passed by one called after it.

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
            Self::of(&shard, key)
        };
        all_landed(pending).await;
    }

    /// A call of `key` that must reach the backend after the ones of `key` in flight now,
    /// and before any begun after this: the returned guard is its place (in flight until
    /// dropped), and the future, once it resolves, lets the call go (all the earlier ones
    /// answered, at most [`RELEASE_WAIT`]). Both happen in one step, so two calls made one
    /// after the other on this engine reach the backend in that order, whatever connections
    /// they take: a pool of connections would otherwise let a later waiter's ticket in first.
    pub(crate) fn line_up(
        self: &Arc<Self>,
        key: &LockKey,
    ) -> (impl Future<Output = ()> + use<>, InFlight) {
        let ending = Arc::new(Ending::default());
        let earlier = {
            let mut shard = self.shard(key).lock().unwrap();
            let earlier = Self::of(&shard, key);
            shard.push((key.clone(), ending.clone()));
            earlier
        };
        let place = InFlight {
            releasing: self.clone(),
            key: key.clone(),
            ending,
        };
        (all_landed(earlier), place)
    }

    /// The calls of `key` in flight in `shard`.
    fn of(shard: &[(LockKey, Arc<Ending>)], key: &LockKey) -> Vec<Arc<Ending>> {
        shard
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, e)| e.clone())
            .collect()
    }
}

/// An acquire's place in its key's line (see [`Releasing::line_up`]), carried by its
/// request to the backend: held until the backend has queued it ([`Line::leave`], see
/// [`AcquireRequest::leave_line`](crate::AcquireRequest::leave_line)), or the acquire ended.
#[derive(Clone, Default)]
pub(crate) struct Line(Option<Arc<Mutex<Option<InFlight>>>>);

impl Line {
    /// Holding `place`.
    pub(crate) fn holding(place: InFlight) -> Self {
        Self(Some(Arc::new(Mutex::new(Some(place)))))
    }

    /// Give the place up: the calls lined up behind it may go.
    pub(crate) fn leave(&self) {
        if let Some(place) = &self.0 {
            drop(place.lock().unwrap().take());
        }
    }
}

impl std::fmt::Debug for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let held = self.0.as_ref().is_some_and(|p| p.lock().unwrap().is_some());
        f.debug_tuple("Line").field(&held).finish()
    }
}

/// Until every one of `pending` has landed, at most [`RELEASE_WAIT`].
async fn all_landed(pending: Vec<Arc<Ending>>) {
    if pending.is_empty() {
        return;
    }
    let all = async {
        for ending in pending {
            ending.wait().await;
        }
    };
    // On the engine's timers if the caller's runtime has none (the timer is made at the
    // first poll, inside that runtime's context).
    let waited = async move {
        let _ = tokio::time::timeout(RELEASE_WAIT, all).await;
    };
    crate::runtime::with_drivers(Box::pin(waited)).await;
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

    #[tokio::test(start_paused = true)]
    async fn a_call_lined_up_goes_after_the_calls_of_its_key_begun_before_it() {
        let releasing = Arc::new(Releasing::default());
        let (a, b) = (LockKey::new("a").unwrap(), LockKey::new("b").unwrap());
        let release = releasing.begin(&a);
        let (first_goes, first) = releasing.line_up(&a);
        let (second_goes, second) = releasing.line_up(&a);
        // Another key's line is its own.
        let (other_goes, _other) = releasing.line_up(&b);
        other_goes.await;
        let (first_goes, second_goes) = (tokio::spawn(first_goes), tokio::spawn(second_goes));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!first_goes.is_finished() && !second_goes.is_finished());
        // The release answered: the first goes, the second still waits for the first.
        drop(release);
        first_goes.await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!second_goes.is_finished());
        drop(first);
        second_goes.await.unwrap();
        // A place left through its line: the next one goes at once.
        let line = Line::holding(second);
        let (third_goes, _third) = releasing.line_up(&a);
        line.leave();
        let started = tokio::time::Instant::now();
        third_goes.await;
        assert_eq!(started.elapsed(), Duration::ZERO);
    }
}
