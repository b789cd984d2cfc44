//! [`MisconfigLog`]: the `error!` log of a layer that cannot derive lock keys because of
//! the server's own setup, throttled.
//!
//! Such a mistake fails every request of the route (`500`), so logging each would flood
//! the logs exactly when someone needs to read them: the first is logged at once, with the
//! route and the cause, then at most one a minute, saying how many were not logged.

use std::sync::Mutex;

use tokio::time::{Duration, Instant};

/// How often a persisting misconfiguration is logged again.
const EVERY: Duration = Duration::from_secs(60);

#[derive(Debug, Default)]
pub(super) struct MisconfigLog {
    /// When the last one was logged, and how many have not been logged since.
    last: Mutex<Option<(Instant, u64)>>,
}

impl MisconfigLog {
    /// A request of `route` whose key `layer` could not derive because of `cause`.
    pub(super) fn failed(&self, layer: &str, route: &str, cause: &str) {
        let mut last = self.last.lock().unwrap();
        let now = Instant::now();
        let unlogged = match *last {
            Some((at, unlogged)) if now.duration_since(at) < EVERY => {
                *last = Some((at, unlogged + 1));
                return;
            }
            Some((_, unlogged)) => unlogged,
            None => 0,
        };
        *last = Some((now, 0));
        drop(last);
        tracing::error!(
            layer,
            route,
            cause,
            unlogged_since_last = unlogged,
            "tower-lock cannot derive this route's lock keys (the server's setup, not the client's request): answered 500"
        );
    }
}
