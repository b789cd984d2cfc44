//! A pooler restarted under load: a PgBouncer in transaction mode in front of the shared
//! cluster stopped (safe shutdown, `SIGINT`, as a service manager restarts it) and started
//! again on the same port while a holder holds a key, another node waits for it, and other
//! clients keep the pooler busy. The holder's release after the restart frees the key for
//! the waiter (its pooled connection was cut: the release goes out again on a fresh one
//! when nothing of it could have run), nothing hangs, and the key is never held past its
//! lease. A database crash and restart under a holder and a waiter is `restart`.

use std::time::Duration;

use tower_lock::engine::LockEngine;
use tower_lock_test_support::postgres::{BusyClients, PgBouncer, PostgresServer};

use crate::harness::backend;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_a_pooler_restart_frees_the_key_for_a_waiting_node() {
    let (bouncer, busy, direct) = tokio::task::spawn_blocking(|| {
        let bouncer = PgBouncer::start(PostgresServer::shared());
        let busy = BusyClients::start(&bouncer.url(), 4, Duration::from_millis(2));
        (bouncer, busy, PostgresServer::shared().url())
    })
    .await
    .unwrap();
    let holder_backend = backend(bouncer.url(), Some(direct.clone()), "m_pooler_restart").await;
    let schema = holder_backend.schema().to_owned();
    let holder = LockEngine::new(holder_backend);
    let waiter = LockEngine::new(
        tower_lock::engine::postgres::PostgresBackend::builder(direct)
            .schema(schema)
            .build()
            .await
            .unwrap(),
    );
    let lease = holder
        .lock("k")
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await
        .unwrap();
    let waiting = tokio::spawn(async move {
        waiter
            .lock("k")
            .wait(Duration::from_secs(20))
            .acquire()
            .await
    });
    let bouncer = tokio::task::spawn_blocking(move || {
        bouncer.restart("-INT");
        bouncer
    })
    .await
    .unwrap();
    let released = lease.release().await;
    let granted = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .map(|joined| joined.unwrap());
    drop((busy, bouncer));
    released.expect("the release after the pooler's restart");
    granted
        .expect("the waiter is granted at the release, not after the 30 s lease")
        .expect("granted")
        .release()
        .await
        .unwrap();
}
