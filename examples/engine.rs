//! The lock engine used directly: acquire, extend, pass the fence to storage, release.
//!
//! Runs in-process with no setup: `cargo run --example engine`.

use std::time::Duration;

use tower_lock::{LockEngine, LockError};

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let engine = LockEngine::in_memory();

    // Three workers want the same invoice; they take turns.
    let mut workers = Vec::new();
    for worker in 0..3 {
        let engine = engine.clone();
        workers.push(tokio::spawn(async move {
            let lease = engine
                .lock("invoice:42")
                .ttl(Duration::from_secs(5))
                .fifo(true)
                .acquire()
                .await?;
            println!(
                "worker {worker}: holding {} with fence {} (waited {:?})",
                lease.key(),
                lease.fence(),
                lease.waited()
            );
            // A slow step: ask for more time instead of risking expiry.
            lease.extend(Duration::from_secs(5)).await?;
            tokio::time::sleep(Duration::from_millis(50)).await;
            lease.release().await
        }));
    }
    for w in workers {
        w.await.expect("worker panicked")?;
    }

    // Non-blocking: a held key answers Busy with the holder's remaining time.
    let lease = engine.lock("report").acquire().await?;
    match engine.lock("report").try_acquire().await {
        Err(LockError::Busy { retry_after }) => {
            println!("report is busy; retry in {retry_after:?}")
        }
        other => println!("unexpected: {other:?}"),
    }
    lease.release().await?;
    println!("done");
    Ok(())
}
