//! Wake-ups: one pub/sub subscriber connection per backend, fanned out to local waiters.
//!
//! Waiters register a [`Subscription`] on their key's channel. Channels are reference
//! counted: the first local waiter of a key subscribes, the last one to leave unsubscribes.
//! One background task owns the subscriber connection. It reconciles the wanted channels
//! with the subscribed ones (batched SUBSCRIBE / UNSUBSCRIBE), dispatches messages, and
//! when the connection breaks it reconnects, resubscribes every wanted channel, and wakes
//! every local waiter once (a release may have been published while it was away).
//!
//! A message wakes exactly one local waiter: the one holding the named FIFO ticket, or,
//! for an empty payload, the longest-waiting local waiter not already woken. No herd.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex, Weak},
    time::Duration,
};

use futures_util::StreamExt;
use tokio::{sync::Notify, task::JoinHandle};

use super::connection::Connector;

/// The per-backend wake-up hub.
pub(crate) struct Wakeup {
    shared: Arc<Shared>,
}

struct Shared {
    client: redis::Client,
    connector: Arc<Connector>,
    connect_timeout: Duration,
    state: Mutex<State>,
    /// Signalled when the wanted set of channels changes.
    changed: Notify,
    /// Signalled (notify_waiters) whenever channels become confirmed.
    confirmations: Notify,
}

#[derive(Default)]
struct State {
    channels: HashMap<String, Channel>,
    /// Channels confirmed on the current connection, each with the event number of its
    /// confirmation or of the last message dispatched on it (numbers are never reused, so
    /// an unchanged number means "subscribed all along, nothing heard since").
    subscribed: HashMap<String, u64>,
    /// The last event number handed out.
    events: u64,
    next_id: u64,
    task: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct Channel {
    waiters: VecDeque<Slot>,
}

struct Slot {
    id: u64,
    ticket: Option<String>,
    woken: bool,
    notify: Arc<Notify>,
}

impl Wakeup {
    pub(crate) fn new(
        client: redis::Client,
        connector: Arc<Connector>,
        connect_timeout: Duration,
    ) -> Self {
        Wakeup {
            shared: Arc::new(Shared {
                client,
                connector,
                connect_timeout,
                state: Mutex::new(State::default()),
                changed: Notify::new(),
                confirmations: Notify::new(),
            }),
        }
    }

    /// Where `channel` stands now: `Some` if it is subscribed on the live connection. Taken
    /// before an attempt is sent, and handed to [`Wakeup::subscribe`] after it failed.
    pub(crate) fn mark(&self, channel: &str) -> Option<u64> {
        self.shared
            .state
            .lock()
            .unwrap()
            .subscribed
            .get(channel)
            .copied()
    }

    /// Register a local waiter on `channel` (with its FIFO ticket, if any).
    ///
    /// `mark` is what [`Wakeup::mark`] said before the failed attempt. If the channel has
    /// been subscribed ever since and no message came on it, the subscription is
    /// [covered](Subscription::covered): every release after that attempt will reach this
    /// waiter, so it need not retry before waiting.
    pub(crate) fn subscribe(
        &self,
        channel: &str,
        ticket: Option<&str>,
        mark: Option<u64>,
    ) -> Subscription {
        let notify = Arc::new(Notify::new());
        let mut st = self.shared.state.lock().unwrap();
        let covered = mark.is_some() && st.subscribed.get(channel).copied() == mark;
        let id = st.next_id;
        st.next_id += 1;
        let entry = st.channels.entry(channel.to_owned()).or_default();
        let first = entry.waiters.is_empty();
        entry.waiters.push_back(Slot {
            id,
            ticket: ticket.map(str::to_owned),
            woken: false,
            notify: notify.clone(),
        });
        // Start (or restart, if its runtime went away) the subscriber task.
        if st.task.as_ref().is_none_or(JoinHandle::is_finished) {
            st.subscribed.clear();
            st.task = Some(tokio::spawn(run(Arc::downgrade(&self.shared))));
        }
        drop(st);
        if first {
            self.shared.changed.notify_one();
        }
        Subscription {
            shared: self.shared.clone(),
            channel: channel.to_owned(),
            id,
            notify,
            covered,
        }
    }
}

impl Drop for Wakeup {
    fn drop(&mut self) {
        if let Some(task) = self.shared.state.lock().unwrap().task.take() {
            task.abort();
        }
    }
}

/// One local waiter's registration. Dropping it deregisters (and passes on a wake-up it
/// received but did not use).
pub(crate) struct Subscription {
    shared: Arc<Shared>,
    channel: String,
    id: u64,
    notify: Arc<Notify>,
    covered: bool,
}

impl Subscription {
    /// Whether no release can have gone unheard between the attempt before this
    /// subscription and the subscription itself (see [`Wakeup::subscribe`]).
    pub(crate) fn covered(&self) -> bool {
        self.covered
    }

