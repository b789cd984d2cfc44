//! The Postgres backend at fleet scale, on a throwaway cluster of its own (the test
//! fixture): a lock cycle's latency with an empty lock table and with a million rows while
//! `--engines` nodes (default 32) run their sweepers; and what a sweep costs against what
//! expired, over the million rows. Prints one JSON object per figure (`--json`) or a line
//! each. (Hand-off cost by engine count: the contention bench's `--engines`, see
//! `benches/run.sh`.)
//!
//! ```sh
//! cargo bench --features postgres --bench pg_fleet -- --json
//! cargo bench --features postgres --bench pg_fleet -- --rows 100000 --engines 8
//! ```

mod support;

use std::{process::ExitCode, time::Instant};

use serde_json::{Value, json};
use support::{Args, micros, percentiles, round};
use tower_lock::{
    LockEngine,
    engine::postgres::{
        PostgresBackend,
        sqlx::{self, Executor, Row, postgres::PgPoolOptions},
    },
};
use tower_lock_test_support::postgres::PostgresServer;

const OPTIONS: &[&str] = &["rows", "engines", "cycles", "keys", "json", "bench"];

/// A run's settings.
struct Config {
    rows: i64,
    engines: usize,
    cycles: usize,
    keys: usize,
    json: bool,
}

