//! [`LogThrottle`]: when a log of a mistake that repeats on every request is due: the
//! first at once, then at most one a minute, each saying how many were not logged.
//!
//! A server-side mistake (a misconfigured key, a handler that misuses its transaction)
//! fails every request of its route; logging each would flood the logs exactly when
//! someone needs to read them.

use std::sync::Mutex;

use tokio::time::{Duration, Instant};

/// How often a persisting mistake is logged again.
const EVERY: Duration = Duration::from_secs(60);

/// One kind of repeated mistake's log schedule (share one per kind and per layer).
#[doc(hidden)]
#[derive(Debug, Default)]
pub struct LogThrottle {
    /// When the last one was logged, and how many have not been logged since.
    last: Mutex<Option<(Instant, u64)>>,
}

impl LogThrottle {
    /// One more occurrence: `Some(n)` when it is to be logged now (`n` occurrences were
    /// not logged since the last log), `None` when it is to be counted only.
    pub fn due(&self) -> Option<u64> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let unlogged = match *last {
            Some((at, unlogged)) if now.duration_since(at) < EVERY => {
                *last = Some((at, unlogged + 1));
                return None;
            }
            Some((_, unlogged)) => unlogged,
            None => 0,
        };
        *last = Some((now, 0));
        Some(unlogged)
    }
}
