//! The bench's settings: parsed from the command line, or the small smoke run `cargo test`
//! makes.

use std::time::Duration;

use crate::OPTIONS;
use crate::support::{self, Args};

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Hold {
    Spin,
    Sleep,
}

#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub(crate) backend: String,
    pub(crate) redis_url: Option<String>,
    /// Postgres: the database, or `None` for a throwaway cluster the bench starts.
    pub(crate) database_url: Option<String>,
    /// Postgres: connections per engine (and the baselines' pool).
    pub(crate) pool: u32,
    pub(crate) workers: usize,
    pub(crate) keys: usize,
    pub(crate) iterations: usize,
    pub(crate) hold: Duration,
    pub(crate) hold_mode: Hold,
    pub(crate) fifo: bool,
    pub(crate) ttl: Duration,
    pub(crate) engines: usize,
    pub(crate) threads: usize,
    pub(crate) overtake_slack: Duration,
    pub(crate) stagger: Duration,
    pub(crate) residue_keys: Option<u64>,
    pub(crate) settle: Duration,
    pub(crate) label: Option<String>,
    pub(crate) json: bool,
}

impl Config {
    pub(crate) fn from_args(args: &Args) -> Result<Self, String> {
        args.reject_unknown(OPTIONS)?;
        let hold_mode = match args.get("hold", "spin".to_string())?.as_str() {
            "spin" => Hold::Spin,
            "sleep" => Hold::Sleep,
            other => return Err(format!("--hold: expected spin or sleep, not `{other}`")),
        };
        let backend = args.get("backend", "memory".to_string())?;
        const BACKENDS: &[&str] = &[
            "memory",
            "redis",
            "redis-cluster",
            "redis-baseline",
            "postgres",
            "postgres-baseline",
            "postgres-advisory",
            "postgres-advisory-session",
        ];
        if !BACKENDS.contains(&backend.as_str()) {
            return Err(format!(
                "--backend: expected one of {}, not `{backend}`",
                BACKENDS.join(", ")
            ));
        }
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let config = Self {
            redis_url: support::redis_url(args),
            database_url: args
                .string("database-url")
                .or_else(|| std::env::var("DATABASE_URL").ok())
                .filter(|u| !u.is_empty()),
            pool: args.get("pool", 10)?,
            backend,
            workers: args.get("workers", 8)?,
            keys: args.get("keys", 1)?,
            iterations: args.get("iterations", 50)?,
            hold: Duration::from_micros(args.get("hold-us", 1000)?),
            hold_mode,
            fifo: args.flag("fifo"),
            ttl: Duration::from_millis(args.get("ttl-ms", 10_000)?),
            engines: args.get("engines", 1)?,
            threads: args.get("threads", cores)?,
            overtake_slack: Duration::from_micros(args.get("overtake-slack-us", 50)?),
            stagger: Duration::from_micros(args.get("stagger-us", 500)?),
            residue_keys: match args.string("residue-keys") {
                Some(_) => Some(args.get("residue-keys", 0)?),
                None => None,
            },
            settle: Duration::from_millis(args.get("settle-ms", 0)?),
            label: args.string("label"),
            json: args.flag("json"),
        };
        if config.workers == 0
            || config.keys == 0
            || config.engines == 0
            || config.threads == 0
            || config.pool == 0
        {
            return Err(
                "--workers, --keys, --engines, --threads and --pool must be at least 1".into(),
            );
        }
        if config.backend.starts_with("redis") && config.redis_url.is_none() {
            return Err("--backend redis needs --redis-url or REDIS_URL".into());
        }
        Ok(config)
    }

    /// What `cargo test` runs: small, quick, and still contended.
    pub(crate) fn smoke() -> Self {
        Self {
            backend: "memory".into(),
            redis_url: None,
            database_url: None,
            pool: 10,
            workers: 4,
            keys: 1,
            iterations: 10,
            hold: Duration::from_micros(100),
            hold_mode: Hold::Spin,
            fifo: true,
            ttl: Duration::from_secs(10),
            engines: 2,
            // A thread per worker: contention must not hinge on how soon the OS wakes a
            // second thread on a busy machine.
            threads: 4,
            overtake_slack: Duration::from_micros(50),
            // All at once: the smoke run wants contention, not an arrival order.
            stagger: Duration::ZERO,
            residue_keys: None,
            settle: Duration::ZERO,
            label: Some("smoke".into()),
            json: true,
        }
    }
}
