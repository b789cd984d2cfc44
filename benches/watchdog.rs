//! The watchdog's cost per live lease: CPU of the whole process while N leases are held
//! and renewed, against the cost of the backend's own renew work for those leases
//! measured in the same run (so the ratio is the watchdog's overhead, machine aside).
//!
//! ```text
//! cargo bench --bench watchdog -- [--leases 20000] [--ttl-ms 3000] [--window-s 6]
//! ```
//!
//! Prints one JSON object: `cpu_pct` (of one core, whole process, during the window),
//! `cpu_ms_per_s_per_1000` (CPU milliseconds per second per 1,000 live leases),
//! `renew_ns_per_lease` (the backend's renew of one lease, called directly in a batch) and
//! `overhead` (measured CPU ÷ the CPU those renewals need by themselves).

use std::{sync::Arc, time::Duration};

use tower_lock::{
    LockEngine, MemoryBackend,
    engine::{Backend, Renewal},
};

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// User + system CPU time of this process so far (`/proc/self/stat`, in clock ticks of
/// 10 ms: USER_HZ is 100 on Linux).
fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')').expect("stat format") + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

fn main() {
    // `cargo bench` passes `--bench`; a plain `cargo test --benches` run is a smoke test.
    let benching = std::env::args().any(|a| a == "--bench");
    let leases = arg("--leases", if benching { 20_000 } else { 500 }) as usize;
    let ttl = Duration::from_millis(arg("--ttl-ms", 3_000));
    let window = Duration::from_secs(arg("--window-s", if benching { 6 } else { 1 }));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let backend = Arc::new(MemoryBackend::new());
        let engine = LockEngine::from_arc(backend.clone());
        // Granted over about a second, so renewals are spread as in a live service.
        let mut held = Vec::with_capacity(leases);
        let batches = 20;
        for b in 0..batches {
            for i in 0..leases / batches {
                let lease = engine
                    .lock(format!("lease-{b}-{i}"))
                    .ttl(ttl)
                    .acquire()
                    .await
                    .unwrap();
                held.push(lease);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(ttl / 3).await;
        let cpu_before = process_cpu();
        let started = std::time::Instant::now();
        tokio::time::sleep(window).await;
        let cpu = process_cpu() - cpu_before;
        let wall = started.elapsed();
        let lost = held.iter().filter(|l| l.is_lost()).count();

        // Baseline: the backend's renew work for every lease, called directly in batches.
        let batch: Vec<Renewal> = held
            .iter()
            .map(|l| Renewal {
                key: l.key().clone(),
                mode: l.mode(),
                token: l.token().clone(),
                ttl,
            })
            .collect();
        let rounds = 20;
        let t = std::time::Instant::now();
        for _ in 0..rounds {
            let renewed = backend.renew(&batch).await.unwrap();
            assert!(renewed.iter().all(|ok| *ok));
        }
        let renew_ns = t.elapsed().as_nanos() as f64 / (rounds * batch.len()) as f64;
        // A lease is renewed at a third of its TTL.
        let renewals_per_s = held.len() as f64 / (ttl.as_secs_f64() / 3.0);
        let needed_cpu_frac = renewals_per_s * renew_ns / 1e9;
        let cpu_frac = cpu.as_secs_f64() / wall.as_secs_f64();
        println!(
            "{{\"leases\":{},\"ttl_ms\":{},\"window_s\":{:.1},\"lost\":{},\"cpu_pct\":{:.2},\"cpu_ms_per_s_per_1000\":{:.3},\"renew_ns_per_lease\":{:.0},\"overhead\":{:.2}}}",
            held.len(),
            ttl.as_millis(),
            wall.as_secs_f64(),
            lost,
            cpu_frac * 100.0,
            cpu_frac * 1000.0 / (held.len() as f64 / 1000.0),
            renew_ns,
            cpu_frac / needed_cpu_frac,
        );
        drop(held);
    });
}
