//! The engine's tools beyond plain locks: key status and admin operations, numeric
//! compare-and-set, lock pools with health checks, and a function guard.
//!
//! Runs in-process with no setup: `cargo run --example engine_tools`.

use std::time::Duration;

use tower_lock::{
    LockEngine, Token,
    engine::{Compare, LockStatus, MutexError},
};

#[tokio::main]
pub(crate) async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let engine = LockEngine::in_memory();

    // A pool of printers, with the status of every member in one round trip.
    let printers = engine
        .pool("printers")
        .expected_ttl(Duration::from_secs(30));
    printers
        .replace(["printer:1", "printer:2", "printer:3"])
        .await?;
    let job = engine
        .lock("printer:1")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await?;

    // An operator takes printer 2 out of service for an hour.
    let maintenance = Token::new("maintenance")?;
    engine
        .admin()
        .set("printer:2", &maintenance, Some(Duration::from_secs(3600)))
        .await?;
    for (printer, status) in printers.statuses().await? {
        let shown = match status {
            LockStatus::Free => "free".to_string(),
            LockStatus::Locked { ttl, .. } => format!("printing ({}s left)", ttl.as_secs()),
            LockStatus::Reserved { owner, ttl } => {
                format!("unavailable: {} for {}s", owner.as_str(), ttl.as_secs())
            }
            LockStatus::NoExpiry { .. } => "stuck (no expiry)".to_string(),
        };
        println!("{printer}: {shown}");
    }
    let health = printers.health().await?;
    println!(
        "pool health: {} locked, {} free",
        health.locked, health.free
    );
    job.release().await?;
    engine.admin().force_release("printer:2").await?;

    // A high-water mark that only moves forward, whoever writes it.
    let offset = engine.numeric("orders:offset");
    for seen in [10.0, 7.0, 12.0] {
        let moved = offset.set_if(Compare::Greater, seen, None).await?;
        println!(
            "offset {seen}: {}",
            if moved { "advanced" } else { "ignored (older)" }
        );
    }
    println!("offset is now {:?}", offset.get().await?);

    // Run a job at most once at a time; the key is released on every exit path.
    let nightly = engine.mutex("job:nightly");
    let rows = nightly.run(|| async { 1_204 }).await?;
    println!("nightly job processed {rows} rows");
    nightly.acquire().await?;
    match nightly.acquire().await {
        Err(MutexError::AlreadyHeld) => println!("second acquire on the same handle: refused"),
        other => println!("unexpected: {other:?}"),
    }
    nightly.release().await?;

    printers.clear().await?;
    offset.delete_if(Compare::NotEqual, f64::MAX).await?;
    Ok(())
}
