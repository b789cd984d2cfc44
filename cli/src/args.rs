//! The command line: where the store is, and the commands.

use clap::{Args, Parser, Subcommand};

/// See who holds a tower-lock key and who waits, release it safely, read the idempotency
/// records, on Redis or Postgres. Exit codes: 0 done/held/found, 1 free/not found/not
/// held, 2 usage, 3 backend unavailable, 4 not confirmed.
#[derive(Debug, Parser)]
#[command(name = "tower-lock-cli", version)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) store: Store,
    /// One JSON document on stdout instead of text.
    #[arg(long, global = true)]
    pub(crate) json: bool,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Where the leases are: the same settings as the engine's builders.
#[derive(Debug, Args)]
pub(crate) struct Store {
    /// One Redis server (`redis://`, `rediss://`).
    #[arg(long, global = true, value_name = "URL")]
    pub(crate) redis: Option<String>,
    /// A Redis Cluster: one or more nodes (repeat, or separate with commas).
    #[arg(long, global = true, value_name = "URL", value_delimiter = ',')]
    pub(crate) redis_cluster: Vec<String>,
    /// Redis Sentinels (repeat, or separate with commas), with `--sentinel-service`.
    #[arg(long, global = true, value_name = "URL", value_delimiter = ',')]
    pub(crate) redis_sentinel: Vec<String>,
    /// The primary's name the Sentinels watch.
    #[arg(long, global = true, value_name = "NAME")]
    pub(crate) sentinel_service: Option<String>,
    /// The Redis key prefix the services use (the builder's `prefix`; default `tower-lock`).
    #[arg(long, global = true, value_name = "PREFIX")]
    pub(crate) prefix: Option<String>,
    /// A Postgres database (`postgres://`).
    #[arg(long, global = true, value_name = "URL")]
    pub(crate) postgres: Option<String>,
    /// The Postgres schema the services use (the builder's `schema`).
    #[arg(long, global = true, value_name = "SCHEMA")]
    pub(crate) schema: Option<String>,
    /// The Postgres table prefix the services use (the builder's `table_prefix`).
    #[arg(long, global = true, value_name = "PREFIX")]
    pub(crate) table_prefix: Option<String>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Free or held; the holders with label, fence and lease left; how many wait.
    Status {
        /// The lock key, exactly as the layer derives it (see `key`).
        key: String,
    },
    /// Keys held or waited for, a page at a time (Redis `SCAN`, never `KEYS`; Postgres an
    /// index range).
    List(ListArgs),
    /// Force-release a key (the admin release): the next waiter is granted it, with a
    /// higher fence.
    Release(ReleaseArgs),
    /// An idempotency record stored by the engine-backed layer.
    Record(RecordArgs),
    /// The lock key a layer derives from a request's header or path.
    Key(KeyArgs),
}

#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    /// Only keys someone holds.
    #[arg(long)]
    pub(crate) held: bool,
    /// Only keys someone waits for.
    #[arg(long)]
    pub(crate) waiting: bool,
    /// Only keys beginning with this text (e.g. a layer's `<namespace>/<kind>/`).
    #[arg(long, value_name = "STR", default_value = "")]
    pub(crate) prefix_match: String,
    /// At most this many keys (one page).
    #[arg(long, default_value_t = 100)]
    pub(crate) limit: usize,
    /// Where the page begins: the `next` cursor the page before printed.
    #[arg(long)]
    pub(crate) cursor: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct ReleaseArgs {
    /// The lock key.
    pub(crate) key: String,
    /// Release only if this token or label holds the key (else exit 1, nothing done).
    #[arg(long, value_name = "TOKEN|LABEL")]
    pub(crate) holder: Option<String>,
    /// Do not ask for confirmation.
    #[arg(long)]
    pub(crate) yes: bool,
}

#[derive(Debug, Args)]
pub(crate) struct RecordArgs {
    #[command(subcommand)]
    pub(crate) action: RecordAction,
}

#[derive(Debug, Subcommand)]
pub(crate) enum RecordAction {
    /// Status, headers, body size, stored at, expiry.
    Get {
        /// The record's key (the lock key of the request).
        key: String,
    },
    /// Delete it (the lock is left as it is): the next request runs again.
    Delete {
        /// The record's key.
        key: String,
    },
}

#[derive(Debug, Args)]
pub(crate) struct KeyArgs {
    /// The layer's namespace (`LockLayer::builder().namespace(..)`; default empty).
    #[arg(long, default_value = "")]
    pub(crate) namespace: String,
    /// A header extractor (`HeaderKey::new(NAME)`) and the request's value.
    #[arg(long, num_args = 2, value_names = ["NAME", "VALUE"])]
    pub(crate) header: Option<Vec<String>>,
    /// The idempotency preset's key (`Idempotency-Key` header value, quoted or bare).
    #[arg(long, value_name = "VALUE")]
    pub(crate) idempotency_key: Option<String>,
    /// A path extractor (`PathKey`) and the request's path; with `--method`, `MethodPathKey`.
    #[arg(long, value_name = "PATH")]
    pub(crate) path: Option<String>,
    /// The request's method, for `--path` (`MethodPathKey`).
    #[arg(long, value_name = "METHOD")]
    pub(crate) method: Option<String>,
}
