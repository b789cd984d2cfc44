//! HTTP bench: an axum server with and without locking, driven at fixed concurrency by an
//! in-process HTTP/1.1 load generator; prints one JSON object per scenario with requests/s,
//! latency percentiles and the ratio to the bare server measured in the same run.
//!
//! ```sh
//! cargo bench --bench http -- --connections 32 --duration-secs 3 --json
//! REDIS_URL=redis://127.0.0.1:6379 cargo bench --bench http -- --json
//! ```
//!
//! The load generator is in-process (hyper's client, one keep-alive connection per
//! concurrent client) rather than `wrk`, so the bench runs anywhere `cargo` does. Server and
//! client run on separate runtimes with their own threads, so they compete for the CPU
//! as two processes would, and equally in every scenario.

#[path = "../support/mod.rs"]
mod support;

mod load;
mod tally;

use std::{process::ExitCode, time::Duration};

use axum::Router;
use serde_json::{Value, json};
use support::Args;
use tally::Tally;
use tokio::runtime::Runtime;
use tower_lock::{LockEngine, LockOptions};

const HELP: &str = "\
http: requests/s and latency of an axum server, bare and with locking.

USAGE:
    cargo bench --bench http -- [OPTIONS]

OPTIONS:
    --connections N       concurrent keep-alive connections (fixed concurrency)  [32]
    --duration-secs F     measured time per scenario, over all rounds             [3]
    --rounds N            scenarios take turns N times, a slice each              [3]
    --warmup-secs F       unmeasured time before each slice                     [0.3]
    --server-threads N    server runtime threads                                  [1]
    --client-threads N    load generator runtime threads                          [1]
    --fifo                lock in FIFO mode
    --only A,B            run only the scenarios whose names contain A or B (without
                          bare, ratio_to_bare is null)
    --redis-url URL       also run the Redis scenarios (else $REDIS_URL)
    --json                print only the JSON lines
    --help                this text

SCENARIOS (name = variant/backend/keys):
    bare                         the server without locking: the baseline of
                                 ratio_to_bare, measured in the same rounds
    lock_in_handler/B/K          the handler locks the path's key with the engine
    lock_layer/B/K               the server wrapped in LockLayer (when it is built)
    B = memory | redis;  K = distinct (a fresh key per request) | hot (one key for all)
";

const FLAGS: &[&str] = &["fifo", "json", "help"];
const OPTIONS: &[&str] = &[
    "connections",
    "duration-secs",
    "rounds",
    "warmup-secs",
    "server-threads",
    "client-threads",
    "fifo",
    "redis-url",
    "only",
    "json",
    "help",
];

struct Config {
    connections: usize,
    duration: Duration,
    rounds: usize,
    warmup: Duration,
    server_threads: usize,
    client_threads: usize,
    fifo: bool,
    redis_url: Option<String>,
    only: Option<String>,
    json: bool,
}

impl Config {
    fn from_args(args: &Args) -> Result<Self, String> {
        args.reject_unknown(OPTIONS)?;
        let secs = |name, default| -> Result<Duration, String> {
            Duration::try_from_secs_f64(args.get(name, default)?)
                .map_err(|e| format!("--{name}: {e}"))
        };
        let config = Self {
            connections: args.get("connections", 32)?,
            duration: secs("duration-secs", 3.0)?,
            rounds: args.get("rounds", 3)?,
            warmup: secs("warmup-secs", 0.3)?,
            server_threads: args.get("server-threads", 1)?,
            client_threads: args.get("client-threads", 1)?,
            fifo: args.flag("fifo"),
            redis_url: support::redis_url(args),
            only: args.string("only"),
            json: args.flag("json"),
        };
        if config.connections == 0
            || config.rounds == 0
            || config.server_threads == 0
            || config.client_threads == 0
        {
            return Err("--connections, --rounds and the thread counts must be at least 1".into());
        }
        Ok(config)
    }

