//! A database crash (`kill -9` of every server process) or restart under leases granted with
//! asynchronous commit: fences handed out after it exceed every fence handed out before,
//! whatever the crash lost.

use std::time::Duration;

use tokio::time::{Instant, timeout};
use tower_lock::engine::{
    Lease, LockEngine,
    postgres::{PostgresBackend, sqlx::postgres::PgListener},
};
use tower_lock_test_support::postgres::PostgresServer;

use crate::harness::unique_schema;

/// A cluster of the test's own (it crashes it), and a migrated schema there.
async fn cluster(name: &str) -> (std::sync::Arc<PostgresServer>, String, String) {
    let server = std::sync::Arc::new(
        tokio::task::spawn_blocking(PostgresServer::start)
            .await
            .unwrap(),
    );
    let schema = unique_schema(name);
    PostgresBackend::builder(server.url())
        .schema(&schema)
        .migrate()
        .await
        .unwrap();
    let url = server.url();
    (server, url, schema)
}

async fn engine(url: &str, schema: &str, call_timeout: Duration) -> LockEngine {
    LockEngine::new(
        PostgresBackend::builder(url)
            .schema(schema)
            .command_timeout(call_timeout)
            .build()
            .await
            .unwrap(),
    )
}

async fn blocking(server: &std::sync::Arc<PostgresServer>, f: fn(&PostgresServer)) {
    let server = server.clone();
    tokio::task::spawn_blocking(move || f(&server))
        .await
        .unwrap();
}

/// Keys handed from a holder to a waiter (the hand-off's fence is the one a crash can take
/// back with the commit that made it), and keys taken and given back on the fast path, in a
/// burst right before every server process is killed. After the restart every key is
/// acquired again, and every hand-off the database notifies meanwhile (a waiter's ticket
/// the crash kept, granted again) is watched: each fence is above every fence handed out
/// before the crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_keep_rising_through_a_kill_9_crash() {
    const HANDED: usize = 24;
    const FAST: usize = 24;
    let (server, url, schema) = cluster("crash").await;
    let holder_node = engine(&url, &schema, Duration::from_millis(500)).await;
    // A long call timeout: its waiters' tickets (3 × it) outlive the restart, so the
    // database may grant one again after it.
    let waiter_node = engine(&url, &schema, Duration::from_secs(5)).await;
    let ttl = Duration::from_secs(1);

    let mut before: Vec<u64> = Vec::new();
    let mut holders: Vec<Lease> = Vec::new();
    let mut waiting = Vec::new();
    for i in 0..HANDED {
        let lease = holder_node
            .lock(format!("h{i}"))
            .ttl(ttl)
            .acquire()
            .await
            .unwrap();
        before.push(lease.fence().get());
        holders.push(lease);
        let lock = waiter_node
            .lock(format!("h{i}"))
            .ttl(ttl)
            .wait(Duration::from_secs(30));
        waiting.push(tokio::spawn(async move { lock.acquire().await }));
    }
    for i in 0..HANDED {
        let give_up = Instant::now() + Duration::from_secs(10);
        while holder_node.lock(format!("h{i}")).waiters().await.unwrap() != 1 {
            assert!(Instant::now() < give_up, "waiter {i} never queued");
            tokio::task::yield_now().await;
        }
    }
    // What is durable: the holders and the queued waiters.
    blocking(&server, |s| {
        s.psql("CHECKPOINT");
    })
    .await;

    // The burst: the fast path's keys are taken and given back, and every holder hands its
    // key to its waiter; then every server process is killed at once.
    for i in 0..FAST {
        let lease = holder_node
            .lock(format!("f{i}"))
            .ttl(ttl)
            .acquire()
            .await
            .unwrap();
        before.push(lease.fence().get());
        lease.release().await.unwrap();
    }
    // The hand-offs last, all at once: the crash is most likely to take them back.
    let releases: Vec<_> = holders
        .into_iter()
        .map(|holder| tokio::spawn(holder.release()))
        .collect();
    let mut handed = Vec::new();
    for waiter in waiting {
        let lease = waiter.await.unwrap().unwrap();
        before.push(lease.fence().get());
        handed.push(lease);
    }
    for release in releases {
        release.await.unwrap().unwrap();
    }
    blocking(&server, PostgresServer::crash).await;
    blocking(&server, PostgresServer::restart).await;
    let highest = *before.iter().max().unwrap();

    // Every hand-off the database notifies from now on.
    let mut listener = PgListener::connect(&url).await.unwrap();
    listener.listen(&format!("{schema}.wake")).await.unwrap();
    // The leases of before the crash end (their release may find another holder now).
    for lease in handed {
        let _ = lease.release().await;
    }
    // A call timeout of seconds: every key is asked for at once on a loaded machine.
    let after_node = engine(&url, &schema, Duration::from_secs(5)).await;
    // Every key at once (a key the crash took back waits for its old holder's TTL).
    let acquired: Vec<_> = (0..HANDED)
        .map(|i| format!("h{i}"))
        .chain((0..FAST).map(|i| format!("f{i}")))
        .map(|key| {
            let lock = after_node
                .lock(key.clone())
                .ttl(ttl)
                .wait(Duration::from_secs(20));
            tokio::spawn(async move {
                let lease = lock
                    .acquire()
                    .await
                    .unwrap_or_else(|e| panic!("{key} after the restart: {e}"));
                let fence = lease.fence().get();
                let _ = lease.release().await;
                (key, fence)
            })
        })
        .collect();
    let mut after = Vec::new();
    for acquire in acquired {
        after.push(acquire.await.unwrap());
    }
    while let Ok(Ok(Some(note))) = timeout(Duration::from_millis(50), listener.try_recv()).await {
        let fence: u64 = note.payload().split(' ').nth(1).unwrap().parse().unwrap();
        after.push((format!("a hand-off ({})", note.payload()), fence));
    }
    for (what, fence) in &after {
        assert!(
            *fence > highest,
            "{what}: fence {fence} after the crash, not above {highest} handed out before \
             (before: {before:?})"
        );
    }
}

