//! Hand-offs that wake only the node waiting: a release notifies the channel of the granted
//! waiter's node alone, and a node listens only while one of its waiters queues.

use std::time::Duration;

use tokio::time::Instant;
use tower_lock::engine::{
    LockEngine,
    postgres::{
        PostgresBackend,
        sqlx::{self, Executor, Row, postgres::PgListener},
    },
};
use tower_lock_test_support::postgres::PostgresServer;

use crate::harness::unique_schema;

/// `n` backends (nodes) on one fresh schema.
async fn nodes(url: &str, n: usize) -> Vec<PostgresBackend> {
    let builder = PostgresBackend::builder(url)
        .schema(unique_schema("wake"))
        .pool_size(2);
    builder.migrate().await.unwrap();
    let mut nodes = Vec::new();
    for _ in 0..n {
        nodes.push(builder.clone().build().await.unwrap());
    }
    nodes
}

/// Until `key` has `n` waiters.
async fn queued(engine: &LockEngine, key: &str, n: usize) {
    let give_up = Instant::now() + Duration::from_secs(10);
    while engine.lock(key).waiters().await.unwrap() != n {
        assert!(Instant::now() < give_up, "{n} waiters never queued");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Whether a node listens on its `channel` now: its listener's last statement the `LISTEN`
/// of it and of the base channel (where revocations come; the listener runs nothing else
/// while it listens, and the test's spy listens on no base channel).
async fn listens(pool: &sqlx::PgPool, channel: &str) -> bool {
    let base = channel.rsplit_once('_').expect("<base>_<node>").0;
    let sql = format!(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE query = 'LISTEN \"{channel}\";LISTEN \"{base}\";' AND state = 'idle'"
    );
    let row = pool.fetch_one(sqlx::raw_sql(&sql)).await.unwrap();
    row.get::<i64, _>(0) > 0
}

/// Four nodes: A holds key `k`, B waits for it, C waits for another key `other` (held by
/// A too), D has no waiter. A raw connection listens on every node's channel. A's release
/// of `k` hands it to B: exactly one notification, on B's channel; none on C's or D's (and
/// D never listened at all). Then C's grant reaches C alone. Several rounds, the nodes'
/// roles kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hand_off_notifies_only_the_node_waiting_for_it() {
    let url = tokio::task::spawn_blocking(|| PostgresServer::shared().url())
        .await
        .unwrap();
    let nodes = nodes(&url, 4).await;
    let engines: Vec<LockEngine> = nodes.iter().cloned().map(LockEngine::new).collect();
    let (a, b, c) = (&engines[0], &engines[1], &engines[2]);
    let mut spy = PgListener::connect(&url).await.unwrap();
    // One statement for all (so the spy's last statement is no node's `LISTEN`).
    spy.listen_all(nodes.iter().map(PostgresBackend::wake_channel))
        .await
        .unwrap();
    let channels: std::collections::HashSet<&str> =
        nodes.iter().map(PostgresBackend::wake_channel).collect();
    assert_eq!(channels.len(), 4, "a channel per node: {channels:?}");
    let ttl = Duration::from_secs(30);
    let other = a.lock("other").ttl(ttl).try_acquire().await.unwrap();
    let c_waits = {
        let lock = c.lock("other").ttl(ttl).wait(Duration::from_secs(30));
        tokio::spawn(async move { lock.acquire().await })
    };
    queued(a, "other", 1).await;
    for round in 0..5 {
        let held = a.lock("k").ttl(ttl).try_acquire().await.unwrap();
        let b_waits = {
            let lock = b.lock("k").ttl(ttl).wait(Duration::from_secs(30));
            tokio::spawn(async move { lock.acquire().await })
        };
        queued(a, "k", 1).await;
        held.release().await.unwrap();
        let lease = b_waits.await.unwrap().expect("granted by the release");
        let heard = tokio::time::timeout(Duration::from_secs(10), spy.recv())
            .await
            .expect("the grant's notification")
            .unwrap();
        assert_eq!(
            heard.channel(),
            nodes[1].wake_channel(),
            "round {round}: the grant went to B's channel: {}",
            heard.payload()
        );
        lease.release().await.unwrap();
        // Nothing else was notified: a marker sent now is the next thing heard.
        let marker = nodes[0].pool();
        marker
            .execute(sqlx::raw_sql(&format!(
                "NOTIFY \"{}\", 'marker'",
                nodes[3].wake_channel()
            )))
            .await
            .unwrap();
        let next = tokio::time::timeout(Duration::from_secs(10), spy.recv())
            .await
            .expect("the marker")
            .unwrap();
        assert_eq!(
            (next.channel(), next.payload()),
            (nodes[3].wake_channel(), "marker"),
            "round {round}: no other node was notified"
        );
        assert!(
            !listens(nodes[0].pool(), nodes[3].wake_channel()).await,
            "D, without waiters, does not listen"
        );
        assert!(
            listens(nodes[0].pool(), nodes[2].wake_channel()).await,
            "C, whose waiter queues, listens"
        );
    }
    other.release().await.unwrap();
    let granted = c_waits.await.unwrap().expect("C's waiter granted");
    let heard = tokio::time::timeout(Duration::from_secs(10), spy.recv())
        .await
        .expect("C's grant's notification")
        .unwrap();
    assert_eq!(heard.channel(), nodes[2].wake_channel());
    granted.release().await.unwrap();
}

/// A node whose waiters are all gone stops listening (after its linger), and listens again
/// for its next waiter, which is still granted by the release (not by its fallback timer
/// alone: within well under the 250 ms fallback, in most of a few rounds).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_listens_only_while_a_waiter_queues() {
    let url = tokio::task::spawn_blocking(|| PostgresServer::shared().url())
        .await
        .unwrap();
    let nodes = nodes(&url, 2).await;
    let (holder, waiter) = (
        LockEngine::new(nodes[0].clone()),
        LockEngine::new(nodes[1].clone()),
    );
    let channel = nodes[1].wake_channel().to_owned();
    let pool = nodes[0].pool();
    assert!(
        !listens(pool, &channel).await,
        "no waiter yet: not listening"
    );
    let ttl = Duration::from_secs(30);
    for round in 0..2 {
        let held = holder.lock("k").ttl(ttl).try_acquire().await.unwrap();
        let waits = {
            let lock = waiter.lock("k").ttl(ttl).wait(Duration::from_secs(30));
            tokio::spawn(async move { lock.acquire().await })
        };
        queued(&holder, "k", 1).await;
        let give_up = Instant::now() + Duration::from_secs(10);
        while !listens(pool, &channel).await {
            assert!(Instant::now() < give_up, "round {round}: never listened");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let released = Instant::now();
        held.release().await.unwrap();
        let lease = waits.await.unwrap().expect("granted");
        assert!(
            released.elapsed() < Duration::from_secs(2),
            "round {round}: granted"
        );
        lease.release().await.unwrap();
        // Its linger over, the node unlistens.
        let give_up = Instant::now() + Duration::from_secs(10);
        while listens(pool, &channel).await {
            assert!(Instant::now() < give_up, "round {round}: never unlistened");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
