//! The log events of tower-lock's own modules, and the server notices sqlx logs (target
//! `sqlx::postgres::notice`), captured by a process-wide tracing subscriber (the servers answer on threads of their own, which a thread's default
//! subscriber would not see). Tests running at once tell their events apart by a field
//! of their own (the layer's records table, in a schema of the test's own).

use std::{
    collections::BTreeMap,
    fmt,
    sync::{Mutex, Once},
};

use tracing::{Event, Subscriber, field::Field};
use tracing_subscriber::{Layer, layer::Context, prelude::*};

/// The target of the server's notices as sqlx logs them.
pub(crate) const NOTICES: &str = "sqlx::postgres::notice";

/// Every captured event's fields (`message` included), in order.
static EVENTS: Mutex<Vec<BTreeMap<String, String>>> = Mutex::new(Vec::new());

struct Capture;

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
        let target = event.metadata().target();
        if !target.starts_with("tower_lock") && target != NOTICES {
            return;
        }
        let mut fields = BTreeMap::new();
        fields.insert("target".to_owned(), target.to_owned());
        event.record(&mut Fields(&mut fields));
        EVENTS.lock().unwrap().push(fields);
    }
}

/// Start capturing (once per process; later calls do nothing).
pub(crate) fn capture() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Capture))
            .expect("no other global subscriber in this binary");
    });
}

/// The captured events whose `field` contains `value`.
pub(crate) fn events_with(field: &str, value: &str) -> Vec<BTreeMap<String, String>> {
    EVENTS
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e.get(field).is_some_and(|v| v.contains(value)))
        .cloned()
        .collect()
}
