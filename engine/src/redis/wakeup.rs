//! Wake-ups: one pub/sub subscriber connection per backend, fanned out to local waiters.
//!
//! Waiters register a [`Subscription`] on their key's channel with their ticket id.
//! Channels are reference counted: the first local waiter of a key subscribes; after the
//! last one leaves, the channel stays subscribed for [`LINGER`] (a key contended once is
//! likely contended again soon, and a subscription already in place spares the next waiter
//! a round trip: see [`Wakeup::mark`]). One background task owns the subscriber connection.
//! It reconciles the wanted channels with the subscribed ones (batched SUBSCRIBE /
//! UNSUBSCRIBE); messages are dispatched as the connection reads them (RESP3 pushes, see
//! `run_single`); and when the connection breaks the task reconnects,
//! resubscribes every wanted channel, and wakes every local waiter once to retry (a grant
//! may have been published while it was away).
//!
//! A message is a grant, `"<ticket id>|<ticket deadline> <fence> <px>"`: it wakes exactly the
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

#[cfg(test)]
use super::connection::ClientSource;
use super::connection::Connector;

/// How long a channel stays subscribed after its last local waiter left.
const LINGER: Duration = Duration::from_secs(1);
/// How many unclaimed grants are kept (the newest). One is claimed microseconds after it
/// arrives, or never (it was another node's).
const UNCLAIMED: usize = 64;

/// What woke a waiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Woken {
    /// The key was handed to this waiter's ticket, registered with `deadline`, at `fence`,
    /// for `px` ms (the expiry the script set).
    Granted { deadline: u64, fence: u64, px: u64 },
    /// The subscriber reconnected: grants may have been missed, so retry.
    Retry,
}

/// How the subscriber connection is made.
// One per backend, made once: its size does not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Subscriber {
    /// One server: a RESP3 connection (`SUBSCRIBE`, messages as pushes), made through the
    /// command pool's connector (for Sentinel: to the primary it names now).
    Single { connector: Arc<Connector> },
    /// A cluster: a RESP3 cluster connection whose pushes arrive on the sender handed to
    /// this function, subscribed with `SSUBSCRIBE`.
    #[cfg(feature = "redis-cluster")]
    Cluster(Box<ClusterSubscriber>),
}

/// Makes a cluster client that sends its pushes to the given sender.
#[cfg(feature = "redis-cluster")]
pub(crate) type ClusterSubscriber =
    dyn Fn(Pushes) -> redis::RedisResult<redis::cluster::ClusterClient> + Send + Sync;