    /// Resolves once the channel is subscribed on the live connection: from then on, no
    /// release can go unheard (short of a connection loss, which wakes everyone).
    pub(crate) async fn confirmed(&self) {
        loop {
            let notified = self.shared.confirmations.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self
                .shared
                .state
                .lock()
                .unwrap()
                .subscribed
                .contains_key(&self.channel)
            {
                return;
            }
            notified.await;
        }
    }

    /// Resolves when this waiter is woken (a release meant for it, or a reconnect).
    pub(crate) async fn woken(&self) {
        self.notify.notified().await;
        let mut st = self.shared.state.lock().unwrap();
        if let Some(slot) = st
            .channels
            .get_mut(&self.channel)
            .and_then(|c| c.waiters.iter_mut().find(|s| s.id == self.id))
        {
            slot.woken = false;
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut st = self.shared.state.lock().unwrap();
        let Some(channel) = st.channels.get_mut(&self.channel) else {
            return;
        };
        let Some(pos) = channel.waiters.iter().position(|s| s.id == self.id) else {
            return;
        };
        let slot = channel.waiters.remove(pos).expect("position is in range");
        if slot.woken {
            // We were woken but leave without acting on it: the wake-up is someone else's.
            wake_one(channel);
        }
        if channel.waiters.is_empty() {
            st.channels.remove(&self.channel);
            drop(st);
            self.shared.changed.notify_one();
        }
    }
}

fn wake_one(channel: &mut Channel) {
    if let Some(slot) = channel.waiters.iter_mut().find(|s| !s.woken) {
        slot.woken = true;
        slot.notify.notify_one();
    }
}

/// Route one message: a FIFO ticket wakes its owner (if it waits here), an empty payload
/// wakes one local waiter.
fn dispatch(shared: &Shared, channel: &str, payload: &[u8]) {
    let mut st = shared.state.lock().unwrap();
    st.events += 1;
    let event = st.events;
    if let Some(heard) = st.subscribed.get_mut(channel) {
        *heard = event;
    }
    let Some(channel) = st.channels.get_mut(channel) else {
        return;
    };
    if payload.is_empty() {
        wake_one(channel);
    } else if let Some(slot) = channel
        .waiters
        .iter_mut()
        .find(|s| s.ticket.as_deref().map(str::as_bytes) == Some(payload))
    {
        // A FIFO head: only that waiter may take the key, so only it is woken.
        slot.woken = true;
        slot.notify.notify_one();
    }
}

/// The subscriber task: connect, reconcile, dispatch; reconnect with backoff on failure.
async fn run(weak: Weak<Shared>) {
    let mut backoff = Duration::from_millis(50);
    let mut reconnecting = false;
    loop {
        let Some(shared) = weak.upgrade() else { return };
        let connected =
            tokio::time::timeout(shared.connect_timeout, shared.client.get_async_pubsub()).await;
        let pubsub = match connected {
            Ok(Ok(p)) => p,
            Ok(Err(error)) => {
                tracing::debug!(%error, "lock wake-up subscriber could not connect");
                drop(shared);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                reconnecting = true;
                continue;
            }
            Err(_) => {
                tracing::debug!("lock wake-up subscriber connect timed out");
                drop(shared);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                reconnecting = true;
                continue;
            }
        };
        backoff = Duration::from_millis(50);
        let (mut sink, mut stream) = pubsub.split();
        let reader_weak = weak.clone();
        let mut reader = tokio::spawn(async move {
            while let Some(msg) = stream.next().await {
                let Some(shared) = reader_weak.upgrade() else {
                    return;
                };
                dispatch(&shared, msg.get_channel_name(), msg.get_payload_bytes());
            }
        });
        if reconnecting {
            tracing::info!("lock wake-up subscriber reconnected");
        }
        let mut first = true;
        let lost = loop {
            if !first {
                let changed = shared.changed.notified();
                tokio::select! {
                    _ = &mut reader => break true,
                    _ = changed => {}
                }
            }
            let resubscribed = first && reconnecting;
            first = false;
            if let Err(error) = reconcile(&shared, &mut sink, resubscribed).await {
                tracing::debug!(%error, "lock wake-up subscriber failed");
                break true;
            }
        };
        reader.abort();
        {
            let mut st = shared.state.lock().unwrap();
            st.subscribed.clear();
        }
        if lost {
            tracing::warn!("lock wake-up subscriber connection lost; reconnecting");
            // Every pooled command connection is suspect too.
            shared.connector.invalidate();
            reconnecting = true;
        }
        drop(shared);
    }
}

/// Bring the connection's subscriptions in line with the wanted channels.
async fn reconcile(
    shared: &Shared,
    sink: &mut redis::aio::PubSubSink,
    wake_all: bool,
) -> Result<(), redis::RedisError> {
    loop {
        let (to_sub, to_unsub): (Vec<String>, Vec<String>) = {
            let mut st = shared.state.lock().unwrap();
            let to_sub = st
                .channels
                .keys()
                .filter(|c| !st.subscribed.contains_key(*c))
                .cloned()
                .collect();
            let to_unsub: Vec<String> = st
                .subscribed
                .keys()
                .filter(|c| !st.channels.contains_key(*c))
                .cloned()
                .collect();
            // Forget them before the UNSUBSCRIBE goes out: a waiter arriving meanwhile
            // must wait for the SUBSCRIBE that follows, not trust a dying subscription.
            for c in &to_unsub {
                st.subscribed.remove(c);
            }
            (to_sub, to_unsub)
        };
        if to_sub.is_empty() && to_unsub.is_empty() {
            return Ok(());
        }
        let limit = shared.connect_timeout;
        if !to_sub.is_empty() {
            timeout(limit, sink.subscribe(&to_sub)).await?;
            let mut st = shared.state.lock().unwrap();
            for c in &to_sub {
                st.events += 1;
                let event = st.events;
                st.subscribed.insert(c.clone(), event);
                if wake_all && let Some(channel) = st.channels.get_mut(c) {
                    // Releases published while we were away were lost: everyone retries.
                    for slot in &mut channel.waiters {
                        slot.woken = true;
                        slot.notify.notify_one();
                    }
                }
            }
            drop(st);
            shared.confirmations.notify_waiters();
        }
        if !to_unsub.is_empty() {
            timeout(limit, sink.unsubscribe(&to_unsub)).await?;
        }
    }
}

async fn timeout<T>(
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

#[cfg(test)]
mod tests {
    use super::*;

    fn hub() -> Wakeup {
        // Nothing listens on port 1: the subscriber task just keeps retrying.
        let client = redis::Client::open("redis://127.0.0.1:1").unwrap();
        let timeout = Duration::from_millis(100);
        Wakeup::new(
            client.clone(),
            Arc::new(Connector::new(client, timeout)),
            timeout,
        )
    }

    fn woken(subs: &[Subscription]) -> Vec<bool> {
        subs.iter()
            .map(|s| tokio_test::task::spawn(s.woken()).poll().is_ready())
            .collect()
    }

    #[tokio::test]
    async fn a_release_wakes_one_local_waiter_not_all() {
        let hub = hub();
        let subs: Vec<_> = (0..3).map(|_| hub.subscribe("c", None, None)).collect();
        dispatch(&hub.shared, "c", b"");
        assert_eq!(woken(&subs), [true, false, false]);
        // Two releases before anyone acts: two different waiters.
        dispatch(&hub.shared, "c", b"");
        dispatch(&hub.shared, "c", b"");
        assert_eq!(woken(&subs), [true, true, false]);
    }

    #[tokio::test]
    async fn a_fifo_release_wakes_only_the_named_head() {
        let hub = hub();
        let subs = vec![
            hub.subscribe("c", Some("t1"), None),
            hub.subscribe("c", Some("t2"), None),
        ];
        dispatch(&hub.shared, "c", b"t2");
        assert_eq!(woken(&subs), [false, true]);
        // Another node's head: nobody here.
        dispatch(&hub.shared, "c", b"t9");
        assert_eq!(woken(&subs), [false, false]);
    }

    #[tokio::test]
    async fn an_unused_wake_up_is_passed_on_when_its_waiter_leaves() {
        let hub = hub();
        let first = hub.subscribe("c", None, None);
        let second = hub.subscribe("c", None, None);
        dispatch(&hub.shared, "c", b"");
        drop(first);
        assert_eq!(woken(&[second]), [true]);
    }

    #[tokio::test]
    async fn channels_are_reference_counted() {
        let hub = hub();
        let a = hub.subscribe("c", None, None);
        let b = hub.subscribe("c", None, None);
        assert_eq!(hub.shared.state.lock().unwrap().channels.len(), 1);
        drop(a);
        assert!(hub.shared.state.lock().unwrap().channels.contains_key("c"));
        drop(b);
        assert!(hub.shared.state.lock().unwrap().channels.is_empty());
    }
}
