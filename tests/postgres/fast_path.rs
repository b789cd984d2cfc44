//! The one-statement fast paths (an acquire of a free key nobody queues for, a release nobody
//! waits for) against the slow paths they race with: the key's row lock and its `queued`
//! flag keep every hand-off and arrival order, and the sweeper clears a queue its waiters
//! left by dying.

use std::time::Duration;

use tokio::{task::JoinHandle, time::Instant};
use tower_lock::engine::{
    Lease, LockEngine, LockError,
    postgres::{
        PostgresBackend, TOMBSTONE_MARGIN,
        sqlx::{self, Executor, Row},
    },
};
use tower_lock_test_support::postgres::PostgresServer;

use crate::harness::{backend, until_lock_waits};

async fn url() -> String {
    tokio::task::spawn_blocking(|| PostgresServer::shared().url())
        .await
        .unwrap()
}

/// A second node on `backend`'s schema: its own pool, listener and line of calls.
async fn other_node(backend: &PostgresBackend) -> LockEngine {
    let other = PostgresBackend::builder(url().await)
        .schema(backend.schema())
        .build()
        .await
        .unwrap();
    LockEngine::new(other)
}

fn locks(backend: &PostgresBackend) -> String {
    format!(
        "\"{}\".\"{}locks\"",
        backend.schema(),
        backend.table_prefix()
    )
}

/// A node holding `k` for 20 s (not renewed), and another node's caller queued behind
/// it (the queue seen from the backend).
async fn a_holder_and_a_queued_waiter(
    name: &str,
) -> (PostgresBackend, Lease, JoinHandle<Result<Lease, LockError>>) {
    let backend = backend(url().await, None, name).await;
    let engine = LockEngine::new(backend.clone());
    let other = other_node(&backend).await;
    let holder = engine
        .lock("k")
        .auto_renew(false)
        .ttl(Duration::from_secs(20))
        .acquire()
        .await
        .unwrap();
    let waiter = {
        let lock = other.lock("k").wait(Duration::from_secs(20));
        tokio::spawn(async move { lock.acquire().await })
    };
    let give_up = Instant::now() + Duration::from_secs(10);
    while engine.lock("k").waiters().await.unwrap() != 1 {
        assert!(Instant::now() < give_up, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    (backend, holder, waiter)
}

async fn count(backend: &PostgresBackend, sql: String) -> i64 {
    let row = backend.pool().fetch_one(sqlx::raw_sql(&sql)).await.unwrap();
    row.get::<i64, _>(0)
}

/// A waiter's first attempt and the holder's release both wait for the key's row (locked by
/// another transaction), the attempt first: it registers its ticket, and the release, which
/// would free the key in one statement, sees the row queued once it has the lock and hands
/// the key over in its statement. A hand-off's fence is the releaser's + 1; a grant the
/// waiter found later by a retry would carry the clock's (microseconds), far above it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_racing_a_waiters_registration_hands_the_key_over() {
    let backend = backend(url().await, None, "fast_release").await;
    let engine = LockEngine::new(backend.clone());
    let other = other_node(&backend).await;
    for round in 0..3 {
        let key = format!("race-{round}");
        let holder = engine
            .lock(&key)
            .ttl(Duration::from_secs(20))
            .acquire()
            .await
            .unwrap();
        let fence = holder.fence().get();
        let mut blocker = backend.pool().begin().await.unwrap();
        blocker
            .execute(sqlx::raw_sql(&format!(
                "SELECT 1 FROM {} WHERE key = '{key}' FOR UPDATE",
                locks(&backend)
            )))
            .await
            .unwrap();
        let waiter = {
            let lock = other
                .lock(&key)
                .wait(Duration::from_secs(20))
                .ttl(Duration::from_secs(20));
            tokio::spawn(async move { lock.acquire().await })
        };
        until_lock_waits(&backend, 1).await;
        let released = tokio::spawn(holder.release());
        until_lock_waits(&backend, 2).await;
        blocker.commit().await.unwrap();
        released.await.unwrap().unwrap();
        let next = waiter.await.unwrap().expect("the waiter gets the key");
        assert_eq!(
            next.fence().get(),
            fence + 1,
            "round {round}: handed over by the release, not found by a retry"
        );
        next.release().await.unwrap();
    }
}

/// A key that fell free with a live ticket on it (its holder's lease ran out: nobody hands
/// it over) is the ticket's: a newcomer's try is refused, however soon it comes, and the
/// waiter gets the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_never_takes_a_free_key_from_a_live_ticket() {
    let (backend, holder, waiter) = a_holder_and_a_queued_waiter("fast_acquire").await;
    let engine = LockEngine::new(backend.clone());
    // The holder's lease runs out now.
    backend
        .pool()
        .execute(sqlx::raw_sql(&format!(
            "UPDATE {} SET expires_at = clock_timestamp() WHERE key = 'k'",
            locks(&backend)
        )))
        .await
        .unwrap();
    let newcomer = engine.lock("k").try_acquire().await;
    assert!(
        matches!(newcomer, Err(LockError::Busy { .. })),
        "the newcomer overtook the ticket: {newcomer:?}"
    );
    let next = waiter.await.unwrap().expect("the waiter gets the key");
    assert!(next.fence() > holder.fence());
    next.release().await.unwrap();
    drop(holder);
}

