//! How a lease completes ([`Lease::complete`](crate::Lease::complete)): its record stored
//! and its key released in one step on the backend, sent again while the backend refuses
//! it for a moment.
//!
//! A refusal (a Redis busy with a script, loading, demoted to a replica: see
//! [`BackendError::is_refusal`](crate::BackendError::is_refusal)) says the call did not
//! run: the lease is still ours, unchanged. Giving up then would leave the key held with
//! no record (every retry a `409` until the TTL runs out, and then the request runs
//! again), so the completion is sent again with backoff, the lease still under the
//! watchdog (renewed whenever the backend takes a renewal), until it is stored, the
//! backend says the lease is gone, or the lease's validity runs out unrenewed.

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use tokio::time::Instant;

use super::{LockError, Mode, Record, lease::LeaseState, lock_engine::EngineShared};

/// The first pause after a refusal; each next one doubles, up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(10);

/// The longest pause between two attempts: a refusal usually ends within a second (a slow
/// script, a failover), and a completion landing late holds its duplicates up that long.
const MAX_PAUSE: Duration = Duration::from_millis(200);

/// Store `record` and release the key of the lease `state` (registered with the watchdog
/// as `id`; marked released by the caller, which no longer drops it), sending it again
/// while the backend refuses it and the lease is valid.
pub(super) async fn complete(
    engine: Arc<EngineShared>,
    state: Arc<LeaseState>,
    mut id: u64,
    record: Record,
    retention: Duration,
) -> Result<(), LockError> {
    // Records live beside the key's lock; a shared lease has none.
    let records = match state.mode {
        Mode::Exclusive => engine.backend.capabilities().records,
        _ => None,
    };
    let Some(records) = records else {
        engine.watchdog.unregister(id);
        let _ = engine
            .backend
            .release(&state.key, &state.token, state.mode)
            .await;
        return Err(LockError::Unsupported("records"));
    };
    let mut pause = FIRST_PAUSE;
    let mut refused = 0u32;
    loop {
        // Marked released while the attempt is out: a renewal that finds the key gone
        // meanwhile has met this completion, not a lost lease.
        let result = records
            .complete(&state.key, &state.token, &record, retention)
            .await;
        let refusal = match result {
            Err(LockError::Backend(e)) if e.is_refusal() => e,
            done => {
                engine.watchdog.unregister(id);
                if refused > 0 {
                    tracing::debug!(key = %state.key, refused, ok = done.is_ok(), "completion sent again after refusals");
                }
                tracing::trace!(key = %state.key, ok = done.is_ok(), "lock released with a record");
                return done;
            }
        };
        refused += 1;
        let now = Instant::now();
        let deadline = state.times.lock().unwrap().deadline;
        if now >= deadline {
            // Refused until the lease could have expired on the backend: nothing more to
            // try for (the key frees itself with its TTL).
            engine.watchdog.unregister(id);
            tracing::debug!(key = %state.key, refused, error = %refusal, "completion refused until the lease ran out");
            return Err(LockError::Backend(refusal));
        }
        tracing::debug!(key = %state.key, error = %refusal, "completion refused; sending it again");
        // Nothing was applied: the lease is ours as before, and renewed while we wait.
        state.released.store(false, Ordering::Release);
        id = watch_again(&engine, &state, id);
        tokio::time::sleep(pause.min(deadline - now)).await;
        pause = (pause * 2).min(MAX_PAUSE);
        state.released.store(true, Ordering::Release);
    }
}

/// Put the lease back under the watchdog, which may have let it go while it was marked
/// released (its renewal, if one was out then, no longer reschedules it): under a new id,
/// renewed at once if it renews itself.
fn watch_again(engine: &Arc<EngineShared>, state: &Arc<LeaseState>, id: u64) -> u64 {
    engine.watchdog.unregister(id);
    {
        let mut t = state.times.lock().unwrap();
        if state.auto_renew && t.renew_at.is_none() {
            t.renew_at = Some(Instant::now());
        }
    }
    engine.watchdog.register(engine, state.clone())
}
