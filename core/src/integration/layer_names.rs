//! [`LayerNames`]: the names of the live layers of each engine, so that `build()` warns
//! when a layer takes a default name another layer on its engine already has. Two such
//! layers (two `RouteKey` layers are both `axum-route`) would mix their series and their
//! logs under one `layer` label.

use std::sync::{Arc, Mutex, Weak};

use super::locker::Shared;

/// The live layers, held weakly: a layer that is dropped leaves by itself.
static LIVE: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());

/// The registry of live layers' names.
pub(super) struct LayerNames;

impl LayerNames {
    /// Register the layer `shared`, built with a default name when `defaulted`: warns
    /// when a live layer on the same engine already has that name.
    pub(super) fn register(shared: &Arc<Shared>, defaulted: bool) {
        let mut live = LIVE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        live.retain(|layer| layer.strong_count() > 0);
        let name = &shared.config.name;
        let taken = live
            .iter()
            .filter_map(Weak::upgrade)
            .any(|other| other.config.name == *name && other.engine.same_engine(&shared.engine));
        live.push(Arc::downgrade(shared));
        drop(live);
        if taken && defaulted {
            tracing::warn!(
                layer = name.as_str(),
                "two tower-lock layers on one engine are both named {name:?} in their metrics and logs (the default: the namespace, else the key's kind); give each a name with metrics_name(..) or a namespace(..)"
            );
        }
    }
}
