//! What a scenario runs on: a framework serving its routes, a backend under its engines.

use std::sync::Arc;

use tower_lock::LockLayer;

use super::{Backend, Framework, LockTable, Routes};
use crate::{gate::GateControl, http::TestServer};

/// A framework serving a scenario's routes and the backend under its engines.
#[derive(Clone, Copy, Debug)]
pub struct Stack {
    /// Serves the routes.
    pub framework: Framework,
    /// Runs the engines.
    pub backend: Backend,
}

impl Stack {
    /// `framework` over `backend`.
    pub fn new(framework: Framework, backend: Backend) -> Self {
        Self { framework, backend }
    }

    /// A fresh lock table for the scenario `name` (see [`Backend::table`]), its prefix
    /// naming the framework too, so a residue message says which instance left a key.
    pub async fn table(self, name: &str) -> LockTable {
        let framework = match self.framework {
            Framework::Tower => "tower",
            Framework::Actix => "actix",
        };
        self.backend.table(&format!("{framework}-{name}")).await
    }

    /// Serve `routes` (see [`Framework::serve`]).
    pub async fn serve(self, routes: Routes) -> Arc<TestServer> {
        self.framework.serve(routes).await
    }

    /// Serve `POST /work` under `layer` (see [`Framework::serve_gated`]).
    pub async fn serve_gated(self, layer: &LockLayer) -> (Arc<TestServer>, GateControl) {
        self.framework.serve_gated(layer).await
    }
}
