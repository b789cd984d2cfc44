//! `KeyMutex`: released on every exit path, with typed "held" / "not held" errors.

use tokio::time::sleep;

use super::{Harness, assert_no_residue};
use crate::MutexError;

pub async fn key_mutex_releases_on_every_exit_path(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let m = engine.mutex("guarded");
    // Normal return.
    assert_eq!(m.run(|| async { 7 }).await.unwrap(), 7);
    assert!(!engine.lock("guarded").locked().await.unwrap());
    // An error returned by the closure is just its output: the key is released.
    let r: Result<(), &str> = m.run(|| async { Err("boom") }).await.unwrap();
    assert!(r.is_err());
    assert!(!engine.lock("guarded").locked().await.unwrap());
    // Panic inside the closure.
    let panicked = {
        let engine = engine.clone();
        tokio::spawn(async move {
            engine
                .mutex("guarded")
                .run(|| async { panic!("handler bug") })
                .await
        })
    };
    assert!(panicked.await.unwrap_err().is_panic());
    let after_panic = engine
        .lock("guarded")
        .ttl(u * 100)
        .wait(u * 5)
        .acquire()
        .await;
    after_panic
        .expect("released after a panic")
        .release()
        .await
        .unwrap();
    // Cancellation while the closure runs.
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let cancelled = {
        let engine = engine.clone();
        tokio::spawn(async move {
            engine
                .mutex("guarded")
                .run(|| async move {
                    started_tx.send(()).unwrap();
                    std::future::pending::<()>().await
                })
                .await
        })
    };
    started_rx.await.unwrap();
    assert!(engine.lock("guarded").locked().await.unwrap());
    cancelled.abort();
    assert!(cancelled.await.unwrap_err().is_cancelled());
    let after_cancel = engine.lock("guarded").wait(u * 5).acquire().await;
    after_cancel
        .expect("released after cancellation")
        .release()
        .await
        .unwrap();
    assert_no_residue(h).await;
}

pub async fn key_mutex_reports_held_not_held_and_expiry(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let m = engine.mutex("manual");
    assert!(matches!(m.release().await, Err(MutexError::NotHeld)));
    m.acquire().await.unwrap();
    assert!(m.is_held());
    assert!(matches!(m.acquire().await, Err(MutexError::AlreadyHeld)));
    assert!(matches!(
        m.run(|| async {}).await,
        Err(MutexError::AlreadyHeld)
    ));
    m.release().await.unwrap();
    assert!(!m.is_held());
    assert!(matches!(m.release().await, Err(MutexError::NotHeld)));
    // The lease runs out while the closure works: the caller is told.
    let short = engine
        .mutex("manual")
        .with_lock(engine.lock("manual").ttl(u * 2).auto_renew(false));
    let out = short.run(|| sleep(u * 4)).await;
    assert!(
        matches!(out, Err(MutexError::ExpiredBeforeRelease)),
        "{out:?}"
    );
    assert_no_residue(h).await;
}
