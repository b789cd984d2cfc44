//! The log events of tower-lock's own modules, captured by a tracing subscriber layer for
//! the tests that assert what is logged (`tracing::subscriber::set_default` on the test's
//! thread).

use std::{
    collections::BTreeMap,
    fmt,
    sync::{Arc, Mutex},
};

use tracing::{Event, Level, Subscriber, field::Field};
use tracing_subscriber::{Layer, layer::Context};

/// One captured event: its level and its fields (`message` included).
#[derive(Debug, Clone)]
pub(crate) struct Captured {
    pub(crate) level: Level,
    pub(crate) fields: BTreeMap<String, String>,
}

impl Captured {
    pub(crate) fn message(&self) -> &str {
        self.fields.get("message").map_or("", String::as_str)
    }
}

/// Captures the events of tower-lock's own modules.
#[derive(Clone, Default)]
pub(crate) struct Capture(Arc<Mutex<Vec<Captured>>>);

impl Capture {
    pub(crate) fn take(&self) -> Vec<Captured> {
        std::mem::take(&mut self.0.lock().unwrap())
    }
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: Subscriber> Layer<S> for Capture {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        if !event.metadata().target().starts_with("tower_lock") {
            return;
        }
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        self.0.lock().unwrap().push(Captured {
            level: *event.metadata().level(),
            fields,
        });
    }
}
