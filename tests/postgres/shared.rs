//! Shared leases on Postgres beyond the conformance suite: a release grants every waiter
//! that now fits in its own statement, and notifies only the waiters it granted.

use std::time::Duration;

use tokio::time::Instant;
use tower_lock::engine::{
    Backend, LockEngine, LockKey,
    postgres::sqlx::{self, Executor, postgres::PgListener},
};
use tower_lock_test_support::postgres::PostgresServer;

use crate::harness::backend;

/// Wait until `key` has `n` waiters.
async fn queued(engine: &LockEngine, key: &str, n: usize) {
    let give_up = Instant::now() + Duration::from_secs(10);
    while engine.lock(key).waiters().await.unwrap() != n {
        assert!(Instant::now() < give_up, "{n} waiters never queued");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The next notification's payload on `listener`.
async fn heard(listener: &mut PgListener) -> String {
    tokio::time::timeout(Duration::from_secs(10), listener.recv())
        .await
        .expect("a notification within 10 s")
        .unwrap()
        .payload()
        .to_owned()
}

/// A writer (limit 1) holds; three readers (limit 3) and a second writer wait, in that
/// order. The writer's release makes the three readers holders before it returns (the
/// backend lists them at once) and sends three notifications; the readers' first two
/// releases send none (nobody they free fits: the next writer needs the key alone); the
/// last one grants the second writer and sends one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_grants_every_waiter_that_fits_in_its_statement_and_notifies_only_grants() {
    let url = tokio::task::spawn_blocking(|| PostgresServer::shared().url())
        .await
        .unwrap();
    let backend = backend(url.clone(), None, "pshared").await;
    // The grants of this node's waiters are notified on its channel alone.
    let channel = backend.wake_channel().to_owned();
    let mut listener = PgListener::connect(&url).await.unwrap();
    listener.listen(&channel).await.unwrap();
    let engine = LockEngine::new(backend.clone());
    let key = LockKey::new("k").unwrap();
    let lock = engine.lock("k").ttl(Duration::from_secs(30));
    let writer = lock.clone().shared(1).try_acquire().await.unwrap();
    let mut readers = Vec::new();
    for i in 0..3 {
        let reader = lock.clone().shared(3).wait(Duration::from_secs(30));
        readers.push(tokio::spawn(async move { reader.acquire().await }));
        queued(&engine, "k", i + 1).await;
    }
    let next_writer = {
        let writer = lock.clone().shared(1).wait(Duration::from_secs(30));
        tokio::spawn(async move { writer.acquire().await })
    };
    queued(&engine, "k", 4).await;

    let fence = writer.fence();
    writer.release().await.unwrap();
    let holders = backend.holders(&key).await.unwrap();
    assert_eq!(
        holders.len(),
        3,
        "granted by the release itself: {holders:?}"
    );
    assert!(
        holders
            .iter()
            .all(|h| h.mode.is_shared() && !h.mode.is_alone())
    );
    assert_eq!(
        engine.lock("k").waiters().await.unwrap(),
        1,
        "the writer waits"
    );
    let mut tickets = Vec::new();
    for _ in 0..3 {
        tickets.push(
            heard(&mut listener)
                .await
                .split(' ')
                .next()
                .unwrap()
                .to_owned(),
        );
    }
    tickets.sort();
    tickets.dedup();
    assert_eq!(tickets.len(), 3, "one notification per reader granted");
    let mut leases = Vec::new();
    for reader in readers {
        let lease = reader.await.unwrap().expect("granted by the release");
        assert!(lease.fence() > fence, "fences rise");
        leases.push(lease);
    }

    let last = leases.pop().unwrap();
    for lease in leases {
        lease.release().await.unwrap();
    }
    // Notifications arrive in commit order: a marker sent after those two releases is the
    // next one heard only if they sent none.
    let pool = backend.pool();
    pool.execute(sqlx::raw_sql(&format!("NOTIFY \"{channel}\", 'marker'")))
        .await
        .unwrap();
    assert_eq!(
        heard(&mut listener).await,
        "marker",
        "a release that grants nobody"
    );
    last.release().await.unwrap();
    let granted = heard(&mut listener).await;
    let next = next_writer
        .await
        .unwrap()
        .expect("the writer after the readers");
    assert_eq!(
        granted.split(' ').nth(1),
        Some(next.fence().get().to_string().as_str()),
        "the grant's notification: {granted}"
    );
    next.release().await.unwrap();
}
