//! The lock engine used directly: acquire, extend, release, and the fencing token handed
//! to a storage that refuses stale writers.
//!
//! Runs in-process with no setup: `cargo run --example engine` (`REDIS_URL` switches to
//! Redis, `DATABASE_URL` with `--features postgres` to Postgres).

mod common;

use std::{
    collections::HashMap,
    fmt,
    sync::{Arc, Mutex},
    time::Duration,
};

use tower_lock::{Fence, LockEngine, LockError};

/// A storage that keeps, per record, the highest fence it has seen, and refuses writes
/// with a lower one. This is what makes a lock safe against a holder that stalls past its
/// lease: the lease alone cannot stop it, the storage can.
#[derive(Clone, Debug, Default)]
pub(crate) struct FencedStore {
    records: Arc<Mutex<HashMap<String, (Fence, String)>>>,
}

/// A write refused because a newer holder has written with a higher fence.
#[derive(Debug)]
pub(crate) struct StaleFence {
    pub(crate) offered: Fence,
    pub(crate) seen: Fence,
}

impl fmt::Display for StaleFence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "fence {} is older than {}", self.offered, self.seen)
    }
}

impl FencedStore {
    /// Write `value` to `record` under `fence`, unless a higher fence has written it.
    pub(crate) fn write(&self, record: &str, fence: Fence, value: &str) -> Result<(), StaleFence> {
        let mut records = self.records.lock().unwrap();
        if let Some((seen, _)) = records.get(record)
            && *seen > fence
        {
            return Err(StaleFence {
                offered: fence,
                seen: *seen,
            });
        }
        records.insert(record.to_owned(), (fence, value.to_owned()));
        Ok(())
    }

    /// The value of `record`.
    pub(crate) fn read(&self, record: &str) -> Option<String> {
        self.records
            .lock()
            .unwrap()
            .get(record)
            .map(|(_, v)| v.clone())
    }
}

/// Three workers want the same invoice; they take turns, in arrival order, each writing
/// under its lease's fence.
pub(crate) async fn take_turns(engine: &LockEngine, store: &FencedStore) -> Result<(), LockError> {
    let mut workers = Vec::new();
    for worker in 0..3 {
        let (engine, store) = (engine.clone(), store.clone());
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
            store
                .write("invoice:42", lease.fence(), &format!("worker {worker}"))
                .expect("the current holder's fence is the newest");
            lease.release().await
        }));
    }
    for w in workers {
        w.await.expect("worker panicked")?;
    }
    Ok(())
}

/// A holder stalls past its lease (a GC pause, a stuck disk): the key expires, a second
/// holder takes it and writes, and the stalled holder's late write is refused by the
/// storage, because its fence is older.
pub(crate) async fn stale_holder_is_refused(
    engine: &LockEngine,
    store: &FencedStore,
) -> Result<StaleFence, LockError> {
    let ttl = Duration::from_millis(100);
    let stalled = engine
        .lock("invoice:7")
        .ttl(ttl)
        .auto_renew(false) // nothing renews it while it stalls
        .acquire()
        .await?;
    // The stall: the lease runs out while its holder is not looking.
    tokio::time::sleep(ttl * 2).await;

    let next = engine.lock("invoice:7").acquire().await?;
    store
        .write("invoice:7", next.fence(), "paid")
        .expect("the newest holder writes");
    let refused = store
        .write("invoice:7", stalled.fence(), "void")
        .expect_err("the stalled holder's fence is older");
    // Its release is reported, not applied: the key is not its own any more.
    match stalled.release().await {
        Err(e) => println!("stalled holder's late release: {e}"),
        Ok(()) => println!("stalled holder's late release applied (unexpected)"),
    }
    next.release().await?;
    Ok(refused)
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let engine = common::engine_from_env().await;
    let store = FencedStore::default();

    take_turns(&engine, &store).await?;
    println!("invoice:42 last written by {:?}", store.read("invoice:42"));

    let refused = stale_holder_is_refused(&engine, &store).await?;
    println!("stalled holder's write refused: {refused}");
    println!("invoice:7 = {:?}", store.read("invoice:7"));

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
