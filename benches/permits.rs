//! Permits against the single lock, in the same run: hand-off p99 and cycles per second of
//! 16 workers cycling 4 permits of one key (FIFO, a 1 ms hold), beside the same workers
//! cycling the lock of one key; and readers per second while a writer cycles the key
//! exclusively, beside the lock's cycles per second. In process always; on Redis too when
//! `REDIS_URL` (or `--redis-url`) is set.
//!
//! ```text
//! cargo bench --bench permits -- [--workers 16] [--permits 4] [--iterations 40]
//!     [--hold-us 1000] [--readers-ms 1000] [--redis-url redis://127.0.0.1:6379]
//! ```
//!
//! Prints one JSON object per backend (one line each): `permits_handoff_p99_us`,
//! `lock_handoff_p99_us` and their `handoff_p99_ratio` (permits ÷ lock);
//! `permits_cycles_per_s`, `lock_cycles_per_s` and `cycles_ratio`; `readers_per_s` (shared
//! holders beside one writer), `writer_cycles_per_s` and `readers_ratio_to_lock`; and
//! `violations`: moments with more than N holders, or a writer beside anyone (must be 0).
//! A hand-off is the time from a release to the grant it let in, for each grant that was
//! waiting when the release was called.

#[path = "support/mod.rs"]
mod support;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst},
    },
    time::{Duration, Instant},
};

use support::{Args, micros, percentiles, redis_engine, redis_url, round};
use tower_lock::{Lease, LockEngine, LockError};

/// One worker's cycle: when it asked, when it was granted, when it called release.
#[derive(Clone, Copy)]
struct Cycle {
    arrival: Instant,
    granted: Instant,
    release_call: Instant,
}

/// The bench's settings.
#[derive(Clone, Copy)]
struct Settings {
    workers: usize,
    permits: u32,
    iterations: usize,
    hold: Duration,
    readers_for: Duration,
}

/// How many hold the key now: shared holders, and exclusive ones. A grant that breaks the
/// limit is counted as a violation.
#[derive(Default)]
struct Holders {
    shared: AtomicUsize,
    exclusive: AtomicUsize,
    violations: AtomicUsize,
}

impl Holders {
    fn enter(&self, exclusive: bool, limit: usize) {
        if exclusive {
            let w = self.exclusive.fetch_add(1, SeqCst) + 1;
            if w != 1 || self.shared.load(SeqCst) != 0 {
                self.violations.fetch_add(1, SeqCst);
            }
        } else {
            let r = self.shared.fetch_add(1, SeqCst) + 1;
            if r > limit || self.exclusive.load(SeqCst) != 0 {
                self.violations.fetch_add(1, SeqCst);
            }
        }
    }

    fn leave(&self, exclusive: bool) {
        let count = if exclusive {
            &self.exclusive
        } else {
            &self.shared
        };
        count.fetch_sub(1, SeqCst);
    }
}

/// What to take: the lock, a shared permit of `n`, or the key alone.
#[derive(Clone, Copy)]
enum Take {
    Lock,
    Shared(u32),
    Exclusive,
}

async fn acquire(engine: &LockEngine, key: &str, take: Take) -> Result<Lease, LockError> {
    let wait = Duration::from_secs(30);
    match take {
        Take::Lock => engine.lock(key).fifo(true).wait(wait).acquire().await,
        Take::Shared(n) => {
            engine
                .lock(key)
                .shared(n)
                .fifo(true)
                .wait(wait)
                .acquire()
                .await
        }
        Take::Exclusive => {
            let permits = engine.lock(key).shared(1).shared(1);
            permits.fifo(true).wait(wait).acquire().await
        }
    }
}

/// `workers` cycling `take` on `key` `iterations` times each, holding for `hold`: every
/// cycle, and the wall time.
async fn cycle(
    engine: &LockEngine,
    key: &str,
    take: Take,
    s: Settings,
) -> (Vec<Cycle>, Duration, usize) {
    let holders = Arc::new(Holders::default());
    let limit = match take {
        Take::Lock | Take::Exclusive => 1,
        Take::Shared(n) => n as usize,
    };
    let started = Instant::now();
    let tasks: Vec<_> = (0..s.workers)
        .map(|_| {
            let (engine, key, holders) = (engine.clone(), key.to_owned(), holders.clone());
            tokio::spawn(async move {
                let mut log = Vec::with_capacity(s.iterations);
                for _ in 0..s.iterations {
                    let arrival = Instant::now();
                    let lease = acquire(&engine, &key, take).await.expect("granted");
                    let granted = Instant::now();
                    holders.enter(false, limit);
                    tokio::time::sleep(s.hold).await;
                    holders.leave(false);
                    let release_call = Instant::now();
                    lease.release().await.expect("released");
                    log.push(Cycle {
                        arrival,
                        granted,
                        release_call,
                    });
                }
                log
            })
        })
        .collect();
    let mut cycles = Vec::new();
    for task in tasks {
        cycles.extend(task.await.unwrap());
    }
    (cycles, started.elapsed(), holders.violations.load(SeqCst))
}

