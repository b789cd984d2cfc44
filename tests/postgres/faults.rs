//! Faults short of a crash, each on a cluster of the test's own: the backend's connections
//! killed under it (`pg_terminate_backend`), its listener killed, and the whole server
//! frozen (SIGSTOP).

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::time::{Instant, timeout};
use tower_lock::engine::{BackendErrorKind, LockEngine, LockError, postgres::PostgresBackend};
use tower_lock_test_support::postgres::PostgresServer;

use crate::harness::residue;

/// A cluster of the test's own and an engine on it (pool of `pool_size`).
async fn own(pool_size: u32) -> (Arc<PostgresServer>, LockEngine) {
    let server = Arc::new(
        tokio::task::spawn_blocking(PostgresServer::start)
            .await
            .unwrap(),
    );
    let builder = PostgresBackend::builder(server.url())
        .schema("faults")
        .pool_size(pool_size);
    builder.migrate().await.unwrap();
    (server, LockEngine::new(builder.build().await.unwrap()))
}

async fn psql(server: &Arc<PostgresServer>, sql: &'static str) -> String {
    let server = server.clone();
    tokio::task::spawn_blocking(move || server.psql(sql))
        .await
        .unwrap()
}

/// Every pooled connection killed while idle: the calls whose repetition changes nothing
/// (acquire attempts, reads) meet the dead ones, are sent again on a fresh connection, and
/// none of them fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_pool_connections_fail_no_call_that_can_be_repeated() {
    let pool_size = 4;
    let (server, engine) = own(pool_size).await;
    let holder = engine.lock("k").acquire().await.unwrap();
    // Open every connection of the pool: calls at once.
    let lock = engine.lock("k");
    let reads = (0..pool_size * 2).map(|_| lock.holder());
    for read in futures_util::future::join_all(reads).await {
        read.unwrap();
    }
    let killed = psql(
        &server,
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE usename = 'tower_lock' AND query NOT LIKE 'LISTEN%'",
    )
    .await;
    assert_ne!(killed, "0", "no connection was killed");
    for i in 0..pool_size * 2 {
        let seen = lock
            .holder()
            .await
            .unwrap_or_else(|e| panic!("read {i}: {e}"));
        assert_eq!(seen.map(|h| h.token), Some(holder.token().clone()));
        assert_eq!(lock.waiters().await.unwrap(), 0);
        let other = engine
            .lock(format!("other-{i}"))
            .try_acquire()
            .await
            .unwrap_or_else(|e| panic!("acquire {i}: {e}"));
        // Released in the background when dropped (or left to its TTL on this throwaway
        // cluster).
        drop(other);
    }
    assert!(holder.owned().await.unwrap(), "the holder keeps its key");
}

