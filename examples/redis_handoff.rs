//! Measure the Redis backend: uncontended acquire + release cycles per second, and the
//! hand-off latency from a release on one node to the waiting node's acquire returning
//! (release round trip + pub/sub delivery + the waiter's acquire round trip).
//!
//! ```text
//! redis-server --port 6390 --save "" --appendonly no &
//! REDIS_URL=redis://127.0.0.1:6390 cargo run --release --example redis_handoff
//! ```

use std::time::Duration;

use tokio::time::Instant;
use tower_lock::{LockEngine, engine::redis::RedisBackend};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Ok(url) = std::env::var("REDIS_URL") else {
        eprintln!("set REDIS_URL (e.g. redis://127.0.0.1:6379) to run this measurement");
        return Ok(());
    };
    let prefix = format!("handoff-{}", std::process::id());
    let node = |_: u8| {
        let (url, prefix) = (url.clone(), prefix.clone());
        async move {
            let backend = RedisBackend::builder(url).prefix(prefix).build().await?;
            Ok::<_, tower_lock::BackendError>(LockEngine::new(backend))
        }
    };
    let (a, b) = (node(0).await?, node(1).await?);

    // Uncontended: one task, acquire + release in a loop.
    let n = 2000;
    let started = Instant::now();
    for _ in 0..n {
        a.lock("solo").try_acquire().await?.release().await?;
    }
    let elapsed = started.elapsed();
    println!(
        "uncontended: {:.0} acquire+release cycles/s ({:?} per cycle)",
        f64::from(n) / elapsed.as_secs_f64(),
        elapsed / n
    );

    for fifo in [false, true] {
        let mut samples = Vec::new();
        for _ in 0..200 {
            let held = a.lock("handoff").fifo(fifo).acquire().await?;
            let waiter = {
                let b = b.clone();
                tokio::spawn(async move {
                    let lease = b.lock("handoff").fifo(fifo).acquire().await?;
                    let at = Instant::now();
                    lease.release().await?;
                    Ok::<_, tower_lock::LockError>(at)
                })
            };
            while a.lock("handoff").waiters().await? == 0 {
                tokio::task::yield_now().await;
            }
            // Let the waiter get past its confirmed-subscription retry and go to sleep.
            tokio::time::sleep(Duration::from_millis(5)).await;
            let released = Instant::now();
            held.release().await?;
            let acquired = waiter.await??;
            samples.push(acquired - released);
        }
        samples.sort();
        let pct = |p: usize| samples[(samples.len() * p / 100).min(samples.len() - 1)];
        println!(
            "hand-off across nodes (fifo={fifo}): p50 {:?}, p90 {:?}, p99 {:?}, max {:?}",
            pct(50),
            pct(90),
            pct(99),
            samples[samples.len() - 1]
        );
    }
    Ok(())
}