/// A holder on one node, a waiter on another; the server restarts (`how`). The holder's
/// `lost()` fires, and the waiter is granted the key only after it fired (the restart may
/// have taken the holder's grant back with its asynchronous commit: the waiter is then
/// granted as soon as it asks again).
async fn a_restart_is_a_reset(how: fn(&PostgresServer)) {
    let (server, url, schema) = cluster("reset").await;
    let holder_node = engine(&url, &schema, Duration::from_secs(1)).await;
    let waiter_node = engine(&url, &schema, Duration::from_secs(1)).await;
    let holder = holder_node
        .lock("k")
        .ttl(Duration::from_secs(3))
        .acquire()
        .await
        .unwrap();
    let lost_at = {
        let lost = holder.lost();
        tokio::spawn(async move {
            lost.await;
            Instant::now()
        })
    };
    let waiter = {
        let lock = waiter_node
            .lock("k")
            .ttl(Duration::from_secs(3))
            .wait(Duration::from_secs(30));
        // Read the moment the grant is seen: a task that awaits `lost()` to stamp the
        // instant may run late on a loaded machine, the signal's state is exact.
        let signal = holder.lost_signal();
        tokio::spawn(async move {
            let result = lock.acquire().await;
            (result, signal.is_lost())
        })
    };
    let give_up = Instant::now() + Duration::from_secs(10);
    while waiter_node.lock("k").waiters().await.unwrap() != 1 {
        assert!(Instant::now() < give_up, "the waiter never queued");
        tokio::task::yield_now().await;
    }
    let restarted = Instant::now();
    blocking(&server, how).await;
    let lost_at = timeout(Duration::from_secs(10), lost_at)
        .await
        .expect("the holder's lost() fires at the restart")
        .unwrap();
    // (Measured from before the restart: the restart itself takes a while.)
    assert!(
        lost_at.duration_since(restarted) < Duration::from_secs(5),
        "lost() fired {:?} after the restart began",
        lost_at.duration_since(restarted)
    );
    let (granted, lost_when_granted) = timeout(Duration::from_secs(30), waiter)
        .await
        .expect("the waiter ends")
        .unwrap();
    let lease = granted.expect("the waiter is granted the key once the holder's lease is gone");
    assert!(
        lost_when_granted,
        "the waiter was granted the key while the holder's lease still read valid"
    );
    drop(holder);
    let _ = lease.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_restart_is_a_reset_before_anyone_else_is_granted_the_key() {
    a_restart_is_a_reset(PostgresServer::restart_clean).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_9_crash_is_a_reset_before_anyone_else_is_granted_the_key() {
    a_restart_is_a_reset(|server| {
        server.crash();
        server.restart();
    })
    .await;
}