/// The listener's connection killed while it listens (a waiter queues): the waiter is
/// still granted on its holder's release (by the fallback timer, or by a listener already
/// back), long before the holder's lease would have run out, and the listener connects
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_listener_delays_a_hand_off_by_no_more_than_the_fallback() {
    let (server, engine) = own(4).await;
    let holder = engine
        .lock("k")
        .ttl(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    let waiter = {
        let lock = engine.lock("k").wait(Duration::from_secs(30));
        tokio::spawn(async move { lock.acquire().await })
    };
    let give_up = Instant::now() + Duration::from_secs(10);
    while engine.lock("k").waiters().await.unwrap() != 1 {
        assert!(Instant::now() < give_up, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // The node listens from its first queued waiter on.
    let listening = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN%'";
    while psql(&server, listening).await != "1" {
        assert!(Instant::now() < give_up, "the node never listened");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let killed = psql(
        &server,
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE query LIKE 'LISTEN%'",
    )
    .await;
    assert_eq!(killed, "1", "the listener's connection");
    holder.release().await.unwrap();
    let next = waiter.await.unwrap().expect("the waiter is granted");
    assert!(
        next.waited() < Duration::from_secs(10),
        "waited {:?} for a key released at once",
        next.waited()
    );
    next.release().await.unwrap();
    // Its connection, whatever it last ran: the set-up (the session's idle timeout off,
    // the server's start time read), a `LISTEN` or an `UNLISTEN`.
    let connected = "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() \
         AND (query LIKE '%LISTEN%' OR query LIKE '%idle_session_timeout%' \
         OR query LIKE '%pg_postmaster_start_time%')";
    let give_up = Instant::now() + Duration::from_secs(10);
    while psql(&server, connected).await != "1" {
        assert!(
            Instant::now() < give_up,
            "the listener never connected again"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What a frozen server may answer: a call timed out or could not be served, or a wait
/// that ended.
fn documented(e: &LockError) -> bool {
    match e {
        LockError::Backend(b) => matches!(
            b.kind(),
            BackendErrorKind::Unavailable | BackendErrorKind::Timeout
        ),
        LockError::TimedOut { .. } => true,
        _ => false,
    }
}

/// The whole server frozen (postmaster and backends SIGSTOPped) under a holder that renews
/// itself and a waiter: every call fails with a documented error within its bound, the
/// holder is told its lease is lost once it could not renew it past its TTL, and after the
/// server resumes nobody was granted the key while the holder's lease was reported valid,
/// fences rose, and nothing is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_server_fails_calls_in_bound_and_makes_no_second_holder() {
    let server = Arc::new(
        tokio::task::spawn_blocking(PostgresServer::start)
            .await
            .unwrap(),
    );
    let call_timeout = Duration::from_millis(300);
    let builder = PostgresBackend::builder(server.url())
        .schema("frozen")
        .command_timeout(call_timeout);
    builder.migrate().await.unwrap();
    let backend = builder.build().await.unwrap();
    let engine = LockEngine::new(backend.clone());
    let ttl = Duration::from_secs(1);
    let holder = engine.lock("k").ttl(ttl).acquire().await.unwrap();
    let first_fence = holder.fence();
    let holder_end: Arc<Mutex<Option<Instant>>> = Arc::default();
    {
        let (lost, end) = (holder.lost(), holder_end.clone());
        tokio::spawn(async move {
            lost.await;
            end.lock().unwrap().get_or_insert_with(Instant::now);
        });
    }
    let waiter = {
        let lock = engine.lock("k").ttl(ttl).wait(Duration::from_secs(20));
        tokio::spawn(async move {
            let result = lock.acquire().await;
            (result, Instant::now())
        })
    };
    let give_up = Instant::now() + Duration::from_secs(10);
    while engine.lock("k").waiters().await.unwrap() != 1 {
        assert!(Instant::now() < give_up, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }

    let frozen = server.clone();
    tokio::task::spawn_blocking(move || frozen.pause())
        .await
        .unwrap();
    let asked = Instant::now();
    let err = engine.lock("other").try_acquire().await.unwrap_err();
    assert!(documented(&err), "{err:?}");
    let err = engine.lock("k").holder().await.unwrap_err();
    assert!(documented(&err), "{err:?}");
    assert!(
        asked.elapsed() < call_timeout * 4,
        "two calls took {:?}",
        asked.elapsed()
    );
    // The watchdog cannot renew: the lease is reported lost by its deadline (the last one a
    // renewal confirmed; the slack is a loaded machine's timer lag), not later (the engine
    // may say so earlier, when no renewal can land in time).
    timeout(ttl * 2, holder.lost())
        .await
        .expect("the holder is told it lost its lease");
    let lost_at = Instant::now();
    let deadline = holder.valid_until();
    assert!(
        lost_at <= deadline + Duration::from_millis(250),
        "lost {:?} after its deadline",
        lost_at - deadline
    );
    // The fault lasts a TTL past the loss (the database's expiry is at most a round trip
    // later than the holder's deadline).
    tokio::time::sleep(ttl).await;
    let thawed = server.clone();
    tokio::task::spawn_blocking(move || thawed.resume())
        .await
        .unwrap();

    let released = holder.release().await;
    match &released {
        Ok(()) => panic!("a lease lost to a frozen server was still held"),
        Err(e) => assert!(
            documented(e) || matches!(e, LockError::Expired | LockError::NotOwned),
            "{e:?}"
        ),
    }
    let (result, granted_at) = timeout(Duration::from_secs(30), waiter)
        .await
        .expect("the waiter ends")
        .unwrap();
    // What this run saw (`--nocapture`): the runs differ by where the freeze caught the
    // waiter.
    println!(
        "frozen server: lost {:?} before its deadline; holder's release {:?}; waiter {:?}",
        holder_end
            .lock()
            .unwrap()
            .map(|end| deadline.saturating_duration_since(end)),
        released.err(),
        result
            .as_ref()
            .map(|l| l.fence())
            .map_err(ToString::to_string),
    );
    let mut last = first_fence;
    match result {
        Ok(lease) => {
            let end = holder_end.lock().unwrap().expect("the holder was told");
            assert!(
                granted_at >= end,
                "the waiter was granted while the holder's lease was still reported valid"
            );
            assert!(lease.fence() > last, "fences rise");
            last = lease.fence();
            lease.release().await.unwrap();
        }
        Err(e) => assert!(documented(&e), "{e:?}"),
    }
    let again = engine
        .lock("k")
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("the key is free again after the freeze");
    assert!(again.fence() > last, "fences rise");
    again.release().await.unwrap();
    // Calls that waited out the freeze land, and clean-ups run: nothing is left.
    let give_up = Instant::now() + Duration::from_secs(15);
    loop {
        let left = residue(&backend).await;
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < give_up, "left after the freeze: {left:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
