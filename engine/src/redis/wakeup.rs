//! Wake-ups: one pub/sub subscriber connection per backend, fanned out to local waiters.
//!
//! Waiters register a [`Subscription`] on their key's channel with their ticket id.
//! Channels are reference counted: the first local waiter of a key subscribes; after the
//! last one leaves, the channel stays subscribed for [`LINGER`] (a key contended once is
//! likely contended again soon, and a subscription already in place spares the next waiter
//! a round trip: see [`Wakeup::mark`]). One background task owns the subscriber connection
//! (`task`, the one reconnect loop; its connection is one server's, `single`, or a Redis
//! Cluster's, in the cluster module): it reconciles the wanted channels
//! with the subscribed ones (batched SUBSCRIBE / UNSUBSCRIBE, `reconcile`); messages are
//! dispatched as the connection reads them (RESP3 pushes, `pushes`); and when the
//! connection breaks the task reconnects, resubscribes every wanted channel, and wakes every
//! local waiter once to retry (a grant may have been published while it was away).
//!
//! A message is a grant, `"<ticket id>|<registration nonce> <fence> <px>"`: it wakes exactly the
//! waiter holding that ticket, if it waits here. A grant that arrives before its waiter has
//! registered here (the grant can overtake the reply to the attempt that queued it: they
//! travel on different connections) is kept for a moment in a short list of unclaimed
//! grants, where [`Wakeup::subscribe`] finds it.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex, Weak},
    time::Duration,
};

use tokio::{sync::Notify, task::JoinHandle, time::Instant};

use crate::BoxFuture;

mod pushes;
mod reconcile;
mod single;
pub(crate) mod task;

pub(crate) use pushes::{Pushes, pushes};
pub(crate) use reconcile::{Event, Sink, next_event, reconcile, timeout};
pub(crate) use single::single;

/// How long a channel stays subscribed after its last local waiter left.
const LINGER: Duration = Duration::from_secs(1);
/// How many unclaimed grants are kept (the newest). One is claimed microseconds after it
/// arrives, or never (it was another node's).
const UNCLAIMED: usize = 64;

/// What woke a waiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Woken {
    /// The key was handed to this waiter's ticket, in its registration `nonce`, at
    /// `fence`, for `px` ms (the expiry the script set).
    Granted { nonce: u64, fence: u64, px: u64 },
    /// The subscriber reconnected: grants may have been missed, so retry.
    Retry,
}

/// Starts a hub's subscriber task, the one that owns the subscriber connection: on one
/// server ([`single`]), or on a Redis Cluster. Called again should the task ever end.
pub(crate) type Subscriber = Box<dyn Fn(Weak<HubState>) -> BoxFuture<'static, ()> + Send + Sync>;

/// The per-backend wake-up hub.
pub(crate) struct Wakeup {
    shared: Arc<HubState>,
}

/// The hub's state, shared with its subscriber task.
pub(crate) struct HubState {
    subscriber: Subscriber,
    /// The limit on connecting and on each subscription command.
    pub(crate) connect_timeout: Duration,
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
    /// confirmation (numbers are never reused, so an unchanged number means "subscribed
    /// all along").
    subscribed: HashMap<String, u64>,
    /// Subscribed channels nobody here waits on any more, since when.
    idle: HashMap<String, Instant>,
    /// Grants that arrived for no local waiter (yet), oldest first.
    unclaimed: VecDeque<UnclaimedGrant>,
    /// The last event number handed out.
    events: u64,
    next_id: u64,
    task: Option<JoinHandle<()>>,
}

/// A grant that arrived before (or without) the waiter holding its ticket here.
struct UnclaimedGrant {
    /// The wake-up channel it was published on.
    channel: String,
    /// The ticket id it was granted to.
    ticket: String,
    grant: Woken,
}

#[derive(Default)]
struct Channel {
    waiters: Vec<Slot>,
}

struct Slot {
    id: u64,
    ticket: String,
    woken: Option<Woken>,
    notify: Arc<Notify>,
}

