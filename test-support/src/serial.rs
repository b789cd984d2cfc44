//! A process-wide gate that keeps the fault tests of one group from running beside those of
//! another.
//!
//! The Redis fault and scale tests (a killed, paused or frozen server, a Cluster or Sentinel
//! failover, hand-offs timed against their claim period) used to be one test binary per
//! file, and cargo runs test binaries one at a time: each file's tests only ever ran beside
//! each other. Merged into a few binaries, libtest would run a Cluster failover beside a
//! Sentinel failover, and both would compete for the same two cores with timing bounds that
//! were measured alone. So each such test first enters its group, its module's path (one
//! module per former binary): tests of one group still run side by side, as they did in
//! their own binary, and a test of another group waits until the running group has ended.
//!
//! ```ignore
//! #[tokio::test]
//! async fn a_failover_keeps_exclusion() {
//!     let _group = tower_lock_test_support::serial::group(module_path!()).await;
//!     // ...
//! }
//! ```

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

/// Which group runs, and how many of its tests.
struct Running {
    group: Option<&'static str>,
    tests: usize,
}

static RUNNING: Mutex<Running> = Mutex::new(Running {
    group: None,
    tests: 0,
});
static ENDED: Condvar = Condvar::new();

/// A test's membership in its running group, given back when the test ends (or panics).
#[must_use = "the group is left when this guard is dropped"]
#[derive(Debug)]
pub struct GroupMember {
    group: &'static str,
}

/// Wait until no test of another group runs, then run as a member of `group`.
///
/// Greedy on purpose: a test of the running group enters at once even if another group
/// waits, so the tests of one file (which libtest starts in a row, by name) keep running
/// two at a time, and the other group enters once they are done.
pub async fn group(group: &'static str) -> GroupMember {
    // A blocking wait off the test's runtime, which may have a single thread.
    tokio::task::spawn_blocking(move || group_blocking(group))
        .await
        .expect("the group gate's wait does not panic")
}

/// [`group`] for a plain `#[test]` that builds its runtimes itself.
pub fn group_blocking(group: &'static str) -> GroupMember {
    let mut running = lock();
    while running.group.is_some_and(|g| g != group) {
        running = ENDED.wait(running).unwrap_or_else(PoisonError::into_inner);
    }
    running.group = Some(group);
    running.tests += 1;
    GroupMember { group }
}

fn lock() -> MutexGuard<'static, Running> {
    // Nothing panics while holding it; a poisoned lock still holds a consistent count.
    RUNNING.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Drop for GroupMember {
    fn drop(&mut self) {
        let mut running = lock();
        debug_assert_eq!(running.group, Some(self.group));
        running.tests -= 1;
        if running.tests == 0 {
            running.group = None;
            ENDED.notify_all();
        }
    }
}
