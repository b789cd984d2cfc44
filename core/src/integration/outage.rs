//! [`OutageLog`]: a backend outage logged at its transitions, not once per request.
//!
//! While the backend is down every request fails the same way; an `error!` per request
//! would flood the logs exactly when operators read them. So a layer logs the transition
//! to down once (`error!`, with the first error), a summary while it lasts (`warn!`, every
//! [`SUMMARY_EVERY`], with the number of requests affected), the transition back once
//! (`info!`, with the outage's length and total), and each affected request at `debug!`.
//!
//! A layer sees the backend only through its requests, so the end of an outage is seen at
//! the first request after it: the recovery reports `down_for` from the first failed
//! request to the last, and apart from it `seen_after`, the quiet stretch between the last
//! failure and the request that found the backend back (an upper bound on how much longer
//! the outage may have lasted), never folded into the downtime.

use std::{
    sync::{
        Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use tokio::time::Instant;

use crate::{engine::BackendError, options::BackendFailurePolicy};

/// How often an outage that lasts is summarized (at the first affected request after
/// that long).
pub(crate) const SUMMARY_EVERY: Duration = Duration::from_secs(10);

struct Down {
    since: Instant,
    /// The last request that met the failure.
    last_failed: Instant,
    /// Requests affected since the outage began.
    affected: u64,
    /// When the last summary (or the transition) was logged, and `affected` then.
    summarized: Instant,
    summarized_affected: u64,
}

/// The outage state of one layer.
#[derive(Default)]
pub(crate) struct OutageLog {
    /// Whether an outage is under way: read on every answered request, so the lock is
    /// taken only while the backend fails or just after.
    down: AtomicBool,
    state: Mutex<Option<Down>>,
}

impl OutageLog {
    /// A request met a backend failure, and the layer answered it by `policy`.
    pub(crate) fn failed(&self, layer: &str, error: &BackendError, policy: BackendFailurePolicy) {
        let now = Instant::now();
        let action = match policy {
            BackendFailurePolicy::FailClosed => "rejecting requests with 503 (fail closed)",
            BackendFailurePolicy::FailOpen => "running requests unlocked (fail open)",
            BackendFailurePolicy::Degrade => "locking in-process only (degraded)",
        };
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.down.store(true, Ordering::Relaxed);
        let Some(down) = state.as_mut() else {
            *state = Some(Down {
                since: now,
                last_failed: now,
                affected: 1,
                summarized: now,
                summarized_affected: 1,
            });
            tracing::error!(layer, %error, "lock backend unavailable; {action} until it answers again");
            return;
        };
        down.affected += 1;
        down.last_failed = now;
        tracing::debug!(layer, %error, "lock backend still unavailable; {action}");
        if now.saturating_duration_since(down.summarized) >= SUMMARY_EVERY {
            tracing::warn!(
                layer,
                %error,
                affected = down.affected - down.summarized_affected,
                affected_total = down.affected,
                down_for = ?now.saturating_duration_since(down.since),
                "lock backend still unavailable; {action}"
            );
            down.summarized = now;
            down.summarized_affected = down.affected;
        }
    }

    /// The backend answered a request (granted, refused, or timed out waiting).
    pub(crate) fn answered(&self, layer: &str) {
        if !self.down.load(Ordering::Relaxed) {
            return;
        }
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(down) = state.take() {
            self.down.store(false, Ordering::Relaxed);
            tracing::info!(
                layer,
                affected_total = down.affected,
                down_for = ?down.last_failed.saturating_duration_since(down.since),
                seen_after = ?Instant::now().saturating_duration_since(down.last_failed),
                "lock backend available again"
            );
        }
    }
}
