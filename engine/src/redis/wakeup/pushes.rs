//! Push routing: the push sender of a subscriber connection dispatches a published grant
//! where redis-rs reads it, and hands every other push to the subscriber task.

use std::sync::Weak;

use super::{HubState, dispatch};

/// The push sender of a subscriber connection.
///
/// A published message is dispatched right where redis-rs reads it, in the connection's
/// own driver task: the woken waiter is one task hop from the socket, not two (through a
/// channel, another task would have to be scheduled first). Every other push (a dropped
/// connection, a subscription the server ended, confirmations) goes to the subscriber
/// task on `control`.
pub(crate) struct Pushes {
    shared: Weak<HubState>,
    control: tokio::sync::mpsc::UnboundedSender<redis::PushInfo>,
}

impl redis::aio::AsyncPushSender for Pushes {
    fn send(&self, push: redis::PushInfo) -> Result<(), redis::aio::SendError> {
        if matches!(
            push.kind,
            redis::PushKind::Message | redis::PushKind::SMessage
        ) {
            if let [
                redis::Value::BulkString(channel),
                redis::Value::BulkString(payload),
                ..,
            ] = &push.data[..]
                && let Ok(channel) = std::str::from_utf8(channel)
                && let Some(shared) = self.shared.upgrade()
            {
                dispatch(&shared, channel, payload);
            }
            return Ok(());
        }
        self.control.send(push).map_err(|_| redis::aio::SendError)
    }
}

/// A push sender for a new subscriber connection, and where its other pushes arrive.
pub(crate) fn pushes(
    shared: &Weak<HubState>,
) -> (
    Pushes,
    tokio::sync::mpsc::UnboundedReceiver<redis::PushInfo>,
) {
    let (control, rx) = tokio::sync::mpsc::unbounded_channel();
    let shared = shared.clone();
    (Pushes { shared, control }, rx)
}