/// The push sender of a subscriber connection.
///
/// A published message is dispatched right where redis-rs reads it, in the connection's
/// own driver task: the woken waiter is one task hop from the socket, not two (through a
/// channel, another task would have to be scheduled first). Every other push (a dropped
/// connection, a subscription the server ended, confirmations) goes to the subscriber
/// task on `control`.
pub(crate) struct Pushes {
    shared: Weak<Shared>,
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
fn pushes(
    shared: &Weak<Shared>,
) -> (
    Pushes,
    tokio::sync::mpsc::UnboundedReceiver<redis::PushInfo>,
) {
    let (control, rx) = tokio::sync::mpsc::unbounded_channel();
    let shared = shared.clone();
    (Pushes { shared, control }, rx)
}

/// The per-backend wake-up hub.
pub(crate) struct Wakeup {
    shared: Arc<Shared>,
}

struct Shared {
    subscriber: Subscriber,
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
    /// confirmation (numbers are never reused, so an unchanged number means "subscribed
    /// all along").
    subscribed: HashMap<String, u64>,
    /// Subscribed channels nobody here waits on any more, since when.
    idle: HashMap<String, Instant>,
    /// Grants that arrived for no local waiter: `(channel, ticket id, grant)`.
    unclaimed: VecDeque<(String, String, Woken)>,
    /// The last event number handed out.
    events: u64,
    next_id: u64,
    task: Option<JoinHandle<()>>,
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
        Wakeup {
            shared: Arc::new(Shared {
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
            .position(|(c, t, _)| c == channel && t == ticket)
            .and_then(|i| st.unclaimed.remove(i))
            .map(|(_, _, grant)| grant);
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
            st.task = Some(crate::runtime::handle().spawn(run(Arc::downgrade(&self.shared))));
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
    shared: Arc<Shared>,
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
fn dispatch(shared: &Shared, channel: &str, payload: &[u8]) {
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
    st.unclaimed
        .push_back((channel.to_owned(), ticket.to_owned(), grant));
}

/// `"<ticket>|<deadline> <fence> <px>"`.
fn parse_grant(payload: &[u8]) -> Option<(&str, Woken)> {
    let text = std::str::from_utf8(payload).ok()?;
    let (ticket, rest) = text.split_once('|')?;
    let (deadline, rest) = rest.split_once(' ')?;
    let (fence, px) = rest.split_once(' ')?;
    let grant = Woken::Granted {
        deadline: deadline.parse().ok()?,
        fence: fence.parse().ok()?,
        px: px.parse().ok()?,
    };
    Some((ticket, grant))
}

/// The subscriber task, on one server or on a cluster.
async fn run(weak: Weak<Shared>) {
    let Some(shared) = weak.upgrade() else { return };
    match &shared.subscriber {
        Subscriber::Single { connector } => {
            let connector = connector.clone();
            drop(shared);
            run_single(weak, connector).await;
        }
        #[cfg(feature = "redis-cluster")]
        Subscriber::Cluster(_) => {
            drop(shared);
            cluster::run(weak).await;
        }
    }
}

/// Whether a subscription failed because the server refused it (`NOPERM`: an ACL user
/// without rights on the engine's channels). It will refuse the next attempt too, so the
/// pause before it grows (logged at `warn`); any other failure (a timeout, a slot without
/// a primary in a failover) is retried after the shortest pause, which `backoff` is reset
/// to.
fn refused(error: &redis::RedisError, backoff: &mut Duration) -> bool {
    let refused = error.code() == Some("NOPERM");
    if refused {
        tracing::warn!(%error, "lock wake-up subscription refused; retrying with a backoff");
        *backoff = (*backoff * 2).min(Duration::from_secs(1));
    } else {
        *backoff = Duration::from_millis(50);
    }
    refused
}

/// The subscriber task on one server: connect, reconcile; reconnect with backoff on
/// failure. The connection speaks RESP3, so messages arrive as pushes (see [`Pushes`]).
async fn run_single(weak: Weak<Shared>, connector: Arc<Connector>) {
    let mut backoff = Duration::from_millis(50);
    let mut reconnecting = false;
    loop {
        let Some(shared) = weak.upgrade() else { return };
        let (push, mut rx) = pushes(&weak);
        let connect = connect_single(&connector, push, shared.connect_timeout);
        let Some(mut conn) = connected(&shared, connect).await else {
            drop(shared);
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
            reconnecting = true;
            continue;
        };
        if reconnecting {
            tracing::info!("lock wake-up subscriber reconnected");
        }
        // Whether the session ended in an error of ours (a refused or timed-out
        // subscription) rather than a connection that dropped after working.
        let mut failed = false;
        let mut first = true;
        loop {
            if !first {
                match next_event(&shared, &mut rx).await {
                    Event::Reconcile => {}
                    // The connection dropped (the only push that comes here but
                    // subscription confirmations, which need nothing).
                    Event::Push(push) if push.kind == redis::PushKind::Disconnection => break,
                    Event::Push(_) => continue,
                    Event::Closed => break,
                }
            }
            let resubscribed = first && reconnecting;
            first = false;
            if let Err(error) = reconcile(&shared, Sink::Single(&mut conn), resubscribed).await {
                // A `NOPERM` (an ACL user without channel rights), a timeout: the server
                // may well accept the next connection and refuse again, so the pause
                // below is taken before it (not only after a failed connect); it grows
                // after a refusal.
                if !refused(&error, &mut backoff) {
                    tracing::debug!(%error, "lock wake-up subscriber failed");
                }
                failed = true;
                break;
            }
            // A subscription went through: the next failure starts backing off afresh.
            backoff = Duration::from_millis(50);
        }
        shared.forget_subscriptions();
        tracing::warn!("lock wake-up subscriber connection lost; reconnecting");
        // The command connections are left alone: they have their own failures to retire
        // them (and a subscriber refused its channels says nothing about them).
        reconnecting = true;
        drop(shared);
        if failed {
            tokio::time::sleep(backoff).await;
        }
    }
}

/// The subscriber connection `connect` makes, within the connect timeout; `None` (logged)
/// when it fails, and the caller backs off.
async fn connected<T>(
    shared: &Shared,
    connect: impl Future<Output = Result<T, redis::RedisError>>,
) -> Option<T> {
    match tokio::time::timeout(shared.connect_timeout, connect).await {
        Ok(Ok(conn)) => Some(conn),
        Ok(Err(error)) => {
            tracing::debug!(%error, "lock wake-up subscriber could not connect");
            None
        }
        Err(_) => {
            tracing::debug!("lock wake-up subscriber connect timed out");
            None
        }
    }
}

/// What the subscriber task waits for between reconciliations.
enum Event {
    /// A push other than a message (messages are dispatched by [`Pushes`]).
    Push(redis::PushInfo),
    /// The connection's push sender is gone: so is the connection.
    Closed,
    /// The wanted channels changed, or an idle channel has lingered long enough to be
    /// unsubscribed: reconcile.
    Reconcile,
}

async fn next_event(
    shared: &Shared,
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

impl Shared {
    /// The connection is gone, and with it every subscription.
    fn forget_subscriptions(&self) {
        let mut st = self.state.lock().unwrap();
        st.subscribed.clear();
        st.idle.clear();
    }
}

/// A RESP3 connection to the server the connector names now (for Sentinel: the current
/// primary), sending its pushes to `push`.
async fn connect_single(
    connector: &Connector,
    push: Pushes,
    timeout: Duration,
) -> Result<redis::aio::MultiplexedConnection, redis::RedisError> {
    let client = connector.client().await?;
    let info = client.get_connection_info().clone();
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(redis::ProtocolVersion::RESP3);
    let client = redis::Client::open(info.set_redis_settings(settings))?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
        .set_push_sender(push);
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

/// Where subscriptions are sent.
enum Sink<'a> {
    Single(&'a mut redis::aio::MultiplexedConnection),
    #[cfg(feature = "redis-cluster")]
    Cluster(&'a mut redis::cluster_async::ClusterConnection),
}

/// Bring the connection's subscriptions in line with the wanted channels. With
/// `wake_all`, the waiters of every channel (re)subscribed here retry once it is
/// confirmed (grants published while it was not subscribed were lost).
async fn reconcile(
    shared: &Shared,
    mut sink: Sink<'_>,
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
            match &mut sink {
                Sink::Single(sink) => timeout(limit, sink.subscribe(&to_sub)).await?,
                // One channel per command: each is routed to its own slot's node, and a
                // multi-slot SSUBSCRIBE is refused (CROSSSLOT).
                #[cfg(feature = "redis-cluster")]
                Sink::Cluster(conn) => {
                    for c in &to_sub {
                        timeout(limit, conn.ssubscribe(c)).await?;
                    }
                }
            }
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
            match &mut sink {
                Sink::Single(sink) => timeout(limit, sink.unsubscribe(&to_unsub)).await?,
                #[cfg(feature = "redis-cluster")]
                Sink::Cluster(conn) => {
                    for c in &to_unsub {
                        timeout(limit, conn.sunsubscribe(c)).await?;
                    }
                }
            }
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

#[cfg(feature = "redis-cluster")]
mod cluster;

#[cfg(test)]
mod tests {
    use super::*;

    fn hub() -> Wakeup {
        // Nothing listens on port 1: the subscriber task just keeps retrying.
        let client = redis::Client::open("redis://127.0.0.1:1").unwrap();
        let timeout = Duration::from_millis(100);
        let connector = Arc::new(Connector::new(ClientSource::Fixed(client), timeout));
        Wakeup::new(Subscriber::Single { connector }, timeout)
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
        deadline: 17,
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
