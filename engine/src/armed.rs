//! One timer kept armed on each runtime that makes the engine's calls, so that the timeout
//! a call arms never has to wake a worker parked in that runtime's driver.
//!
//! tokio wakes the worker parked in a runtime's driver (an `eventfd` write, and that
//! worker's round through `epoll_wait`) whenever a timer is armed earlier than the
//! driver's next planned wake-up, and a driver with no timer at all plans none. On a
//! runtime at rest between calls, every call's timeout cost one such cross-thread wake-up:
//! two per uncontended acquire on Redis (the engine's timeout and redis-rs's response
//! timeout), and on Postgres one on the caller's runtime and one on the engine's.
//!
//! The keeper of a runtime is a task of that runtime that sleeps one call timeout at a
//! time, re-armed as it ends, while calls are made. Its deadline is never later than that
//! of a call made after it was armed (every call's deadline is at least one call timeout
//! away), so while it is armed no call's timeout moves the driver's wake-up earlier. A
//! runtime that made no call for a whole period keeps no timer until its next call (which
//! pays the one wake-up). The task goes with its runtime.

use std::{
    cell::RefCell,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::{
    runtime::{Handle, Id},
    sync::Notify,
};

/// The shortest period a keeper sleeps: a call timeout shorter than this (none is, by
/// default) costs its wake-up as before rather than a keeper that wakes too often.
const MIN_PERIOD: Duration = Duration::from_millis(10);

/// Every runtime's keeper, by runtime.
static KEEPERS: Mutex<Vec<(Id, Arc<Keeper>)>> = Mutex::new(Vec::new());

thread_local! {
    /// The runtime this thread last made a call on, and its keeper: a runtime's own
    /// workers find theirs without taking the lock.
    static LAST: RefCell<Option<(Id, Arc<Keeper>)>> = const { RefCell::new(None) };
}

/// A call with a timeout of `timeout` is about to arm it on the current runtime (if any):
/// keep that runtime's timer armed.
pub(crate) fn call_with_timeout(timeout: Duration) {
    if timeout < MIN_PERIOD {
        return;
    }
    let Ok(handle) = Handle::try_current() else {
        return;
    };
    let runtime = handle.id();
    let cached = LAST.with(|last| match &*last.borrow() {
        Some((id, keeper)) if *id == runtime => {
            keeper.used(timeout);
            true
        }
        _ => false,
    });
    if cached {
        return;
    }
    let keeper = keeper_of(&handle, runtime, timeout);
    keeper.used(timeout);
    LAST.with(|last| *last.borrow_mut() = Some((runtime, keeper)));
}

/// `runtime`'s keeper (its handle `handle`), started with a period of `timeout` if it
/// has none.
fn keeper_of(handle: &Handle, runtime: Id, timeout: Duration) -> Arc<Keeper> {
    let mut keepers = KEEPERS.lock().unwrap();
    if let Some((_, keeper)) = keepers.iter().find(|(id, _)| *id == runtime) {
        return keeper.clone();
    }
    let keeper = Arc::new(Keeper {
        used: AtomicBool::new(true),
        // Set before the task starts, which may run at once on another worker.
        period_nanos: AtomicU64::new(nanos(timeout)),
        resume: Notify::new(),
        shorter: Notify::new(),
    });
    keepers.push((runtime, keeper.clone()));
    drop(keepers);
    let gone = Gone(runtime);
    let task = keeper.clone();
    handle.spawn(async move {
        let _gone = gone;
        task.keep_armed().await;
    });
    keeper
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Dropped with its runtime's tasks: the runtime's keeper goes from the list.
struct Gone(Id);

impl Drop for Gone {
    fn drop(&mut self) {
        KEEPERS.lock().unwrap().retain(|(id, _)| *id != self.0);
    }
}

struct Keeper {
    /// A call was made since the timer was last re-armed.
    used: AtomicBool,
    /// The shortest call timeout seen, in nanoseconds: the period.
    period_nanos: AtomicU64,
    /// Resumes an idle keeper (a permit is stored if it is not waiting yet).
    resume: Notify,
    /// The period was shortened: re-arm at once.
    shorter: Notify,
}

impl Keeper {
    /// A call with a timeout of `timeout` is being made.
    fn used(&self, timeout: Duration) {
        let nanos = nanos(timeout);
        // Loads first: a busy runtime's calls find both as they leave them, and write
        // nothing.
        if nanos < self.period_nanos.load(Ordering::Relaxed)
            && nanos < self.period_nanos.fetch_min(nanos, Ordering::Relaxed)
        {
            // The sleep under way may end after this call's deadline: re-arm it now.
            self.shorter.notify_one();
        }
        if !self.used.load(Ordering::Relaxed) && !self.used.swap(true, Ordering::Relaxed) {
            self.resume.notify_one();
        }
    }

    /// Sleep one period at a time while calls are made.
    async fn keep_armed(&self) {
        loop {
            let period = Duration::from_nanos(self.period_nanos.load(Ordering::Relaxed));
            tokio::select! {
                () = tokio::time::sleep(period) => {}
                () = self.shorter.notified() => continue,
            }
            if !self.used.swap(false, Ordering::Relaxed) {
                // No call for a whole period: no timer until the next one.
                self.resume.notified().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A runtime that makes calls has one keeper, which goes with the runtime.
    #[test]
    fn a_runtime_has_one_keeper_which_goes_with_it() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let id = runtime.handle().id();
        runtime.block_on(async {
            for _ in 0..3 {
                call_with_timeout(Duration::from_millis(500));
            }
            tokio::spawn(async { call_with_timeout(Duration::from_millis(200)) })
                .await
                .unwrap();
        });
        let keepers = keepers_of(id);
        assert_eq!(keepers.len(), 1, "one keeper per runtime");
        let keeper = &keepers[0];
        assert_eq!(
            keeper.period_nanos.load(Ordering::Relaxed),
            200_000_000,
            "the period is the shortest call timeout"
        );
        drop(runtime);
        assert!(
            KEEPERS.lock().unwrap().iter().all(|(k, _)| *k != id),
            "a runtime that went away leaves no keeper behind"
        );
    }

    /// A shorter call timeout than the one the keeper sleeps re-arms it at once: a keeper
    /// still asleep for the longer period would end after the shorter call's deadline.
    #[test]
    fn a_shorter_timeout_re_arms_the_keeper_at_once() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        let id = runtime.handle().id();
        runtime.block_on(async {
            call_with_timeout(Duration::from_secs(60));
            // The keeper starts, and sleeps for 60 s.
            tokio::task::yield_now().await;
            call_with_timeout(Duration::from_secs(2));
            // Past the shorter period (time advances to the earliest timer first): the
            // keeper has looked, and found the call made since it was armed.
            tokio::time::sleep(Duration::from_millis(2500)).await;
            let keepers = keepers_of(id);
            assert!(
                !keepers[0].used.load(Ordering::Relaxed),
                "the keeper woke after the shorter period, not the first one"
            );
        });
    }

    fn keepers_of(id: Id) -> Vec<Arc<Keeper>> {
        let keepers = KEEPERS.lock().unwrap();
        keepers
            .iter()
            .filter(|(k, _)| *k == id)
            .map(|(_, keeper)| keeper.clone())
            .collect()
    }

    /// Outside a runtime, and for a timeout under the floor, nothing is started.
    #[test]
    fn no_keeper_outside_a_runtime_or_for_a_tiny_timeout() {
        call_with_timeout(Duration::from_millis(500));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let id = runtime.handle().id();
        runtime.block_on(async { call_with_timeout(Duration::from_millis(1)) });
        assert!(KEEPERS.lock().unwrap().iter().all(|(k, _)| *k != id));
    }
}
