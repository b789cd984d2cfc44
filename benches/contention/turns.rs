//! The contention run: workers take turns on a few keys, acquire -> hold -> release, and
//! every grant is logged for the analysis.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use serde_json::{Value, json};

use crate::support::{self, RedisStats, micros, round};
use crate::{
    analysis::{analyse, p},
    config::{Config, Hold},
    lockers::lockers,
    report::{extend, header},
    run_id,
};

/// One acquire → hold → release cycle, as seen by its worker.
#[derive(Clone, Copy)]
pub(crate) struct Cycle {
    pub(crate) worker: usize,
    /// When `acquire()` was called.
    pub(crate) arrival: Instant,
    /// When the acquire's first poll returned: by then the call has taken its place in the
    /// engine's line (and, in process, in the key's queue). A call is in line somewhere in
    /// `arrival..entered`; FIFO orders calls whose intervals do not overlap.
    pub(crate) entered: Instant,
    /// When `acquire()` returned.
    pub(crate) granted: Instant,
    /// When `release()` was called.
    pub(crate) release_call: Instant,
    /// `None` for a lock without fences (the advisory-lock baselines).
    pub(crate) fence: Option<u64>,
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

pub(crate) async fn contention(config: &Config) -> Result<Value, String> {
    let engines = lockers(config).await?;
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
        engine
            .warm_up(&format!("contention:{run_id}:warmup"), config)
            .await
            .map_err(|e| format!("warm-up: {e}"))?;
    }
    // A Postgres node listens while it holds a lease and for 2 s after (its listener's
    // linger): the warm-up's lease would keep every engine listening through a short run,
    // and on Postgres up to 18 each `NOTIFY` wakes every listener. Measured past it, a
    // run with more engines than workers shows the steady state, where the idle ones do
    // not listen.
    if config.backend == "postgres" && config.engines > 1 {
        tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
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

    #[cfg(feature = "postgres")]
    let transactions_before = match config.backend.starts_with("postgres") {
        true => Some(crate::postgres::database().transactions().await?),
        false => None,
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
            let record_error = |what: &str, e: String| {
                errors.fetch_add(1, Ordering::Relaxed);
                first_error
                    .lock()
                    .unwrap()
                    .get_or_insert_with(|| format!("{what}: {e}"));
            };
            let _ = start.await;
            for _ in 0..config.iterations {
                let arrival = Instant::now();
                let call = engine.acquire(&slot.name, &config);
                tokio::pin!(call);
                let mut entered = None;
                let acquired = std::future::poll_fn(|cx| {
                    let polled = call.as_mut().poll(cx);
                    entered.get_or_insert_with(Instant::now);
                    polled
                })
                .await;
                let entered = entered.expect("the acquire was polled");
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
                    entered,
                    granted,
                    release_call,
                    fence: lease.fence(),
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
    // The engines' connections are closed first, so that their backends report every
    // transaction (see `postgres`).
    for engine in engines {
        engine.close().await;
    }
    #[cfg(feature = "postgres")]
    let transactions = match transactions_before {
        Some(before) => Some(
            crate::postgres::database()
                .transactions_once_closed()
                .await?
                - before,
        ),
        None => None,
    };
    #[cfg(not(feature = "postgres"))]
    let transactions: Option<i64> = None;
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
        "fifo_overtakes_by_call_start": analysis.overtakes_by_call_start,
        "call_entry_max_us": p(&analysis.entries, |p| p.max),
        "fifo_overtake_positions": analysis.overtake_positions,
        "longest_run": analysis.longest_run,
        "fence_regressions": analysis.fence_regressions,
        "mutual_exclusion_violations": violations.load(Ordering::Relaxed),
        "redis_commands": total_commands,
        "redis_commands_per_cycle": total_commands.map(|n| round(n as f64 / cycles.max(1) as f64, 2)),
        "redis_command_calls": commands,
        "postgres_transactions_per_cycle":
            transactions.map(|n| round(n as f64 / cycles.max(1) as f64, 2)),
    });
    extend(&mut report, fields);
    Ok(report)
}

pub(crate) async fn hold(d: Duration, mode: Hold) {
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
