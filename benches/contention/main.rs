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
//!
//! The contended run is in `turns` (its figures in `analysis`), the residue run in
//! `residue`, the plain `SET NX` lock it is compared with in `baseline`, the Postgres
//! database and its simple-lock baseline in `postgres`; what the workers lock with (the
//! engines, or the Postgres advisory locks, through the same run) in `lockers`.

// Shared with the other benches (`benches/support/`).
#[path = "../support/mod.rs"]
mod support;

mod analysis;
mod baseline;
mod config;
mod engines;
mod lockers;
mod postgres;
mod report;
mod residue;
mod turns;

use std::process::ExitCode;

use config::Config;
use report::print_human;
use residue::residue;
use support::Args;
use turns::contention;

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
                           | postgres|postgres-baseline|postgres-advisory
                           | postgres-advisory-session
                             (needs the `postgres` feature; the baselines:
                             one INSERT ... ON CONFLICT and one DELETE by
                             token, a refused try retrying at once; or
                             pg_advisory_xact_lock in a transaction; or
                             pg_advisory_lock / pg_advisory_unlock on a
                             pooled connection: the advisory locks run as
                             the engine does, with every figure)
    --redis-url URL          Redis server (else $REDIS_URL)
    --database-url URL       Postgres database (else $DATABASE_URL; else the
                               bench starts a throwaway cluster, as the
                               `postgres` user, and stops it on exit)
    --pool N                 Postgres connections per engine and baseline   [10]
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
                               entries; DBSIZE of the URL's database; rows
                               of the Postgres lock and ticket tables)     [off]
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
    fifo_overtakes   grants made while a waiter that was in line (its acquire's
                     first poll had returned) > slack before this acquire was
                     called still waited (fifo_overtakes_strict: slack 0)
    fifo_overtakes_by_call_start   the same, from the calls' starts alone: also
                     counts a caller preempted between its clock read and its line
    call_entry_max_us  longest time from an acquire's call to its first poll's end
    longest_run      most consecutive grants of one key to one worker
    redis_commands_per_cycle   server-side commands (INFO commandstats, including
                     those run inside Lua scripts) / cycles; null for memory
    postgres_transactions_per_cycle   pg_stat_database commits + rollbacks / cycles
                     (each engine call is one statement in its own transaction)
    mutual_exclusion_violations   two holders at once (must be 0)
";

const FLAGS: &[&str] = &["fifo", "json", "help"];
pub(crate) const OPTIONS: &[&str] = &[
    "backend",
    "redis-url",
    "database-url",
    "pool",
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
        if config.backend.starts_with("postgres") {
            postgres::open(&config).await?;
        }
        match config.residue_keys {
            Some(n) => residue(&config, n).await,
            None if config.backend == "redis-baseline" => baseline::run(&config).await,
            #[cfg(feature = "postgres")]
            None if config.backend == "postgres-baseline" => postgres::baseline(&config).await,
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
                // (Overtakes are a measured figure, not asserted here: FIFO is tested in the
                // conformance suite.)
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

/// A run id, so repeated runs against one Redis never share keys.
pub(crate) fn run_id() -> String {
    format!("{:08x}", rand::random::<u32>())
}
