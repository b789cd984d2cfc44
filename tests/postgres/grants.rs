//! Grants matched by their registration's nonce, not by a clock: a grant that names a
//! waiter's ticket with another nonce (an earlier registration's, delivered late) is
//! refused; a registration sent twice is one ticket; and a release sent again (its
//! connection lost after it ran) reports what the first did.

use std::time::Duration;

use tokio::time::Instant;
use tower_lock::engine::{
    LockEngine,
    postgres::{
        PostgresBackend,
        sqlx::{self, Executor, Row},
    },
};
use tower_lock_test_support::postgres::PostgresServer;

use crate::harness::backend;

async fn url() -> String {
    tokio::task::spawn_blocking(|| PostgresServer::shared().url())
        .await
        .unwrap()
}

/// `sql`'s first row, first column, as text.
async fn text(backend: &PostgresBackend, sql: &str) -> String {
    let row = backend.pool().fetch_one(sqlx::raw_sql(sql)).await.unwrap();
    row.try_get::<String, _>(0)
        .or_else(|_| row.try_get::<i32, _>(0).map(|n| n.to_string()))
        .unwrap()
}

/// A waiter queues behind a holder. A grant naming its ticket, with a fence above any and a
/// long claim, but a nonce of no current registration of it (an earlier one's, as a
/// notification delayed past a re-registration carries) is refused: the waiter is granted
/// by the holder's release, with that release's fence (the holder's + 1). Each mode, a few
/// times.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_grant_of_an_earlier_registration_is_refused() {
    let backend = backend(url().await, None, "nonce").await;
    let (schema, prefix) = (backend.schema(), backend.table_prefix());
    let engine = LockEngine::new(backend.clone());
    for round in 0..6 {
        let key = format!("k{round}");
        let limit = [0, 1, 3][round % 3];
        let lock = |l: u32| {
            let lock = engine.lock(&key).ttl(Duration::from_secs(30));
            if l == 0 { lock } else { lock.shared(l) }
        };
        let holder = engine
            .lock(&key)
            .ttl(Duration::from_secs(30))
            .try_acquire()
            .await
            .unwrap();
        let waiter = {
            let lock = lock(limit).wait(Duration::from_secs(30));
            tokio::spawn(async move { lock.acquire().await })
        };
        let give_up = Instant::now() + Duration::from_secs(10);
        let id = loop {
            let sql =
                format!("SELECT id FROM \"{schema}\".\"{prefix}tickets\" WHERE key = '{key}'");
            let rows = backend.pool().fetch_all(sqlx::raw_sql(&sql)).await.unwrap();
            if let Some(row) = rows.first() {
                break row.get::<String, _>(0);
            }
            assert!(Instant::now() < give_up, "the waiter never queued");
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        // Heard before the release's grant: one listener connection, commit order.
        let stale = format!("{id} 9000000000000000 60000 0123456789abcdef");
        text(
            &backend,
            &format!(
                "SELECT pg_notify('{}', '{stale}')::text",
                backend.wake_channel()
            ),
        )
        .await;
        let fence = holder.fence();
        holder.release().await.unwrap();
        let lease = waiter.await.unwrap().expect("granted by the release");
        assert_eq!(
            lease.fence().get(),
            fence.get() + 1,
            "round {round} (limit {limit}): the release's grant, not the stale one"
        );
        lease.release().await.unwrap();
    }
}

/// A release that ran, sent again with the same id (what `resend` does after the
/// connection was lost), answers "released" in each mode; another release of the same
/// token (another id) finds the lease gone, as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_sent_again_reports_released() {
    let backend = backend(url().await, None, "resent").await;
    let engine = LockEngine::new(backend.clone());
    let release = format!(
        "\"{}\".\"{}release\"",
        backend.schema(),
        backend.table_prefix()
    );
    for (limit, lock) in [
        (0, engine.lock("k")),
        (3, engine.lock("k").shared(3)),
        (1, engine.lock("k").shared(1)),
    ] {
        let lease = lock.auto_renew(false).try_acquire().await.unwrap();
        // Release ids are random per call: each lease's its own here too.
        let call = |id: &str| {
            format!(
                "SELECT {release}('k', '{}', {limit}, '{id}{limit}')::text",
                lease.token().as_str()
            )
        };
        assert_eq!(text(&backend, &call("r1")).await, "1", "released");
        assert_eq!(
            text(&backend, &call("r1")).await,
            "1",
            "sent again: released"
        );
        assert_eq!(
            text(&backend, &call("r2")).await,
            "-2",
            "another release: gone"
        );
        drop(lease.release().await);
    }
}

/// A registration sent twice (the same ticket, the same nonce: a call sent again after its
/// connection was lost) is one ticket; a refresh with a later nonce is still that ticket,
/// and the grant at the holder's release names the later nonce. (Its id has no `<node>:`,
/// as a version 4 node's: the grant goes to the base channel.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_sent_twice_is_one_ticket() {
    let backend = backend(url().await, None, "twice").await;
    let (schema, prefix) = (backend.schema(), backend.table_prefix());
    let engine = LockEngine::new(backend.clone());
    let holder = engine.lock("k").try_acquire().await.unwrap();
    let register = |nonce: &str| {
        format!(
            "SELECT status::text FROM \"{schema}\".\"{prefix}acquire\"\
             ('k', 'waiter', 60000, 'w', 60000, -1, 0, '{nonce}')"
        )
    };
    for nonce in ["n1", "n1", "n2"] {
        assert_eq!(text(&backend, &register(nonce)).await, "0", "queued");
        assert_eq!(engine.lock("k").waiters().await.unwrap(), 1, "one ticket");
    }
    let mut listener = sqlx::postgres::PgListener::connect(&url().await)
        .await
        .unwrap();
    listener
        .listen(&format!("{schema}.{prefix}wake"))
        .await
        .unwrap();
    holder.release().await.unwrap();
    let grant = tokio::time::timeout(Duration::from_secs(10), listener.recv())
        .await
        .expect("the grant's notification")
        .unwrap();
    let grant: Vec<&str> = grant.payload().split(' ').collect();
    assert_eq!((grant[0], grant[3]), ("w", "n2"), "{grant:?}");
}
