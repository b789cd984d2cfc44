//! Revocations: an admin's force release tells the holder's engine before anyone else is
//! granted the key.
//!
//! [`force_release`](crate::AdminBackend::force_release) first runs the `REVOKE` script,
//! which publishes each holder's token and the key on the prefix's revocation channel
//! (`P:{session}:revoke:`; a plain `PUBLISH`, which a Cluster carries to every node). Every
//! engine's watch connections are subscribed to it (the one server's or Sentinel primary's
//! session watch, each Cluster node's watch): the engine that holds the lease reads it lost
//! the moment the message is read ([`Resets::revoke`]), then gives the key back itself,
//! and that release hands it to the next waiter. The admin waits for that (at most
//! [`GIVE_BACK`]); a holder that did not give the key back by then (its node gone, frozen,
//! or its watch down) is released by the admin itself (the `FORCE_RELEASE` script, token
//! by token): that holder learns at its next renewal, at most a third of its TTL later,
//! or at its own validity deadline.

use std::time::Duration;

use redis::{PushInfo, PushKind, Value};

use crate::{LockKey, Resets, Token};

/// How long an admin's force release waits for the holders' engines to give the key back
/// before releasing it itself.
pub(crate) const GIVE_BACK: Duration = Duration::from_secs(1);

/// The revocation channel of `prefix`.
pub(crate) fn channel(prefix: &str) -> String {
    format!("{prefix}:{{session}}:revoke:")
}

/// If `push` is a message on `channel` (`"<token>\n<key>"`), report the revocation on
/// `resets` and say so.
pub(crate) fn on_push(resets: &Resets, channel: &str, push: &PushInfo) -> bool {
    if push.kind != PushKind::Message {
        return false;
    }
    let [Value::BulkString(on), Value::BulkString(payload), ..] = &push.data[..] else {
        return false;
    };
    if on.as_slice() != channel.as_bytes() {
        return false;
    }
    if let Ok(text) = std::str::from_utf8(payload)
        && let Some((token, key)) = text.split_once('\n')
        && let (Ok(token), Ok(key)) = (Token::new(token), LockKey::new(key))
    {
        resets.revoke(&key, &token);
    }
    true
}