/// The hand-offs of a run: for each grant that was waiting when the latest release before
/// it was called, the time from that release call to the grant (µs).
fn handoffs(cycles: &[Cycle]) -> Vec<f64> {
    let mut releases: Vec<Instant> = cycles.iter().map(|c| c.release_call).collect();
    releases.sort();
    cycles
        .iter()
        .filter_map(|c| {
            let i = releases.partition_point(|r| *r <= c.granted);
            let release = *releases.get(i.checked_sub(1)?)?;
            (release >= c.arrival).then(|| micros(c.granted - release))
        })
        .collect()
}

/// Readers cycling shared permits (no limit) on `key` beside one writer cycling it
/// exclusively, for `s.readers_for`: reader cycles per second, writer cycles per second,
/// violations.
async fn readers_beside_a_writer(engine: &LockEngine, key: &str, s: Settings) -> (f64, f64, usize) {
    let holders = Arc::new(Holders::default());
    let stop = Arc::new(AtomicBool::new(false));
    let worker = |exclusive: bool| {
        let (engine, key) = (engine.clone(), key.to_owned());
        let (holders, stop) = (holders.clone(), stop.clone());
        tokio::spawn(async move {
            let take = if exclusive {
                Take::Exclusive
            } else {
                Take::Shared(u32::MAX)
            };
            let mut done = 0u64;
            while !stop.load(SeqCst) {
                let lease = acquire(&engine, &key, take).await.expect("granted");
                holders.enter(exclusive, usize::MAX);
                tokio::time::sleep(s.hold).await;
                holders.leave(exclusive);
                lease.release().await.expect("released");
                done += 1;
            }
            done
        })
    };
    let readers: Vec<_> = (0..s.workers - 1).map(|_| worker(false)).collect();
    let writer = worker(true);
    let started = Instant::now();
    tokio::time::sleep(s.readers_for).await;
    stop.store(true, SeqCst);
    let mut read = 0;
    for r in readers {
        read += r.await.unwrap();
    }
    let written = writer.await.unwrap();
    let wall = started.elapsed().as_secs_f64();
    (
        read as f64 / wall,
        written as f64 / wall,
        holders.violations.load(SeqCst),
    )
}

async fn run(backend: &str, engine: LockEngine, s: Settings) -> String {
    let (lock_cycles, lock_wall, lock_violations) =
        cycle(&engine, "bench-lock", Take::Lock, s).await;
    let permits = Take::Shared(s.permits);
    let (permit_cycles, permit_wall, permit_violations) =
        cycle(&engine, "bench-permits", permits, s).await;
    let (readers, writer, rw_violations) = readers_beside_a_writer(&engine, "bench-rw", s).await;

    let p99 = |cycles: &[Cycle]| {
        let mut h = handoffs(cycles);
        percentiles(&mut h).map(|p| round(p.p99, 1))
    };
    let rate = |cycles: &[Cycle], wall: Duration| cycles.len() as f64 / wall.as_secs_f64();
    let lock_p99 = p99(&lock_cycles);
    let permits_p99 = p99(&permit_cycles);
    let lock_rate = rate(&lock_cycles, lock_wall);
    let permits_rate = rate(&permit_cycles, permit_wall);
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{}", round(a / b, 3)),
        _ => "null".to_owned(),
    };
    let opt = |v: Option<f64>| v.map_or("null".to_owned(), |v| v.to_string());
    format!(
        "{{\"backend\":\"{backend}\",\"workers\":{},\"permits\":{},\"hold_us\":{},\
         \"permits_handoff_p99_us\":{},\"lock_handoff_p99_us\":{},\"handoff_p99_ratio\":{},\
         \"permits_cycles_per_s\":{},\"lock_cycles_per_s\":{},\"cycles_ratio\":{},\
         \"readers_per_s\":{},\"writer_cycles_per_s\":{},\"readers_ratio_to_lock\":{},\
         \"violations\":{}}}",
        s.workers,
        s.permits,
        s.hold.as_micros(),
        opt(permits_p99),
        opt(lock_p99),
        ratio(permits_p99, lock_p99),
        round(permits_rate, 1),
        round(lock_rate, 1),
        ratio(Some(permits_rate), Some(lock_rate)),
        round(readers, 1),
        round(writer, 1),
        ratio(Some(readers), Some(lock_rate)),
        lock_violations + permit_violations + rw_violations,
    )
}

fn main() -> Result<(), String> {
    let args = Args::parse(&[])?;
    args.reject_unknown(&[
        "workers",
        "permits",
        "iterations",
        "hold-us",
        "readers-ms",
        "redis-url",
    ])?;
    // Under `cargo test --all-targets`: a short smoke run.
    let benching = args.benching();
    let s = Settings {
        workers: args.get("workers", 16)?.max(2),
        permits: args.get("permits", 4)?.max(1),
        iterations: args.get("iterations", if benching { 40 } else { 3 })?,
        hold: Duration::from_micros(args.get("hold-us", 1000)?),
        readers_for: Duration::from_millis(
            args.get("readers-ms", if benching { 1000 } else { 50 })?,
        ),
    };
    let url = redis_url(&args);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let lines = runtime.block_on(async {
        let mut lines = vec![run("memory", LockEngine::in_memory(), s).await];
        if let Some(url) = &url {
            let prefix = format!("bench-permits-{}", std::process::id());
            let engine = redis_engine(url, &prefix).await?;
            lines.push(run("redis", engine, s).await);
        }
        Ok::<_, String>(lines)
    })?;
    for line in lines {
        println!("{line}");
    }
    Ok(())
}
