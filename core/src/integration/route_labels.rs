//! [`RouteLabels`]: the engine's holder label with each route template, made once.

use std::sync::{PoisonError, RwLock};

use tower_lock_engine::HolderLabel;

/// How many routes' labels are kept. Route templates are a router's, a bounded set; a layer
/// that meets more makes the others per request, as it did before.
const KEPT: usize = 64;

/// The holder label of each route a layer's requests matched (the engine's label, a space
/// and the route template: who holds a key, for `holders()` and `tower-lock-cli status`),
/// made once per route rather than once per request. Made per request it was an
/// allocation and a copy, about 700 instructions of the 11,000 the layer adds to an axum
/// request.
#[derive(Default)]
pub(super) struct RouteLabels(RwLock<Vec<(Box<str>, HolderLabel)>>);

impl RouteLabels {
    /// `engine`'s label with `route`.
    pub(super) fn get(&self, engine: &HolderLabel, route: &str) -> HolderLabel {
        let kept = |labels: &[(Box<str>, HolderLabel)]| {
            labels
                .iter()
                .find(|(r, _)| **r == *route)
                .map(|(_, label)| label.clone())
        };
        if let Some(label) = kept(&self.0.read().unwrap_or_else(PoisonError::into_inner)) {
            return label;
        }
        let label = engine.with_detail(route);
        let mut labels = self.0.write().unwrap_or_else(PoisonError::into_inner);
        if labels.len() < KEPT && kept(&labels).is_none() {
            labels.push((route.into(), label.clone()));
        }
        label
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_route_gets_its_own_label_and_the_kept_ones_are_bounded() {
        let engine = HolderLabel::new("node-1").unwrap();
        let labels = RouteLabels::default();
        for round in 0..2 {
            for i in 0..100 {
                let route = format!("/r{i}/{{id}}");
                let label = labels.get(&engine, &route);
                assert_eq!(label.as_str(), format!("node-1 {route}"), "round {round}");
            }
        }
        assert_eq!(labels.0.read().unwrap().len(), KEPT);
        // A control character in a route is replaced, kept or not.
        assert_eq!(labels.get(&engine, "/a\nb").as_str(), "node-1 /a?b");
    }
}