/// A waiter that died (its ticket lapsed, never refreshed nor removed) leaves its key's row
/// marked as queued: the sweeper deletes the ticket, clears the mark, and then the row, as
/// it would a plain tombstone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweeper_clears_a_queue_whose_waiters_died() {
    let backend = backend(url().await, None, "fast_sweep").await;
    let engine = LockEngine::new(backend.clone());
    let lease = engine.lock("k").try_acquire().await.unwrap();
    let fence = lease.fence();
    lease.release().await.unwrap();
    let (table, tickets) = (
        locks(&backend),
        format!(
            "\"{}\".\"{}tickets\"",
            backend.schema(),
            backend.table_prefix()
        ),
    );
    // What a waiter leaves when its node dies: its ticket, the row marked.
    backend
        .pool()
        .execute(sqlx::raw_sql(&format!(
            "UPDATE {table} SET queued = true WHERE key = 'k';
             INSERT INTO {tickets} (key, id, token, deadline, ttl_ms, claim_ms)
               VALUES ('k', 'dead', 'dead', clock_timestamp(), 1000, 1000)"
        )))
        .await
        .unwrap();
    let released = Instant::now();
    let bound = TOMBSTONE_MARGIN * 2 + Duration::from_secs(5);
    for sql in [
        format!("SELECT count(*)::bigint FROM {tickets}"),
        format!("SELECT count(*)::bigint FROM {table}"),
    ] {
        while count(&backend, sql.clone()).await != 0 {
            assert!(released.elapsed() < bound, "{sql}: outlived {bound:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let again = engine.lock("k").try_acquire().await.unwrap();
    assert!(again.fence() > fence, "fences rise past the swept row");
    again.release().await.unwrap();
}

/// A try on a key another holds is answered from a read: the key's row is not locked (its
/// `xmax` unchanged), so a run of refused tries (a `423` storm) writes nothing and has no
/// commit to flush.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_try_leaves_the_keys_row_untouched() {
    let backend = backend(url().await, None, "fast_try").await;
    let engine = LockEngine::new(backend.clone());
    let holder = engine.lock("k").try_acquire().await.unwrap();
    let xmax = format!("SELECT xmax::text FROM {} WHERE key = 'k'", locks(&backend));
    let read = |sql: String| {
        let backend = backend.clone();
        async move {
            let row = backend.pool().fetch_one(sqlx::raw_sql(&sql)).await.unwrap();
            row.get::<String, _>(0)
        }
    };
    let before = read(xmax.clone()).await;
    let refused = engine.lock("k").try_acquire().await;
    assert!(
        matches!(refused, Err(LockError::Busy { .. })),
        "{refused:?}"
    );
    assert_eq!(read(xmax).await, before, "the refused try locked the row");
    holder.release().await.unwrap();
}

/// A ticket whose waiter is gone (its deadline passed, and nobody left for it) at the head
/// of the queue is passed over at the next hand-off: the live waiter behind it gets the key
/// then, not after the lapsed ticket's claim would have run out, and the lapsed ticket is
/// deleted. (A hand-off drops lapsed tickets as they come to the head.) The lapsed ticket
/// is put at the head once the live one queued, right before the release: the nodes'
/// sweepers delete lapsed tickets too, at any moment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_passes_over_a_lapsed_ticket_at_the_head_of_the_queue() {
    let (backend, holder, waiter) = a_holder_and_a_queued_waiter("lapsed_head").await;
    let tickets = format!(
        "\"{}\".\"{}tickets\"",
        backend.schema(),
        backend.table_prefix()
    );
    // A waiter that vanished: first in line (a sequence number below every other), its
    // deadline a second ago, a minute's claim.
    backend
        .pool()
        .execute(sqlx::raw_sql(&format!(
            "INSERT INTO {tickets} (key, id, seq, token, deadline, ttl_ms, claim_ms) \
             OVERRIDING SYSTEM VALUE \
             VALUES ('k', 'gone:1', 0, 'gone', clock_timestamp() - interval '1 second', \
                     60000, 60000)"
        )))
        .await
        .unwrap();
    holder.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the live waiter was granted at the release, not after the lapsed claim")
        .unwrap()
        .expect("the live waiter gets the key");
    assert_eq!(
        count(
            &backend,
            format!("SELECT count(*) FROM {tickets} WHERE id = 'gone:1'")
        )
        .await,
        0,
        "the lapsed ticket is gone"
    );
    next.release().await.unwrap();
}
