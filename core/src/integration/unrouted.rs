//! [`UnroutedLog`]: a layer installed around axum's fallback (with `Router::layer` rather
//! than `Router::route_layer`) sees the requests that matched no route. It lets them
//! through unlocked, so that axum still answers them `404` (and `405`), and says once why.
//!
//! Under the `axum` feature the sign is axum's own: its router puts `OriginalUri` in every
//! request it routes and `MatchedPath` in every request that matched a route, so a request
//! with the first and not the second is on its way to the fallback, or to a service
//! mounted with `Router::nest_service` and wrapped from outside (axum gives those no
//! `MatchedPath` either, and no public sign before the mount's own `NestedPath` that tells
//! them apart; a layer on the nested service itself sees that one and locks): such a
//! mount passes too, and the warning names
//! `route_service("/prefix/{*rest}", ..)` as the way to lock it. Without the feature, or
//! outside an axum router, nothing is detected and the layer keys the request as before.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use crate::key::RequestView;

/// Whether `req` went through an axum router that matched no route for it.
#[cfg(feature = "axum")]
pub(super) fn is_unrouted(req: &dyn RequestView) -> bool {
    req.extensions().is_some_and(|e| {
        e.get::<axum::extract::OriginalUri>().is_some()
            && e.get::<axum::extract::MatchedPath>().is_none()
            // A layer on a nested service (inside `nest_service`) sees the `NestedPath`
            // its mount set: a route, locked as any.
            && e.get::<axum::extract::NestedPath>().is_none()
    })
}

#[cfg(not(feature = "axum"))]
pub(super) fn is_unrouted(_: &dyn RequestView) -> bool {
    false
}

/// The one warning of a layer that wraps a router's fallback.
#[derive(Debug, Default)]
pub(super) struct UnroutedLog {
    logged: AtomicBool,
}

impl UnroutedLog {
    /// A request for `path` matched no route, and `layer` let it through unlocked: logged
    /// the first time only (every unknown path would repeat it, and the fix is one line).
    pub(super) fn passed(&self, layer: &str, path: &str) {
        if self.logged.swap(true, Relaxed) {
            return;
        }
        tracing::warn!(
            layer,
            path,
            "tower-lock layer sees a request that matched no route: it wraps the router's fallback (installed with Router::layer; use Router::route_layer) or a Router::nest_service mount (mount it with route_service(\"/prefix/{{*rest}}\", ..) to lock it); such requests pass through unlocked, so a 404 stays one"
        );
    }
}
