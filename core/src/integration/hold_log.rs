//! The hold log lines: what an engineer on call greps for to link a key, its fence, the
//! node and request that hold it, and how long they held it.
//!
//! Every line names `key`, `fence` and `holder` (the lease's holder label, see
//! [`holder_label`]) and is emitted within the request's span, so a trace links them to the
//! request: the grant runs in the request's task; the release often runs where the server
//! drops the response body, outside every span, and the watch task on the engine's thread,
//! so a hold keeps the span (and subscriber) its grant was logged in and logs there, when
//! `debug` is on for this crate or the layer has a long-hold threshold:
//!
//! - `debug`: `lock acquired` / `lock acquired after waiting`, and `lock released` (with
//!   `held`);
//! - `info`: `lock held longer than the threshold` while it is still held, once per hold,
//!   and `long hold released` at its release, for holds longer than the layer's
//!   `log_holds_longer_than`;
//! - `warn`: `lease was lost while the request held it`, when the layer finds it lost
//!   (within a second, while the request still runs) or at the request's end (without
//!   `debug` nor a threshold, the hold keeps no span: this line is then logged where it is
//!   found).

use std::time::Duration;

use crate::{
    engine::{HolderLabel, LockEngine},
    metrics::HoldFacts,
};

/// The holder label the lines name: the engine's (see `LockEngine::holder_label`; the
/// route template a request's lock adds is not kept with its lease, so the lines name the
/// node, and the request's span names the route).
pub(crate) fn holder_label(engine: &LockEngine) -> Option<HolderLabel> {
    engine.label().cloned()
}

fn label(facts: &HoldFacts) -> &str {
    facts.label.as_ref().map_or("", HolderLabel::as_str)
}

/// The grant of a hold (`waited`: the wait, when it waited).
pub(crate) fn acquired(facts: &HoldFacts, waited: Option<Duration>, degraded: bool) {
    let key = facts.lost.key();
    match waited {
        Some(waited) => tracing::debug!(
            %key,
            fence = facts.fence,
            holder = label(facts),
            ?waited,
            degraded,
            "lock acquired after waiting"
        ),
        None => tracing::debug!(
            %key,
            fence = facts.fence,
            holder = label(facts),
            degraded,
            "lock acquired"
        ),
    }
}

/// The release of a hold that lasted `held`: `info` past `long`, else `debug`.
pub(crate) fn released(facts: &HoldFacts, held: Duration, long: Option<Duration>) {
    let key = facts.lost.key();
    within_request(facts, || {
        if long.is_some_and(|long| held >= long) {
            tracing::info!(%key, fence = facts.fence, holder = label(facts), ?held, "long hold released");
        } else {
            tracing::debug!(%key, fence = facts.fence, holder = label(facts), ?held, "lock released");
        }
    });
}

/// A hold found lost after `held` (by the layer's watch task while its request runs, or at
/// the request's end).
pub(crate) fn lost_while_held(facts: &HoldFacts, held: Duration) {
    within_request(facts, || {
        tracing::warn!(
            key = %facts.lost.key(),
            fence = facts.fence,
            holder = label(facts),
            ?held,
            "lease was lost while the request held it"
        );
    });
}

/// A hold still held after `held`, past the layer's threshold (by the watch task, once).
pub(crate) fn still_held(facts: &HoldFacts, held: Duration) {
    within_request(facts, || {
        tracing::info!(
            key = %facts.lost.key(),
            fence = facts.fence,
            holder = label(facts),
            ?held,
            "lock held longer than the threshold"
        );
    });
}

/// Run `log` within the request's span and to the request's subscriber, when the hold
/// kept them: the watch task runs on the engine's thread, whose default subscriber may not
/// be the request's (a subscriber set for a thread or a runtime). Else as it is.
fn within_request(facts: &HoldFacts, log: impl FnOnce()) {
    match &facts.span {
        Some((span, dispatch)) => tracing::dispatcher::with_default(dispatch, || {
            let _entered = span.enter();
            log();
        }),
        None => log(),
    }
}