impl Wakeup {
    pub(crate) fn new(subscriber: Subscriber, connect_timeout: Duration) -> Self {
        Self {
            shared: Arc::new(HubState {
                subscriber,
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

    /// Register a local waiter with ticket `ticket` on `channel`.
    ///
    /// `mark` is what [`Wakeup::mark`] said before the attempt that queued the ticket. If
    /// the channel has been subscribed ever since, the subscription is
    /// [covered](Subscription::covered): every grant published after that attempt reaches
    /// this waiter (here, or in the unclaimed grants), so it need not retry before waiting.
    pub(crate) fn subscribe(&self, channel: &str, ticket: &str, mark: Option<u64>) -> Subscription {
        let notify = Arc::new(Notify::new());
        let mut st = self.shared.state.lock().unwrap();
        let covered = mark.is_some() && st.subscribed.get(channel).copied() == mark;
        let id = st.next_id;
        st.next_id += 1;
        let woken = st
            .unclaimed
            .iter()
            .position(|u| u.channel == channel && u.ticket == ticket)
            .and_then(|i| st.unclaimed.remove(i))
            .map(|u| u.grant);
        if woken.is_some() {
            notify.notify_one();
        }
        st.idle.remove(channel);
        let entry = st.channels.entry(channel.to_owned()).or_default();
        let first = entry.waiters.is_empty();
        entry.waiters.push(Slot {
            id,
            ticket: ticket.to_owned(),
            woken,
            notify: notify.clone(),
        });
        let wanted = first && !st.subscribed.contains_key(channel);
        // Start (or restart, should it ever end) the subscriber task, on the engine's
        // runtime: on a user runtime, a blocked runtime would stop every wake-up of the
        // engine's other runtimes (their waiters left to the fallback timer), and a
        // runtime shut down would end the task.
        if st.task.as_ref().is_none_or(JoinHandle::is_finished) {
            st.subscribed.clear();
            let task = (self.shared.subscriber)(Arc::downgrade(&self.shared));
            st.task = Some(crate::runtime::handle().spawn(task));
        }
        drop(st);
        if wanted {
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

/// One local waiter's registration. Dropping it deregisters.
pub(crate) struct Subscription {
    shared: Arc<HubState>,
    channel: String,
    id: u64,
    notify: Arc<Notify>,
    covered: bool,
}

impl Subscription {
    /// Whether no grant can have gone unheard between the attempt before this
    /// subscription and the subscription itself (see [`Wakeup::subscribe`]).
    pub(crate) fn covered(&self) -> bool {
        self.covered
    }

    /// Resolves once the channel is subscribed on the live connection: from then on, no
    /// grant can go unheard (short of a connection loss, which wakes everyone).
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

    /// Resolves when this waiter is woken: its grant, or a reconnect.
    pub(crate) async fn woken(&self) -> Woken {
        loop {
            if let Some(woken) = self.take() {
                return woken;
            }
            self.notify.notified().await;
        }
    }

    /// Whether a grant for this waiter has arrived and not been taken yet.
    pub(crate) fn granted(&self) -> bool {
        let st = self.shared.state.lock().unwrap();
        st.channels
            .get(&self.channel)
            .and_then(|c| c.waiters.iter().find(|s| s.id == self.id))
            .is_some_and(|s| matches!(s.woken, Some(Woken::Granted { .. })))
    }

    fn take(&self) -> Option<Woken> {
        let mut st = self.shared.state.lock().unwrap();
        st.channels
            .get_mut(&self.channel)
            .and_then(|c| c.waiters.iter_mut().find(|s| s.id == self.id))
            .and_then(|s| s.woken.take())
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut st = self.shared.state.lock().unwrap();
        let Some(channel) = st.channels.get_mut(&self.channel) else {
            return;
        };
        channel.waiters.retain(|s| s.id != self.id);
        if channel.waiters.is_empty() {
            st.channels.remove(&self.channel);
            if st.subscribed.contains_key(&self.channel) {
                st.idle.insert(self.channel.clone(), Instant::now());
            }
            drop(st);
            self.shared.changed.notify_one();
        }
    }
}

/// Route one grant to the waiter holding its ticket, or keep it for a moment.
fn dispatch(shared: &HubState, channel: &str, payload: &[u8]) {
    let Some((ticket, grant)) = parse_grant(payload) else {
        tracing::debug!(channel, "malformed lock wake-up message ignored");
        return;
    };
    let mut st = shared.state.lock().unwrap();
    if let Some(slot) = st
        .channels
        .get_mut(channel)
        .and_then(|c| c.waiters.iter_mut().find(|s| s.ticket == ticket))
    {
        slot.woken = Some(grant);
        slot.notify.notify_one();
        return;
    }
    if st.unclaimed.len() == UNCLAIMED {
        st.unclaimed.pop_front();
    }
    st.unclaimed.push_back(UnclaimedGrant {
        channel: channel.to_owned(),
        ticket: ticket.to_owned(),
        grant,
    });
}

/// `"<ticket>|<nonce> <fence> <px>"`.
fn parse_grant(payload: &[u8]) -> Option<(&str, Woken)> {
    let text = std::str::from_utf8(payload).ok()?;
    let (ticket, rest) = text.split_once('|')?;
    let (nonce, rest) = rest.split_once(' ')?;
    let (fence, px) = rest.split_once(' ')?;
    let grant = Woken::Granted {
        nonce: nonce.parse().ok()?,
        fence: fence.parse().ok()?,
        px: px.parse().ok()?,
    };
    Some((ticket, grant))
}

impl HubState {
    /// Subscriptions the connection no longer has: every one (`None`: the connection is
    /// gone), or `Some` channel's (the server ended it: its node no longer serves the
    /// channel's slot). They are subscribed again at the next reconciliation. Returns
    /// whether any was ours (ours are forgotten before we send an unsubscribe, so one we
    /// ended is not found here).
    pub(crate) fn forget_subscriptions(&self, only: Option<&str>) -> bool {
        let mut st = self.state.lock().unwrap();
        match only {
            None => {
                st.idle.clear();
                let any = !st.subscribed.is_empty();
                st.subscribed.clear();
                any
            }
            Some(channel) => {
                st.idle.remove(channel);
                st.subscribed.remove(channel).is_some()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::connector::Connector;

    fn hub() -> Wakeup {
        // Nothing listens on port 1: the subscriber task just keeps retrying.
        let client = redis::Client::open("redis://127.0.0.1:1").unwrap();
        let timeout = Duration::from_millis(100);
        let connector = Arc::new(Connector::new(Box::new(client), timeout));
        Wakeup::new(single(connector), timeout)
    }

    fn woken(subs: &[Subscription]) -> Vec<Option<Woken>> {
        subs.iter()
            .map(|s| match tokio_test::task::spawn(s.woken()).poll() {
                std::task::Poll::Ready(w) => Some(w),
                std::task::Poll::Pending => None,
            })
            .collect()
    }

    const GRANT: Option<Woken> = Some(Woken::Granted {
        nonce: 17,
        fence: 42,
        px: 3000,
    });

    #[tokio::test]
    async fn a_grant_wakes_only_the_waiter_holding_its_ticket() {
        let hub = hub();
        let subs = vec![
            hub.subscribe("c", "t1", None),
            hub.subscribe("c", "t2", None),
        ];
        dispatch(&hub.shared, "c", b"t2|17 42 3000");
        assert_eq!(woken(&subs), [None, GRANT]);
        // Another node's ticket: nobody here.
        dispatch(&hub.shared, "c", b"t9|17 42 3000");
        assert_eq!(woken(&subs), [None, None]);
    }

    #[tokio::test]
    async fn a_grant_that_overtakes_its_waiter_is_kept_for_it() {
        let hub = hub();
        dispatch(&hub.shared, "c", b"t1|17 42 3000");
        dispatch(&hub.shared, "other", b"t2|17 42 3000");
        let subs = vec![
            hub.subscribe("c", "t1", None),
            hub.subscribe("c", "t2", None),
        ];
        assert_eq!(woken(&subs), [GRANT, None]);
    }

    #[tokio::test]
    async fn malformed_messages_wake_nobody() {
        let hub = hub();
        let subs = vec![hub.subscribe("c", "t1", None)];
        for bad in [
            &b""[..],
            b"t1",
            b"t1|x 42 1",
            b"t1|17",
            b"t1|17 42",
            b"\xff|1 2 3",
        ] {
            dispatch(&hub.shared, "c", bad);
        }
        assert_eq!(woken(&subs), [None]);
    }

    #[tokio::test]
    async fn channels_are_reference_counted() {
        let hub = hub();
        let a = hub.subscribe("c", "t1", None);
        let b = hub.subscribe("c", "t2", None);
        assert_eq!(hub.shared.state.lock().unwrap().channels.len(), 1);
        drop(a);
        assert!(hub.shared.state.lock().unwrap().channels.contains_key("c"));
        drop(b);
        assert!(hub.shared.state.lock().unwrap().channels.is_empty());
    }
}
