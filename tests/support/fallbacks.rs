//! Counts the waiters served by the fallback timer rather than by a wake-up message: the
//! backend logs each one (`debug`, "lock granted on the fallback timer's retry").

use std::sync::{
    Arc, OnceLock,
    atomic::{AtomicUsize, Ordering},
};

use tracing::{Event, Subscriber, field::Field};
use tracing_subscriber::{Layer, layer::Context, prelude::*};

/// How many waiters of this process were served by the fallback timer so far.
#[derive(Clone)]
pub(crate) struct Fallbacks(Arc<AtomicUsize>);

impl Fallbacks {
    /// The process-wide counter (installs the tracing subscriber on first use).
    pub(crate) fn install() -> Fallbacks {
        static SHARED: OnceLock<Fallbacks> = OnceLock::new();
        SHARED
            .get_or_init(|| {
                let counter = Fallbacks(Arc::default());
                tracing_subscriber::registry()
                    .with(counter.clone())
                    .try_init()
                    .expect("no other tracing subscriber in this test binary");
                counter
            })
            .clone()
    }

    pub(crate) fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }

    /// Run `f`, and assert that no waiter was served by the fallback timer meanwhile.
    #[allow(dead_code)] // Not every test binary that counts them needs this.
    pub(crate) async fn none_while<T>(&self, what: &str, f: impl Future<Output = T>) -> T {
        let before = self.count();
        let out = f.await;
        assert_eq!(
            self.count() - before,
            0,
            "grants found by the fallback timer {what}"
        );
        out
    }
}

struct Message(bool);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 |= format!("{value:?}").contains("fallback timer");
        }
    }
}

impl<S: Subscriber> Layer<S> for Fallbacks {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        if !event.metadata().target().starts_with("tower_lock") {
            return;
        }
        let mut message = Message(false);
        event.record(&mut message);
        if message.0 {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}
