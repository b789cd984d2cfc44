//! Contention bench: workers take turns on a few keys; prints one JSON object.
//!
//! ```sh
//! cargo bench --bench contention -- --backend memory --workers 8 --keys 1 \
//!     --iterations 50 --hold-us 1000 --fifo --json
//! cargo bench --bench contention -- --residue-keys 1000000 --json
//! ```
//!
//! Run `cargo bench --bench contention -- --help` for every option. Under `cargo test`
//! (no `--bench` argument) it does one small smoke run and checks its invariants.

mod support;

use std::{
    collections::BTreeMap,
    process::ExitCode,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use support::{Args, Percentiles, RedisStats, micros, percentiles, round};
use tower_lock::{LockEngine, MemoryBackend, engine::Backend};

const HELP: &str = "\
contention: workers contend for keys; each cycle is acquire -> hold -> release.

USAGE:
    cargo bench --bench contention -- [OPTIONS]

OPTIONS:
    --backend memory|redis|redis-cluster|redis-baseline
                             (redis-cluster: --redis-url lists nodes, comma-separated;
                             needs the `redis-cluster` feature)
                             lock engine backend, or the baseline: the simplest
                             correct Redis lock (SET NX PX, compare-and-delete
                             script; no waiting: a refused try retries at once,
                             no fences), on the same kind of connection  [memory]
    --redis-url URL          Redis server (else $REDIS_URL)
    --workers N              concurrent workers (tasks)                     [8]
    --keys N                 keys; worker w always uses key w mod N         [1]
    --iterations N           cycles per worker                              [50]
    --hold-us N              critical section length in microseconds       [1000]
    --hold spin|sleep        how the critical section waits:                [spin]
                               spin  = busy-wait on the clock (µs-precise; occupies
                                       a runtime thread, like CPU-bound handler work)
                               sleep = tokio::time::sleep (yields the thread; rounds
                                       up to the timer's 1 ms granularity)
    --fifo                   acquire in FIFO mode
    --ttl-ms N               lease TTL in milliseconds                      [10000]
    --engines N              engines sharing the backend (nodes of a fleet);
                               worker w uses engine w mod N                  [1]
    --threads N              tokio worker threads            [available cores]
    --overtake-slack-us N    arrivals closer than this are not counted as
                               FIFO overtakes (clock-read races)             [50]
    --stagger-us N           worker w first arrives w*N after the start, so
                               the first round has an arrival order to keep  [500]
    --residue-keys N         instead: lock and release N distinct keys, then
                               report RSS and leftover keys (in-process map
                               entries; DBSIZE of the URL's database)       [off]
    --settle-ms N            with --residue-keys: measure again N ms later,
                               after TTL'd Redis keys have expired           [0]
    --label TEXT             copied into the output, to tell runs apart
    --json                   print only the JSON object
    --help                   this text

OUTPUT (one JSON object; times in microseconds unless the name says otherwise):
    cycles, cycles_per_s, wall_s
    handoff_*_us     next holder's acquire-return minus the previous holder's
                     release-call time, on the same key, where the holder changes
    release_p*_us    release-return minus release-call (the releasing side's
                     round trip; the hand-off's grant travels meanwhile)
    wait_*_us        acquire-return minus acquire-call, per cycle
    fifo_overtakes   grants made while a waiter that arrived > slack earlier still
                     waited (fifo_overtakes_strict: slack 0)
    longest_run      most consecutive grants of one key to one worker
    redis_commands_per_cycle   server-side commands (INFO commandstats, including
                     those run inside Lua scripts) / cycles; null for memory
    mutual_exclusion_violations   two holders at once (must be 0)
";

const FLAGS: &[&str] = &["fifo", "json", "help"];
const OPTIONS: &[&str] = &[
    "backend",
    "redis-url",
    "workers",
    "keys",
    "iterations",
    "hold-us",
    "hold",
    "fifo",
    "ttl-ms",
    "engines",
    "threads",
    "overtake-slack-us",
    "stagger-us",
    "residue-keys",
    "settle-ms",
    "label",
    "json",
    "help",
];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Hold {
    Spin,
    Sleep,
}

#[derive(Clone, Debug)]
struct Config {
    backend: String,
    redis_url: Option<String>,
    workers: usize,
    keys: usize,
    iterations: usize,
    hold: Duration,
    hold_mode: Hold,
    fifo: bool,
    ttl: Duration,
    engines: usize,
    threads: usize,
    overtake_slack: Duration,
    stagger: Duration,
    residue_keys: Option<u64>,
    settle: Duration,
    label: Option<String>,
    json: bool,
}

impl Config {
    fn from_args(args: &Args) -> Result<Self, String> {
        args.reject_unknown(OPTIONS)?;
        let hold_mode = match args.get("hold", "spin".to_string())?.as_str() {
            "spin" => Hold::Spin,
            "sleep" => Hold::Sleep,
            other => return Err(format!("--hold: expected spin or sleep, not `{other}`")),
        };
        let backend = args.get("backend", "memory".to_string())?;
        if !["memory", "redis", "redis-cluster", "redis-baseline"].contains(&backend.as_str()) {
            return Err(format!(
                "--backend: expected memory, redis, redis-cluster or redis-baseline, not `{backend}`"
            ));
        }
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let config = Config {
            redis_url: support::redis_url(args),
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
        if config.workers == 0 || config.keys == 0 || config.engines == 0 || config.threads == 0 {
            return Err("--workers, --keys, --engines and --threads must be at least 1".into());
        }
        if config.backend.starts_with("redis") && config.redis_url.is_none() {
            return Err("--backend redis needs --redis-url or REDIS_URL".into());
        }
        Ok(config)
    }

    /// What `cargo test` runs: small, quick, and still contended.
    fn smoke() -> Self {
        Config {
            backend: "memory".into(),
            redis_url: None,
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
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.threads)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let result = runtime.block_on(async {
        match config.residue_keys {
            Some(n) => residue(&config, n).await,
            None if config.backend == "redis-baseline" => baseline::run(&config).await,
            None => contention(&config).await,
        }
    });
    match result {
        Ok(report) => {
            if !config.json {
                print_human(&report);
            }
            println!("{report}");
            if !args.benching() {
                // The smoke run doubles as a test of the invariants that hold on any machine.
                // (Overtakes are a measured figure: a thread preempted between reading the
                // clock and queueing can look overtaken, so they are not asserted.)
                assert_eq!(report["mutual_exclusion_violations"], 0, "{report}");
                assert_eq!(report["fence_regressions"], 0, "{report}");
                assert_eq!(report["errors"], 0, "{report}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}

fn fail(message: &str) -> ExitCode {
    eprintln!("contention: {message}");
    ExitCode::from(2)
}

/// The baseline: the simplest correct Redis lock, measured like the engine.
mod baseline {
    use super::*;

    /// Release only if the value is still ours: the standard compare-and-delete.
    #[cfg(feature = "redis")]
    const COMPARE_AND_DELETE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

    #[cfg(not(feature = "redis"))]
    pub(super) async fn run(_: &Config) -> Result<Value, String> {
        Err(support::REDIS_NOT_BUILT.to_string())
    }

    /// Each worker: `SET key token NX PX ttl` until it answers OK (a refusal retries at
    /// once: no waiting, no fairness), hold, then the compare-and-delete script by
    /// `EVALSHA`. On one multiplexed connection, like the engine's pool.
    #[cfg(feature = "redis")]
    pub(super) async fn run(config: &Config) -> Result<Value, String> {
        let url = config.redis_url.as_deref().expect("checked in from_args");
        let client = redis::Client::open(url).map_err(|e| e.to_string())?;
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        let script = redis::Script::new(COMPARE_AND_DELETE);
        let run_id = run_id();
        let mut warm = conn.clone();
        let _: i64 = script
            .key("warm")
            .arg("x")
            .invoke_async(&mut warm)
            .await
            .map_err(|e| e.to_string())?;
        let mut stats = RedisStats::connect(url)?;
        let before = stats.command_calls()?;
        let violations = Arc::new(AtomicU64::new(0));
        let holders: Arc<Vec<AtomicUsize>> =
            Arc::new((0..config.keys).map(|_| AtomicUsize::new(0)).collect());
        let began = Instant::now();
        let mut tasks = Vec::new();
        for worker in 0..config.workers {
            let (mut conn, script, holders, violations) = (
                conn.clone(),
                script.clone(),
                holders.clone(),
                violations.clone(),
            );
            let config = config.clone();
            let key = format!("baseline:{run_id}:{}", worker % config.keys);
            tasks.push(tokio::spawn(async move {
                let ttl = config.ttl.as_millis() as u64;
                for _ in 0..config.iterations {
                    let token = format!("{:032x}", rand::random::<u128>());
                    loop {
                        let ok: Option<String> = redis::cmd("SET")
                            .arg(&key)
                            .arg(&token)
                            .arg("NX")
                            .arg("PX")
                            .arg(ttl)
                            .query_async(&mut conn)
                            .await
                            .map_err(|e| e.to_string())?;
                        if ok.is_some() {
                            break;
                        }
                        tokio::task::yield_now().await;
                    }
                    let slot = &holders[worker % config.keys];
                    if slot.swap(worker + 1, Ordering::SeqCst) != 0 {
                        violations.fetch_add(1, Ordering::Relaxed);
                    }
                    hold(config.hold, config.hold_mode).await;
                    slot.store(0, Ordering::SeqCst);
                    let _: i64 = script
                        .key(&key)
                        .arg(&token)
                        .invoke_async(&mut conn)
                        .await
                        .map_err(|e| e.to_string())?;
                }
                Ok::<_, String>(())
            }));
        }
        for task in tasks {
            task.await.map_err(|e| format!("worker panicked: {e}"))??;
        }
        let wall = began.elapsed();
        let commands = support::commands_between(&before, &stats.command_calls()?);
        let cycles = config.workers * config.iterations;
        let total: u64 = commands.values().sum();
        let mut report = header(config, "contention");
        extend(
            &mut report,
            json!({
                "cycles": cycles,
                "errors": 0,
                "wall_s": round(wall.as_secs_f64(), 4),
                "cycles_per_s": round(cycles as f64 / wall.as_secs_f64(), 1),
                "mutual_exclusion_violations": violations.load(Ordering::Relaxed),
                "redis_commands": total,
                "redis_commands_per_cycle": round(total as f64 / cycles.max(1) as f64, 2),
                "redis_command_calls": commands,
            }),
        );
        Ok(report)
    }
}

/// The engines for this run. Every engine shares one backend, as the servers of a fleet
/// share one Redis; for memory, the `MemoryBackend` is also returned for `key_count()`.
async fn engines(config: &Config) -> Result<(Vec<LockEngine>, Option<Arc<MemoryBackend>>), String> {
    match config.backend.as_str() {
        "memory" => {
            let backend = Arc::new(MemoryBackend::new());
            let engines = (0..config.engines)
                .map(|_| LockEngine::from_arc(backend.clone() as Arc<dyn Backend>))
                .collect();
            Ok((engines, Some(backend)))
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

/// One acquire → hold → release cycle, as seen by its worker.
#[derive(Clone, Copy)]
struct Cycle {
    worker: usize,
    /// When `acquire()` was called (the arrival, for FIFO order).
    arrival: Instant,
    /// When `acquire()` returned.
    granted: Instant,
    /// When `release()` was called.
    release_call: Instant,
    fence: u64,
}

/// Per-key bookkeeping, touched only by the key's holder.
struct KeySlot {
    name: String,
    /// `worker + 1` of the current holder, 0 when free: a second holder sees non-zero.
    holder: AtomicUsize,
    /// Cycles in grant order. Pushed by the holder while it still holds the key, so the
    /// order is the engine's grant order whether or not fences are right.
    log: Mutex<Vec<Cycle>>,
}

async fn contention(config: &Config) -> Result<Value, String> {
    let (engines, _memory) = engines(config).await?;
    let run_id = run_id();
    let slots: Arc<Vec<KeySlot>> = Arc::new(
        (0..config.keys)
            .map(|k| KeySlot {
                name: format!("contention:{run_id}:{k}"),
                holder: AtomicUsize::new(0),
                log: Mutex::new(Vec::with_capacity(
                    config.iterations * config.workers.div_ceil(config.keys),
                )),
            })
            .collect(),
    );

    // Warm up outside the measurement (pool connections, script loading, the watchdog
    // task), so the command count and the figures are of steady-state cycles.
    for engine in &engines {
        let lease = engine
            .lock(format!("contention:{run_id}:warmup"))
            .fifo(config.fifo)
            .acquire()
            .await
            .map_err(|e| format!("warm-up acquire: {e}"))?;
        lease
            .release()
            .await
            .map_err(|e| format!("warm-up release: {e}"))?;
    }

    let mut stats = match &config.redis_url {
        // On a cluster, commands are spread over the nodes: not counted.
        Some(url) if config.backend.starts_with("redis") && config.backend != "redis-cluster" => {
            Some(RedisStats::connect(url)?)
        }
        _ => None,
    };
    let before = match stats.as_mut() {
        Some(s) => Some(s.command_calls()?),
        None => None,
    };

    let violations = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let first_error = Arc::new(Mutex::new(None::<String>));
    // How long each release call took (µs): the part of a hand-off before the grant
    // message leaves the server.
    let releases = Arc::new(Mutex::new(Vec::<f64>::new()));
    let mut starts = Vec::with_capacity(config.workers);
    let mut tasks = Vec::with_capacity(config.workers);
    for worker in 0..config.workers {
        let engine = engines[worker % engines.len()].clone();
        let slots = slots.clone();
        let violations = violations.clone();
        let errors = errors.clone();
        let first_error = first_error.clone();
        let releases = releases.clone();
        let (start_tx, start) = tokio::sync::oneshot::channel::<()>();
        starts.push(start_tx);
        let config = config.clone();
        tasks.push(tokio::spawn(async move {
            let slot = &slots[worker % slots.len()];
            let me = worker + 1;
            let record_error = |what: &str, e: tower_lock::LockError| {
                errors.fetch_add(1, Ordering::Relaxed);
                first_error
                    .lock()
                    .unwrap()
                    .get_or_insert_with(|| format!("{what}: {e}"));
            };
            let _ = start.await;
            for _ in 0..config.iterations {
                let arrival = Instant::now();
                let acquired = engine
                    .lock(&slot.name)
                    .ttl(config.ttl)
                    .fifo(config.fifo)
                    .acquire()
                    .await;
                let granted = Instant::now();
                let lease = match acquired {
                    Ok(lease) => lease,
                    Err(e) => {
                        record_error("acquire", e);
                        continue;
                    }
                };
                if slot.holder.swap(me, Ordering::SeqCst) != 0 {
                    violations.fetch_add(1, Ordering::Relaxed);
                }
                hold(config.hold, config.hold_mode).await;
                if slot
                    .holder
                    .compare_exchange(me, 0, Ordering::SeqCst, Ordering::SeqCst)
                    .is_err()
                {
                    violations.fetch_add(1, Ordering::Relaxed);
                }
                let release_call = Instant::now();
                slot.log.lock().unwrap().push(Cycle {
                    worker,
                    arrival,
                    granted,
                    release_call,
                    fence: lease.fence().get(),
                });
                if let Err(e) = lease.release().await {
                    record_error("release", e);
                }
                let took = micros(release_call.elapsed());
                releases.lock().unwrap().push(took);
            }
        }));
    }
    // Workers start one by one, `stagger` apart: arrivals in the same microsecond have no
    // order for FIFO to keep (which reaches the backend first is a race); staggered, they
    // do. From the second round on, the releasing worker re-arrives while the others wait.
    // A plain thread gives the signals: tokio's timers would not fire while a worker that
    // never waits (a free in-process key, a spinning hold) keeps the runtime busy.
    let began = Instant::now();
    let stagger = config.stagger;
    let starter = std::thread::spawn(move || {
        for (w, start) in starts.into_iter().enumerate() {
            let at = began + stagger * w as u32;
            std::thread::sleep(at.saturating_duration_since(Instant::now()));
            let _ = start.send(());
        }
    });
    for task in tasks {
        task.await.map_err(|e| format!("worker panicked: {e}"))?;
    }
    let wall = began.elapsed();
    starter.join().map_err(|_| "the starter thread panicked")?;

    let commands = match (stats.as_mut(), before) {
        (Some(s), Some(before)) => Some(support::commands_between(&before, &s.command_calls()?)),
        _ => None,
    };
    let logs: Vec<Vec<Cycle>> = slots
        .iter()
        .map(|s| std::mem::take(&mut *s.log.lock().unwrap()))
        .collect();
    let analysis = analyse(&logs, config.overtake_slack);
    let cycles = analysis.cycles;
    let total_commands = commands.as_ref().map(|c| c.values().sum::<u64>());

    let mut report = header(config, "contention");
    let fields = json!({
        "cycles": cycles,
        "errors": errors.load(Ordering::Relaxed),
        "first_error": *first_error.lock().unwrap(),
        "wall_s": round(wall.as_secs_f64(), 4),
        "cycles_per_s": round(cycles as f64 / wall.as_secs_f64(), 1),
        "handoffs": analysis.handoffs.len(),
        "handoff_p50_us": p(&analysis.handoffs, |p| p.p50),
        "handoff_p99_us": p(&analysis.handoffs, |p| p.p99),
        "handoff_max_us": p(&analysis.handoffs, |p| p.max),
        "release_p50_us": p(&releases.lock().unwrap(), |p| p.p50),
        "release_p99_us": p(&releases.lock().unwrap(), |p| p.p99),
        "wait_p50_us": p(&analysis.waits, |p| p.p50),
        "wait_p99_us": p(&analysis.waits, |p| p.p99),
        "wait_max_us": p(&analysis.waits, |p| p.max),
        "longest_wait_ms": p(&analysis.waits, |p| p.max / 1000.0),
        "fifo_overtakes": analysis.overtakes,
        "fifo_overtakes_strict": analysis.overtakes_strict,
        "fifo_overtake_positions": analysis.overtake_positions,
        "longest_run": analysis.longest_run,
        "fence_regressions": analysis.fence_regressions,
        "mutual_exclusion_violations": violations.load(Ordering::Relaxed),
        "redis_commands": total_commands,
        "redis_commands_per_cycle": total_commands.map(|n| round(n as f64 / cycles.max(1) as f64, 2)),
        "redis_command_calls": commands,
    });
    extend(&mut report, fields);
    Ok(report)
}

async fn hold(d: Duration, mode: Hold) {
    if d.is_zero() {
        return;
    }
    match mode {
        Hold::Spin => {
            let until = Instant::now() + d;
            while Instant::now() < until {
                std::hint::spin_loop();
            }
        }
        Hold::Sleep => tokio::time::sleep(d).await,
    }
}

/// The figures derived from the per-key grant logs.
struct Analysis {
    cycles: usize,
    handoffs: Vec<f64>,
    waits: Vec<f64>,
    overtakes: u64,
    overtakes_strict: u64,
    longest_run: usize,
    fence_regressions: u64,
    /// Where overtaking grants sit in their key's grant order (the first 20): at the start
    /// of a run they are start-up races; later they are the engine's.
    overtake_positions: Vec<usize>,
}

fn analyse(logs: &[Vec<Cycle>], slack: Duration) -> Analysis {
    let mut a = Analysis {
        cycles: 0,
        handoffs: Vec::new(),
        waits: Vec::new(),
        overtakes: 0,
        overtakes_strict: 0,
        longest_run: 0,
        fence_regressions: 0,
        overtake_positions: Vec::new(),
    };
    for log in logs {
        a.cycles += log.len();
        a.waits
            .extend(log.iter().map(|c| micros(c.granted - c.arrival)));
        let mut run = 0;
        for (i, c) in log.iter().enumerate() {
            match i.checked_sub(1).map(|j| &log[j]) {
                Some(prev) if prev.worker == c.worker => run += 1,
                Some(prev) => {
                    run = 1;
                    // Clamped at 0: the next holder's clock read may land a hair before
                    // the previous holder's on another core, never meaningfully so.
                    a.handoffs.push(micros(
                        c.granted.saturating_duration_since(prev.release_call),
                    ));
                }
                None => run = 1,
            }
            if let Some(prev) = i.checked_sub(1).map(|j| &log[j])
                && c.fence <= prev.fence
            {
                a.fence_regressions += 1;
            }
            a.longest_run = a.longest_run.max(run);
        }
        // A grant overtakes if some cycle granted after it had arrived before it. The
        // earliest arrival among the later grants (a suffix minimum) answers that for
        // every grant in one pass.
        let mut earliest_later: Option<Instant> = None;
        let mut positions = Vec::new();
        for (i, c) in log.iter().enumerate().rev() {
            if let Some(e) = earliest_later {
                if e < c.arrival {
                    a.overtakes_strict += 1;
                }
                if e + slack < c.arrival {
                    a.overtakes += 1;
                    positions.push(i);
                }
            }
            earliest_later = Some(earliest_later.map_or(c.arrival, |e| e.min(c.arrival)));
        }
        positions.reverse();
        a.overtake_positions.extend(positions);
    }
    a.overtake_positions.truncate(20);
    a
}

fn p(sample: &[f64], pick: impl Fn(&Percentiles) -> f64) -> Option<f64> {
    percentiles(&mut sample.to_vec()).map(|ps| round(pick(&ps), 1))
}

/// Lock and release `n` distinct keys, then check that nothing is left behind: the
/// engine's "no residue" promise, measured.
async fn residue(config: &Config, n: u64) -> Result<Value, String> {
    let (engines, memory) = engines(config).await?;
    let run_id = run_id();
    // The baseline is taken after a warm-up pass with the same workers, so one-time costs
    // (runtime threads, allocator arenas, pool connections, scripts) are in it and what
    // remains is what the keys left behind.
    let warmup = (n / 100).clamp(1, 10_000);
    let warm_errors =
        lock_distinct(config, &engines, &format!("residue:{run_id}:warm"), warmup).await;
    if warm_errors > 0 {
        return Err(format!("{warm_errors} errors in the warm-up pass"));
    }
    let mut stats = match &config.redis_url {
        Some(url) if config.backend == "redis" => Some(RedisStats::connect(url)?),
        _ => None,
    };
    let dbsize_before = match stats.as_mut() {
        Some(s) => Some(s.dbsize()?),
        None => None,
    };
    let rss_before = support::rss_kib();

    let began = Instant::now();
    let errors = lock_distinct(config, &engines, &format!("residue:{run_id}"), n).await;
    let wall = began.elapsed();
    let rss_after = support::rss_kib();
    let dbsize_after = match stats.as_mut() {
        Some(s) => Some(s.dbsize()?),
        None => None,
    };
    let key_count_after = memory.as_ref().map(|m| m.key_count());
    // Redis keeps some keys on purpose for a while (e.g. fence tombstones, with a TTL):
    // measured again once they should be gone.
    let settled = if config.settle.is_zero() {
        None
    } else {
        tokio::time::sleep(config.settle).await;
        let dbsize = match stats.as_mut() {
            Some(s) => Some(s.dbsize()?),
            None => None,
        };
        Some((
            support::rss_kib(),
            memory.as_ref().map(|m| m.key_count()),
            dbsize,
        ))
    };

    let mut report = header(config, "residue");
    extend(
        &mut report,
        json!({
            "residue_keys": n,
            "errors": errors,
            "wall_s": round(wall.as_secs_f64(), 3),
            "cycles_per_s": round(n as f64 / wall.as_secs_f64(), 1),
            "rss_before_kib": rss_before,
            "rss_after_kib": rss_after,
            "rss_growth_kib": rss_before.zip(rss_after).map(|(b, a)| a as i64 - b as i64),
            "rss_peak_kib": support::peak_rss_kib(),
            "key_count_after": key_count_after,
            "redis_dbsize_before": dbsize_before,
            "redis_dbsize_after": dbsize_after,
            "settle_ms": config.settle.as_millis() as u64,
            "rss_settled_kib": settled.and_then(|s| s.0),
            "key_count_settled": settled.and_then(|s| s.1),
            "redis_dbsize_settled": settled.and_then(|s| s.2),
        }),
    );
    Ok(report)
}

/// Lock and release `n` distinct keys (`{prefix}:{i}`), spread over the configured workers
/// and engines; returns the number of failed operations.
async fn lock_distinct(config: &Config, engines: &[LockEngine], prefix: &str, n: u64) -> u64 {
    let next = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..config.workers)
        .map(|worker| {
            let engine = engines[worker % engines.len()].clone();
            let (next, errors) = (next.clone(), errors.clone());
            let prefix = prefix.to_string();
            let (ttl, fifo) = (config.ttl, config.fifo);
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    let lock = engine.lock(format!("{prefix}:{i}")).ttl(ttl).fifo(fifo);
                    let ok = match lock.acquire().await {
                        Ok(lease) => lease.release().await.is_ok(),
                        Err(_) => false,
                    };
                    if !ok {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        if task.await.is_err() {
            errors.fetch_add(1, Ordering::Relaxed);
        }
    }
    errors.load(Ordering::Relaxed)
}

/// The configuration part of every report, so a JSON line says what produced it.
fn header(config: &Config, bench: &str) -> Value {
    let hold_mode = match config.hold_mode {
        Hold::Spin => "spin",
        Hold::Sleep => "sleep",
    };
    json!({
        "bench": bench,
        "label": config.label,
        "backend": config.backend,
        "fifo": config.fifo,
        "workers": config.workers,
        "keys": config.keys,
        "iterations": config.iterations,
        "hold_us": config.hold.as_micros() as u64,
        "hold_mode": hold_mode,
        "ttl_ms": config.ttl.as_millis() as u64,
        "engines": config.engines,
        "threads": config.threads,
        "overtake_slack_us": config.overtake_slack.as_micros() as u64,
        "stagger_us": config.stagger.as_micros() as u64,
        // Other load on the machine, for judging the figures: 1-minute load average.
        "loadavg_1m": support::loadavg(),
    })
}

fn extend(report: &mut Value, fields: Value) {
    let (Value::Object(r), Value::Object(f)) = (report, fields) else {
        unreachable!("both are JSON objects");
    };
    r.extend(f);
}

fn print_human(report: &Value) {
    let Value::Object(fields) = report else {
        return;
    };
    let shown: BTreeMap<_, _> = fields
        .iter()
        .filter(|(k, _)| k.as_str() != "redis_command_calls")
        .collect();
    for (k, v) in shown {
        eprintln!("{k:>30}: {v}");
    }
}

/// A run id, so repeated runs against one Redis never share keys.
fn run_id() -> String {
    format!("{:08x}", rand::random::<u32>())
}
