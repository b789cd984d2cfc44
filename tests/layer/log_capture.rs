//! The log events of tower-lock's own modules, captured by a tracing subscriber layer for
//! the tests that assert what is logged (`tracing::subscriber::set_default` on the test's
//! thread), with the names of the spans each was emitted in.

use std::{
    collections::BTreeMap,
    fmt,
    sync::{Arc, Mutex},
};

use tracing::{Event, Level, Subscriber, field::Field};
use tracing_subscriber::{Layer, layer::Context, registry::LookupSpan};

/// One captured event: its level, its fields (`message` included) and the names of the
/// spans it was emitted in, innermost first.
#[derive(Debug, Clone)]
pub(crate) struct Captured {
    pub(crate) level: Level,
    pub(crate) fields: BTreeMap<String, String>,
    pub(crate) spans: Vec<String>,
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

    /// The events captured so far, left in place.
    pub(crate) fn events(&self) -> Vec<Captured> {
        self.0.lock().unwrap().clone()
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

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        if !event.metadata().target().starts_with("tower_lock") {
            return;
        }
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        let spans = ctx
            .event_scope(event)
            .map(|scope| scope.map(|span| span.name().to_owned()).collect())
            .unwrap_or_default();
        self.0.lock().unwrap().push(Captured {
            level: *event.metadata().level(),
            fields,
            spans,
        });
    }
}
