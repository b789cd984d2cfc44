//! The baseline: the simplest correct Redis lock (`SET NX PX`, a compare-and-delete
//! script), measured like the engine.

use serde_json::Value;

use crate::{config::Config, support};
// What the measured run needs; without the Redis backend the bench reports it is not built.
#[cfg(feature = "redis")]
use {
    crate::{
        report::{extend, header},
        run_id,
        support::{RedisStats, round},
        turns::hold,
    },
    serde_json::json,
    std::{
        sync::{
            Arc,
            atomic::{AtomicU64, AtomicUsize, Ordering},
        },
        time::Instant,
    },
};

/// Release only if the value is still ours: the standard compare-and-delete.
#[cfg(feature = "redis")]
const COMPARE_AND_DELETE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

#[cfg(not(feature = "redis"))]
pub(crate) async fn run(_: &Config) -> Result<Value, String> {
    Err(support::REDIS_NOT_BUILT.to_string())
}

/// Each worker: `SET key token NX PX ttl` until it answers OK (a refusal retries at
/// once: no waiting, no fairness), hold, then the compare-and-delete script by
/// `EVALSHA`. On one multiplexed connection, like the engine's pool.
#[cfg(feature = "redis")]
pub(crate) async fn run(config: &Config) -> Result<Value, String> {
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
