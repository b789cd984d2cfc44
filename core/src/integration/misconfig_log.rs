//! [`MisconfigLog`]: the `error!` log of a layer that cannot derive lock keys because of
//! the server's own setup, throttled.
//!
//! Such a mistake fails every request of the route (`500`), so logging each would flood
//! the logs exactly when someone needs to read them: the first is logged at once, with the
//! route and the cause, then at most one a minute, saying how many were not logged.

use super::LogThrottle;

#[derive(Debug, Default)]
pub(super) struct MisconfigLog {
    throttle: LogThrottle,
}

impl MisconfigLog {
    /// A request of `route` whose key `layer` could not derive because of `cause`.
    pub(super) fn failed(&self, layer: &str, route: &str, cause: &str) {
        let Some(unlogged) = self.throttle.due() else {
            return;
        };
        tracing::error!(
            layer,
            route,
            cause,
            unlogged_since_last = unlogged,
            "tower-lock cannot derive this route's lock keys (the server's setup, not the client's request): answered 500"
        );
    }
}
