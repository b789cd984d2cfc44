//! The engines of a run, every one on one shared backend.

use std::sync::Arc;

use tower_lock::{LockEngine, MemoryBackend, engine::Backend};

use crate::config::Config;
use crate::support;

/// The engines for this run. Every engine shares one backend, as the servers of a fleet
/// share one Redis (or one Postgres database); for memory, the `MemoryBackend` is also returned for `key_count()`.
pub(crate) async fn engines(
    config: &Config,
) -> Result<(Vec<LockEngine>, Option<Arc<MemoryBackend>>), String> {
    match config.backend.as_str() {
        "memory" => {
            let backend = Arc::new(MemoryBackend::new());
            let engines = (0..config.engines)
                .map(|_| LockEngine::from_arc(backend.clone() as Arc<dyn Backend>))
                .collect();
            Ok((engines, Some(backend)))
        }
        #[cfg(feature = "postgres")]
        "postgres" => {
            let mut engines = Vec::with_capacity(config.engines);
            for _ in 0..config.engines {
                engines.push(crate::postgres::database().engine(config.pool).await?);
            }
            Ok((engines, None))
        }
        _ => {
            let url = config.redis_url.as_deref().expect("checked in from_args");
            let mut engines = Vec::with_capacity(config.engines);
            for _ in 0..config.engines {
                engines.push(if config.backend == "redis-cluster" {
                    support::redis_cluster_engine(url, "bench").await?
                } else {
                    support::redis_engine(url, "bench").await?
                });
            }
            Ok((engines, None))
        }
    }
}
