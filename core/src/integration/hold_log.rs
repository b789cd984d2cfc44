//! The hold log lines: what an engineer on call greps for to link a key, its fence, the
//! node and request that hold it, and how long they held it.
//!
//! Every line names `key`, `fence` and `holder` (the lease's holder label, see
//! [`holder_label`]) and is emitted within the request's span (the grant and the release
//! run in the request's task; a long hold seen by the layer's watch task is logged inside
//! the span the grant was logged in), so a trace links them to the request:
//!
//! - `debug`: `lock acquired` / `lock acquired after waiting`, and `lock released` (with
//!   `held`);
//! - `info`: `lock held longer than the threshold` while it is still held, once per hold,
//!   and `long hold released` at its release, for holds longer than the layer's
//!   `log_holds_longer_than`;
//! - `warn`: `lease was lost while the request held it`, when the layer finds it lost
//!   (within a second, while the request still runs) or at the request's end.

use std::{sync::Arc, time::Duration};

use crate::{engine::Lease, metrics::HoldFacts};

/// The holder label of `lease`, for the log lines: the label the engine stores with the
/// lease (host name and process id by default, the route template from the HTTP layers).
///
/// HOOK(holder label): leases carry no label yet (issue 53's holder label lands in the
/// engine separately); until then this answers `None` and the lines log `holder=""`. Once
/// the engine has it, answer `lease.holder_label()` (or its name there) here: every line
/// and the long-hold notices take it from this one place.
pub(crate) fn holder_label(lease: &Lease) -> Option<Arc<str>> {
    let _ = lease;
    None
}

fn label(facts: &HoldFacts) -> &str {
    facts.label.as_deref().unwrap_or("")
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
    if long.is_some_and(|long| held >= long) {
        tracing::info!(%key, fence = facts.fence, holder = label(facts), ?held, "long hold released");
    } else {
        tracing::debug!(%key, fence = facts.fence, holder = label(facts), ?held, "lock released");
    }
}

/// A hold found lost after `held` (by the layer's watch task while its request runs, or at
/// the request's end).
pub(crate) fn lost_while_held(facts: &HoldFacts, held: Duration) {
    let _entered = facts.span.as_ref().map(tracing::Span::enter);
    tracing::warn!(
        key = %facts.lost.key(),
        fence = facts.fence,
        holder = label(facts),
        ?held,
        "lease was lost while the request held it"
    );
}

/// A hold still held after `held`, past the layer's threshold (by the watch task, once).
pub(crate) fn still_held(facts: &HoldFacts, held: Duration) {
    let _entered = facts.span.as_ref().map(tracing::Span::enter);
    tracing::info!(
        key = %facts.lost.key(),
        fence = facts.fence,
        holder = label(facts),
        ?held,
        "lock held longer than the threshold"
    );
}
