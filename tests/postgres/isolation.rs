//! A database whose default isolation is stricter than `READ COMMITTED` (a server,
//! database or role setting; or a session's `SET SESSION CHARACTERISTICS` left on a server
//! connection that PgBouncer shares). The engine's functions re-read a row after waiting
//! for its lock, which only `READ COMMITTED` does: under `REPEATABLE READ` or
//! `SERIALIZABLE` the contended case fails with `could not serialize access`. Every call
//! runs at `READ COMMITTED`, whatever the default.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use tower_lock::engine::{LockEngine, postgres::sqlx};
use tower_lock_test_support::postgres::PostgresServer;

use crate::harness::{backend, residue};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contended_cycles_work_where_the_default_isolation_is_stricter() {
    let url = tokio::task::spawn_blocking(|| PostgresServer::shared().url())
        .await
        .unwrap();
    for (level, read) in [
        ("repeatable%5C%20read", "repeatable read"),
        ("serializable", "serializable"),
    ] {
        let url = format!("{url}?options=-c%20default_transaction_isolation%3D{level}");
        let backend = backend(url, None, "isolation").await;
        // The setting holds on the backend's own connections.
        let default: String =
            sqlx::query_scalar::<_, String>("SELECT current_setting('transaction_isolation')")
                .fetch_one(backend.pool())
                .await
                .unwrap();
        assert_eq!(default, read);
        let engine = LockEngine::new(backend.clone());
        for fifo in [false, true] {
            let inside = Arc::new(AtomicUsize::new(0));
            let mut tasks = Vec::new();
            for _ in 0..8 {
                let (engine, inside) = (engine.clone(), inside.clone());
                tasks.push(tokio::spawn(async move {
                    let lock = engine
                        .lock("contended")
                        .fifo(fifo)
                        .wait(Duration::from_secs(20));
                    for _ in 0..15 {
                        let lease = lock.acquire().await?;
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "exclusion");
                        tokio::task::yield_now().await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                        lease.release().await?;
                    }
                    Ok::<_, tower_lock::LockError>(())
                }));
            }
            for task in tasks {
                let done = task.await.unwrap();
                assert!(
                    done.is_ok(),
                    "{read}, fifo {fifo}: a contended cycle failed: {done:?}"
                );
            }
        }
        assert_eq!(residue(&backend).await, Vec::<String>::new());
    }
}