    /// What `cargo test` runs: every in-process scenario, briefly.
    fn smoke() -> Self {
        Self {
            connections: 4,
            duration: Duration::from_millis(200),
            rounds: 1,
            warmup: Duration::from_millis(50),
            server_threads: 1,
            client_threads: 1,
            fifo: false,
            redis_url: None,
            only: None,
            json: true,
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Backend {
    Memory,
    Redis,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Redis => "redis",
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Variant {
    Bare,
    LockInHandler,
    LockLayer,
}

#[derive(Clone, Copy)]
struct Scenario {
    variant: Variant,
    backend: Backend,
    hot: bool,
}

impl Scenario {
    fn name(&self) -> String {
        let variant = match self.variant {
            Variant::Bare => return "bare".into(),
            Variant::LockInHandler => "lock_in_handler",
            Variant::LockLayer => "lock_layer",
        };
        let keys = if self.hot { "hot" } else { "distinct" };
        format!("{variant}/{}/{keys}", self.backend.name())
    }
}

fn main() -> ExitCode {
    let args = match Args::parse(FLAGS) {
        Ok(args) => args,
        Err(e) => return fail(&e),
    };
    if args.flag("help") {
        print!("{HELP}");
        return ExitCode::SUCCESS;
    }
    let config = if args.benching() {
        match Config::from_args(&args) {
            Ok(c) => c,
            Err(e) => return fail(&e),
        }
    } else {
        Config::smoke()
    };

    let chosen = |scenario: &Scenario| {
        config.only.as_deref().is_none_or(|only| {
            let name = scenario.name();
            only.split(',').any(|part| name.contains(part))
        })
    };
    let mut scenarios = vec![Scenario {
        variant: Variant::Bare,
        backend: Backend::Memory,
        hot: false,
    }];
    let mut backends = vec![Backend::Memory];
    if config.redis_url.is_some() {
        backends.push(Backend::Redis);
    }
    for &backend in &backends {
        for variant in [Variant::LockInHandler, Variant::LockLayer] {
            for hot in [false, true] {
                let scenario = Scenario {
                    variant,
                    backend,
                    hot,
                };
                scenarios.push(scenario);
            }
        }
    }

    scenarios.retain(chosen);

    // Scenarios take turns, a slice each per round, so drift in the machine's other load
    // falls on all of them alike instead of on whichever ran last.
    let client = runtime(config.client_threads);
    let slice = config.duration / config.rounds as u32;
    let mut tallies: Vec<Tally> = scenarios.iter().map(|_| Tally::default()).collect();
    for _ in 0..config.rounds {
        for (scenario, tally) in scenarios.iter().zip(&mut tallies) {
            if tally.skipped.is_some() {
                continue;
            }
            match run(&config, &client, scenario, slice) {
                Ok(outcome) => tally.add(outcome, slice),
                Err(why) => tally.skipped = Some(why),
            }
        }
    }

    let bare_rps = scenarios
        .iter()
        .zip(&tallies)
        .find(|(scenario, _)| scenario.variant == Variant::Bare)
        .and_then(|(_, tally)| tally.rps());
    let results: Vec<Value> = scenarios
        .iter()
        .zip(tallies)
        .map(|(scenario, tally)| {
            let mut r = tally.report(&config, scenario, bare_rps);
            r["bench"] = json!("http");
            r["name"] = json!(scenario.name());
            r
        })
        .collect();
    for r in &results {
        if !config.json {
            eprintln!("{:>32}: {}", r["name"].as_str().unwrap_or("?"), summary(r));
        }
        println!("{r}");
    }
    if !args.benching() {
        // Smoke run: every scenario that ran must have served only 200s.
        for r in &results {
            if r.get("skipped").is_none() {
                assert_eq!(r["errors"], 0, "{r}");
                assert!(r["requests"].as_u64() > Some(0), "{r}");
            }
        }
    }
    ExitCode::SUCCESS
}

fn fail(message: &str) -> ExitCode {
    eprintln!("http: {message}");
    ExitCode::from(2)
}

fn runtime(threads: usize) -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// The server for `scenario`, or why it cannot run in this build.
async fn app(config: &Config, scenario: &Scenario) -> Result<Router, String> {
    if scenario.variant == Variant::Bare {
        return Ok(support::app());
    }
    let engine = match scenario.backend {
        Backend::Memory => LockEngine::in_memory(),
        Backend::Redis => {
            let url = config
                .redis_url
                .as_deref()
                .expect("redis scenarios need a URL");
            support::redis_engine(url, "bench-http").await?
        }
    };
    match scenario.variant {
        Variant::LockInHandler => Ok(support::app_locking_in_handler(
            engine.with_defaults(LockOptions::new().fifo(config.fifo)),
        )),
        _ => Ok(support::with_lock_layer(
            support::app(),
            engine,
            config.fifo,
        )),
    }
}

/// One slice of a scenario: start its server on a fresh runtime and port, load it for
/// warm-up plus `slice`, stop it.
fn run(
    config: &Config,
    client: &Runtime,
    scenario: &Scenario,
    slice: Duration,
) -> Result<load::LoadOutcome, String> {
    let server = runtime(config.server_threads);
    let addr = server.block_on(async {
        let app = app(config, scenario).await?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("bind: {e}"))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok::<_, String>(addr)
    })?;
    let outcome = client.block_on(load::load(
        config.connections,
        config.warmup,
        addr,
        scenario.hot,
        slice,
    ));
    // Dropping the runtime stops the server and its connections.
    server.shutdown_timeout(Duration::from_secs(1));
    outcome
}

fn summary(r: &Value) -> String {
    match r.get("skipped") {
        Some(why) => format!("skipped: {why}"),
        None => format!(
            "{} req/s, p50 {} µs, p99 {} µs, errors {}",
            r["rps"], r["p50_us"], r["p99_us"], r["errors"]
        ),
    }
}
