//! Counts the waiters served by the fallback timer rather than by a wake-up message: the
//! backend logs each one (`debug`, "lock granted on the fallback timer's retry", with the
//! wake-up channel, which starts with the engine's key prefix).

use std::sync::{
    Arc, Mutex, OnceLock,
    atomic::{AtomicUsize, Ordering},
};

use tracing::{Event, Subscriber, field::Field};
use tracing_subscriber::{Layer, layer::Context, prelude::*};

/// How many waiters of this process were served by the fallback timer so far.
#[derive(Debug, Clone)]
pub struct Fallbacks(Arc<AtomicUsize>, Arc<Mutex<Vec<String>>>);

impl Fallbacks {
    /// The process-wide counter (installs the tracing subscriber on first use).
    pub fn install() -> Self {
        static SHARED: OnceLock<Fallbacks> = OnceLock::new();
        SHARED
            .get_or_init(|| {
                let counter = Self(Arc::default(), Arc::default());
                tracing_subscriber::registry()
                    .with(counter.clone())
                    .try_init()
                    .expect("no other tracing subscriber in this test binary");
                counter
            })
            .clone()
    }

    /// How many so far, under every prefix.
    pub fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }

    /// How many waiters on channels under `prefix` were served by the fallback timer so
    /// far: for a test that runs beside others that provoke such grants.
    pub fn count_under(&self, prefix: &str) -> usize {
        let channels = self.1.lock().unwrap();
        channels.iter().filter(|c| c.starts_with(prefix)).count()
    }

    /// Run `f`, and assert that no waiter was served by the fallback timer meanwhile, but
    /// for one: a waiter whose timer fires in the moment of its hand-off finds the grant by
    /// its retry, whose answer (on a command connection) can come before the message (on
    /// the subscriber's), and is counted though nothing was lost (seen in CI on a loaded
    /// machine). A wake-up path that is broken loses every hand-off to the waiters it
    /// serves: many in the cycles these tests run.
    pub async fn lost_none_while<T>(&self, what: &str, f: impl Future<Output = T>) -> T {
        let before = self.count();
        let out = f.await;
        let by_timer = self.count() - before;
        assert!(
            by_timer <= 1,
            "{by_timer} grants found by the fallback timer {what}"
        );
        out
    }
}

struct Message(bool, String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.0 |= format!("{value:?}").contains("fallback timer"),
            "channel" => self.1 = format!("{value:?}"),
            _ => {}
        }
    }
}

impl<S: Subscriber> Layer<S> for Fallbacks {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        if !event.metadata().target().starts_with("tower_lock") {
            return;
        }
        let mut message = Message(false, String::new());
        event.record(&mut message);
        if message.0 {
            self.1.lock().unwrap().push(message.1);
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}