fn main() -> ExitCode {
    let args = match Args::parse(&["json", "bench"]) {
        Ok(args) => args,
        Err(e) => return fail(&e),
    };
    if let Err(e) = args.reject_unknown(OPTIONS) {
        return fail(&e);
    }
    let config = || -> Result<Config, String> {
        Ok(Config {
            rows: args.get("rows", 1_000_000)?,
            engines: args.get("engines", 32)?,
            cycles: args.get("cycles", 2000)?,
            keys: args.get("keys", 1000)?,
            json: args.flag("json"),
        })
    };
    let config = match config() {
        Ok(c) if c.engines > 0 && c.cycles > 0 && c.keys > 0 => c,
        Ok(_) => return fail("--engines, --cycles and --keys must be at least 1"),
        Err(e) => return fail(&e),
    };
    if !args.benching() {
        // Under `cargo test`: nothing to smoke-test without a cluster.
        return ExitCode::SUCCESS;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(run(&config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

fn fail(e: &str) -> ExitCode {
    eprintln!("pg_fleet: {e}");
    ExitCode::FAILURE
}

fn print(config: &Config, figure: &Value) {
    if config.json {
        println!("{figure}");
    } else {
        println!(
            "{}",
            figure.as_object().map_or(String::new(), |o| {
                o.iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
        );
    }
}

async fn run(config: &Config) -> Result<(), String> {
    let server = tokio::task::spawn_blocking(PostgresServer::start)
        .await
        .map_err(|e| e.to_string())?;
    let url = server.url();
    let e = |e: sqlx::Error| e.to_string();
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .map_err(e)?;
    let exec = |sql: String| {
        let admin = admin.clone();
        async move { admin.execute(sqlx::raw_sql(&sql)).await.map_err(e) }
    };

    // Acquire latency: an empty table beside `rows` live leases, `engines` nodes sweeping
    // each. The two are measured in alternating rounds, after the fill's checkpoint: one
    // after the other, the second met whatever the machine did then (the fill's
    // checkpoint, autovacuum, another process), and the ratio moved 0.8 to 1.4 between
    // runs of the same code.
    let mut sides = Vec::new();
    for schema in ["fleet_empty", "fleet"] {
        let builder = PostgresBackend::builder(&url).schema(schema).pool_size(2);
        builder.migrate().await.map_err(|e| e.to_string())?;
        let mut engines = Vec::new();
        for _ in 0..config.engines {
            let backend = builder.clone().build().await.map_err(|e| e.to_string())?;
            engines.push(LockEngine::new(backend));
        }
        sides.push(engines);
    }
    fill(&exec, "fleet", config.rows).await?;
    // As the superuser (`psql`): the bench's role may not.
    tokio::task::block_in_place(|| server.psql("CHECKPOINT"));
    let mut samples = [Samples::default(), Samples::default()];
    for engines in &sides {
        // The first round of keys inserts their rows; the measured rounds update them.
        cycles(
            &engines[0],
            config.keys,
            config.keys,
            &mut Samples::default(),
        )
        .await?;
    }
    let per_round = config.cycles.div_ceil(ROUNDS);
    for _ in 0..ROUNDS {
        for (side, engines) in sides.iter().enumerate() {
            cycles(&engines[0], config.keys, per_round, &mut samples[side]).await?;
        }
    }
    let [empty, full] = samples.map(|mut s| s.figure(config));
    print(config, &with(&empty, &json!({"table": "empty"})));
    print(
        config,
        &with(
            &full,
            &json!({"table": format!("{} live rows", config.rows)}),
        ),
    );
    print(
        config,
        &json!({
            "figure": "acquire p50 with the rows / empty (goal <= 1.2)",
            "engines": config.engines,
            "ratio": round(full["acquire_p50_us"].as_f64().unwrap_or(0.0)
                / empty["acquire_p50_us"].as_f64().unwrap_or(1.0), 2),
        }),
    );
    drop(sides);

    // Sweep cost against what expired, in a schema no node sweeps (nothing races it).
    PostgresBackend::builder(&url)
        .schema("swept")
        .migrate()
        .await
        .map_err(|e| e.to_string())?;
    fill(&exec, "swept", config.rows).await?;
    let sweep = "SELECT \"swept\".sweep(5000, 1000, 1)";
    for expired in [0, config.rows / 100, config.rows / 10] {
        exec(format!(
            "UPDATE swept.locks SET token = NULL, expires_at = clock_timestamp() - interval '1 hour'
               WHERE key IN (SELECT 'fill' || g FROM generate_series(1, {expired}) g)"
        ))
        .await?;
        let began = Instant::now();
        let (mut deleted, mut calls) = (0, 0);
        loop {
            let n: i64 = admin
                .fetch_one(sqlx::raw_sql(sweep))
                .await
                .map_err(e)?
                .get(0);
            calls += 1;
            deleted += n.max(0);
            if n < 1000 {
                break;
            }
        }
        let took = began.elapsed();
        print(
            config,
            &json!({
                "figure": "sweep",
                "table_rows": config.rows,
                "expired": expired,
                "deleted": deleted,
                "calls": calls,
                "ms": round(took.as_secs_f64() * 1e3, 2),
            }),
        );
        // Put the rows back: each round expires its own count over a full table.
        fill(&exec, "swept", config.rows).await?;
    }
    // What a version 4 sweep read first on every node every 5 s: the whole lock table.
    let began = Instant::now();
    admin
        .execute(sqlx::raw_sql(
            "SELECT count(*) FROM swept.locks l
               WHERE EXISTS (SELECT 1 FROM swept.tickets w WHERE w.key = l.key
                                AND w.deadline < clock_timestamp())
                  OR EXISTS (SELECT 1 FROM swept.shared_leases s WHERE s.key = l.key
                                AND s.expires_at < clock_timestamp())",
        ))
        .await
        .map_err(e)?;
    print(
        config,
        &json!({
            "figure": "version 4 sweep's first scan (every node, every 5 s)",
            "table_rows": config.rows,
            "ms": round(began.elapsed().as_secs_f64() * 1e3, 2),
        }),
    );
    admin.close().await;
    drop(server);
    Ok(())
}

/// `value`'s fields, then `extra`'s.
fn with(value: &Value, extra: &Value) -> Value {
    let mut out = value.clone();
    if let (Some(out), Some(extra)) = (out.as_object_mut(), extra.as_object()) {
        out.extend(extra.clone());
    }
    out
}

/// `rows` live leases (an hour left) in `schema`'s lock table, keys `fill<i>`, replacing
/// any there; analyzed.
async fn fill<F, Fut>(exec: &F, schema: &str, rows: i64) -> Result<(), String>
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = Result<sqlx::postgres::PgQueryResult, String>>,
{
    exec(format!(
        "INSERT INTO {schema}.locks AS l (key, token, fence, expires_at)
           SELECT 'fill' || g, 'holder', g, clock_timestamp() + interval '1 hour'
             FROM generate_series(1, {rows}) g
           ON CONFLICT (key) DO UPDATE SET token = excluded.token,
             expires_at = excluded.expires_at"
    ))
    .await?;
    // Its own statement: `VACUUM` runs in no transaction block.
    exec(format!("VACUUM ANALYZE {schema}.locks"))
        .await
        .map(drop)
}

/// Rounds of each side in turn (see `run`).
const ROUNDS: usize = 4;

/// One side's latencies, over its rounds.
#[derive(Default)]
struct Samples {
    acquire: Vec<f64>,
    release: Vec<f64>,
}

impl Samples {
    fn figure(&mut self, config: &Config) -> Value {
        let a = percentiles(&mut self.acquire).unwrap_or_default();
        let r = percentiles(&mut self.release).unwrap_or_default();
        json!({
            "figure": "uncontended cycle",
            "engines": config.engines,
            "cycles": self.acquire.len(),
            "rounds": ROUNDS,
            "acquire_p50_us": round(a.p50, 1),
            "acquire_p99_us": round(a.p99, 1),
            "release_p50_us": round(r.p50, 1),
            "release_p99_us": round(r.p99, 1),
        })
    }
}

/// `n` uncontended cycles on `keys` keys (`key0`, `key1`, ...) in turn, going on from where
/// `samples`' last round stopped, each acquire's and release's latency added to `samples`.
async fn cycles(
    engine: &LockEngine,
    keys: usize,
    n: usize,
    samples: &mut Samples,
) -> Result<(), String> {
    let done = samples.acquire.len();
    for i in done..done + n {
        let lock = engine.lock(format!("key{}", i % keys));
        let began = Instant::now();
        let lease = lock.try_acquire().await.map_err(|e| e.to_string())?;
        let acquired = began.elapsed();
        let began = Instant::now();
        lease.release().await.map_err(|e| e.to_string())?;
        samples.acquire.push(micros(acquired));
        samples.release.push(micros(began.elapsed()));
    }
    Ok(())
}
