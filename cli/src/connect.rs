//! The engine over the store the arguments name, built with the engine's own builders (so
//! the same prefix, schema and table prefix rules apply), and the Redis nodes `list`
//! scans.

use tower_lock_engine::{LockEngine, postgres::PostgresBackend, redis::RedisBackend};

use crate::{args::Store, output::Failure};

/// The Redis prefix when none is given: the builder's default.
pub(crate) const DEFAULT_PREFIX: &str = "tower-lock";

/// Which store the arguments name: exactly one.
pub(crate) enum Which<'a> {
    Redis(&'a str),
    Cluster(&'a [String]),
    Sentinel(&'a [String], &'a str),
    Postgres(&'a str),
}

pub(crate) fn which(store: &Store) -> Result<Which<'_>, Failure> {
    let mut found = Vec::new();
    if let Some(url) = &store.redis {
        found.push(Which::Redis(url));
    }
    if !store.redis_cluster.is_empty() {
        found.push(Which::Cluster(&store.redis_cluster));
    }
    if !store.redis_sentinel.is_empty() {
        let service = store
            .sentinel_service
            .as_deref()
            .ok_or_else(|| Failure::usage("--redis-sentinel needs --sentinel-service NAME"))?;
        found.push(Which::Sentinel(&store.redis_sentinel, service));
    }
    if let Some(url) = &store.postgres {
        found.push(Which::Postgres(url));
    }
    match found.len() {
        1 => Ok(found.pop().expect("one")),
        0 => Err(Failure::usage(
            "name the store: --redis, --redis-cluster, --redis-sentinel or --postgres",
        )),
        _ => Err(Failure::usage("name one store only")),
    }
}

/// An engine on the store, labelled with nothing (the tool never holds a key).
pub(crate) async fn engine(store: &Store) -> Result<LockEngine, Failure> {
    let prefix = store.prefix.as_deref().unwrap_or(DEFAULT_PREFIX);
    let engine = match which(store)? {
        Which::Redis(url) => LockEngine::new(
            RedisBackend::builder(url)
                .prefix(prefix)
                // The tool reads and releases; the services' servers were checked by them.
                .allow_evicting_policy(true)
                .build()
                .await?,
        ),
        Which::Cluster(nodes) => LockEngine::new(
            RedisBackend::cluster(nodes.iter())
                .prefix(prefix)
                .allow_evicting_policy(true)
                .build()
                .await?,
        ),
        Which::Sentinel(sentinels, service) => LockEngine::new(
            RedisBackend::sentinel(sentinels.iter(), service)
                .prefix(prefix)
                .allow_evicting_policy(true)
                .build()
                .await?,
        ),
        Which::Postgres(url) => {
            let mut builder = PostgresBackend::builder(url).pool_size(1);
            if let Some(schema) = &store.schema {
                builder = builder.schema(schema);
            }
            if let Some(prefix) = &store.table_prefix {
                builder = builder.table_prefix(prefix);
            }
            LockEngine::new(builder.build().await?)
        }
    };
    Ok(engine.without_holder_label())
}
