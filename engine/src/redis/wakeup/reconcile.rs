//! Reconcile: bring a subscriber connection's subscriptions in line with the channels the
//! hub's waiters want, and wait for the next reason to do it again.

use std::time::Duration;

use tokio::time::Instant;

use super::{HubState, LINGER, Woken};
use crate::BoxFuture;

/// Where a subscriber task sends its subscriptions: one server's connection, or a cluster
/// connection (which sends one channel per command: each is routed to its own slot's node,
/// and a multi-slot `SSUBSCRIBE` is refused with `CROSSSLOT`). Each command within
/// `limit`.
pub(crate) trait Sink: Send {
    /// Subscribe to `channels`.
    fn subscribe<'a>(
        &'a mut self,
        channels: &'a [String],
        limit: Duration,
    ) -> BoxFuture<'a, Result<(), redis::RedisError>>;

    /// Unsubscribe from `channels`.
    fn unsubscribe<'a>(
        &'a mut self,
        channels: &'a [String],
        limit: Duration,
    ) -> BoxFuture<'a, Result<(), redis::RedisError>>;
}

/// What the subscriber task waits for between reconciliations.
pub(crate) enum Event {
    /// A push other than a message (messages are dispatched by [`Pushes`]).
    Push(redis::PushInfo),
    /// The connection's push sender is gone: so is the connection.
    Closed,
    /// The wanted channels changed, or an idle channel has lingered long enough to be
    /// unsubscribed: reconcile.
    Reconcile,
}

pub(crate) async fn next_event(
    shared: &HubState,
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<redis::PushInfo>,
) -> Event {
    let changed = shared.changed.notified();
    let linger_ends = {
        let st = shared.state.lock().unwrap();
        st.idle.values().min().map(|since| *since + LINGER)
    };
    let far = Instant::now() + Duration::from_secs(3600);
    tokio::select! {
        push = rx.recv() => push.map_or(Event::Closed, Event::Push),
        _ = changed => Event::Reconcile,
        _ = tokio::time::sleep_until(linger_ends.unwrap_or(far)) => Event::Reconcile,
    }
}

/// Bring the connection's subscriptions in line with the wanted channels. With
/// `wake_all`, the waiters of every channel (re)subscribed here retry once it is
/// confirmed (grants published while it was not subscribed were lost).
pub(crate) async fn reconcile(
    shared: &HubState,
    sink: &mut dyn Sink,
    wake_all: bool,
) -> Result<(), redis::RedisError> {
    loop {
        let (to_sub, to_unsub): (Vec<String>, Vec<String>) = {
            let mut st = shared.state.lock().unwrap();
            let now = Instant::now();
            let to_sub = st
                .channels
                .keys()
                .filter(|c| !st.subscribed.contains_key(*c))
                .cloned()
                .collect();
            let to_unsub: Vec<String> = st
                .subscribed
                .keys()
                .filter(|c| {
                    !st.channels.contains_key(*c)
                        && st.idle.get(*c).is_none_or(|since| *since + LINGER <= now)
                })
                .cloned()
                .collect();
            // Forget them before the UNSUBSCRIBE goes out: a waiter arriving meanwhile
            // must wait for the SUBSCRIBE that follows, not trust a dying subscription.
            for c in &to_unsub {
                st.subscribed.remove(c);
                st.idle.remove(c);
            }
            (to_sub, to_unsub)
        };
        if to_sub.is_empty() && to_unsub.is_empty() {
            return Ok(());
        }
        let limit = shared.connect_timeout;
        if !to_sub.is_empty() {
            sink.subscribe(&to_sub, limit).await?;
            let mut st = shared.state.lock().unwrap();
            for c in &to_sub {
                st.events += 1;
                let event = st.events;
                st.subscribed.insert(c.clone(), event);
                if wake_all && let Some(channel) = st.channels.get_mut(c) {
                    // Grants published while we were away were lost: everyone retries.
                    for slot in &mut channel.waiters {
                        slot.woken.get_or_insert(Woken::Retry);
                        slot.notify.notify_one();
                    }
                }
            }
            drop(st);
            shared.confirmations.notify_waiters();
        }
        if !to_unsub.is_empty() {
            sink.unsubscribe(&to_unsub, limit).await?;
        }
    }
}

/// `fut`, or a timeout error after `limit`.
pub(crate) async fn timeout<T>(
    limit: Duration,
    fut: impl Future<Output = Result<T, redis::RedisError>>,
) -> Result<T, redis::RedisError> {
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r,
        Err(_) => Err(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "subscriber command timed out",
        ))),
    }
}
