//! The residue run: lock and release many distinct keys, then measure what is left
//! behind (memory, the in-process table's keys, Redis's `DBSIZE`).

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Instant,
};

use serde_json::{Value, json};
use tower_lock::LockEngine;

use crate::support::{self, RedisStats, round};
use crate::{
    config::Config,
    engines::engines,
    report::{extend, header},
    run_id,
};

/// Lock and release `n` distinct keys, then check that nothing is left behind: the
/// engine's "no residue" promise, measured.
pub(crate) async fn residue(config: &Config, n: u64) -> Result<Value, String> {
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
    let rows_after = postgres_rows(config).await?;
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
            postgres_rows(config).await?,
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
            "rss_settled_kib": settled.as_ref().and_then(|s| s.0),
            "key_count_settled": settled.as_ref().and_then(|s| s.1),
            "redis_dbsize_settled": settled.as_ref().and_then(|s| s.2),
            // Postgres: every row of the lock table (fence tombstones included, swept within
            // 10 s), live leases, tickets; right after, and once settled.
            "postgres_lock_rows_after": rows_after.map(|r| r.0),
            "postgres_live_leases_after": rows_after.map(|r| r.1),
            "postgres_tickets_after": rows_after.map(|r| r.2),
            "postgres_lock_rows_settled": settled.as_ref().and_then(|s| s.3).map(|r| r.0),
            "postgres_live_leases_settled": settled.as_ref().and_then(|s| s.3).map(|r| r.1),
            "postgres_tickets_settled": settled.as_ref().and_then(|s| s.3).map(|r| r.2),
        }),
    );
    Ok(report)
}

/// On Postgres, the run's rows: (lock rows, live leases, tickets).
async fn postgres_rows(config: &Config) -> Result<Option<(i64, i64, i64)>, String> {
    #[cfg(feature = "postgres")]
    if config.backend == "postgres" {
        return crate::postgres::database().rows().await.map(Some);
    }
    let _ = config;
    Ok(None)
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
