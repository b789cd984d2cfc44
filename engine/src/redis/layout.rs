//! The key layout's version, and the check `build()` runs so that a fleet never mixes two
//! layouts on one prefix.
//!
//! Layout 2 (this version) keeps one space per key: a key's lock and its shared leases are
//! one holding (`lock`, `holders`), with one queue (`queue`, `tickets`) and one wake-up
//! channel. Layout 1 (the versions before) kept shared leases apart (`pholders`, `pfence`,
//! `pqueue`, `pwake`) and queued whole tickets in `queue`: a node of each on one prefix
//! would let a lock and a shared lease of one key be held at once, and would misread each
//! other's queues. The two are not read across versions; instead, every node watches its
//! server on a channel that names its layout (`P:{session}:wake:` for layout 1,
//! `P:{session}:layout2:` for this one), and `build()` refuses a prefix on which a node of
//! layout 1 is watching ([`ConfigError::EarlierLayout`]). A rolling upgrade therefore
//! either moves to a new prefix (old and new nodes then never share a key), or stops the
//! old nodes before the new ones start (their leases end with them; keys they leave
//! expire, and this layout drops a ticket it cannot read as a dead one).
//!
//! On a Redis Cluster no node of either layout keeps such a subscription (the watch reads
//! every node's role instead), so the check cannot see earlier nodes there: deploy on a new
//! prefix.

use redis::Value;

use super::commands::Commands;
use crate::{BackendError, ConfigError};

/// The channel this layout's watch connection subscribes to (one server, Sentinel).
pub(super) fn session_channel(prefix: &str) -> String {
    format!("{prefix}:{{session}}:layout2:")
}

/// The channel a node of layout 1 watches on.
fn earlier_channel(prefix: &str) -> String {
    format!("{prefix}:{{session}}:wake:")
}

/// Refuse `prefix` while a node of the earlier layout watches it (one `PUBSUB NUMSUB`).
pub(super) async fn check(
    pool: &Commands,
    prefix: &str,
    cluster: bool,
) -> Result<(), BackendError> {
    if cluster {
        return Ok(());
    }
    let mut numsub = redis::cmd("PUBSUB");
    numsub.arg("NUMSUB").arg(earlier_channel(prefix));
    let reply: Value = pool.query_unchecked("PUBSUB NUMSUB", &numsub).await?;
    let nodes = match reply {
        Value::Array(items) | Value::Set(items) => match items.get(1) {
            Some(Value::Int(n)) => u64::try_from(*n).unwrap_or(0),
            _ => 0,
        },
        Value::Map(pairs) => pairs
            .first()
            .and_then(|(_, n)| match n {
                Value::Int(n) => u64::try_from(*n).ok(),
                _ => None,
            })
            .unwrap_or(0),
        _ => 0,
    };
    if nodes > 0 {
        return Err(BackendError::from(ConfigError::EarlierLayout {
            prefix: prefix.to_owned(),
            nodes,
        }));
    }
    Ok(())
}
