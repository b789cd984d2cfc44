//! A call on a pooled connection that died while idle: the server ended the session
//! (`idle_session_timeout`, `pg_terminate_backend`) before the statement was sent, so the
//! statement never ran and is sent again on a fresh connection. A release among them: the
//! key is free at once for another engine, not held for its lease's TTL.

use std::{sync::OnceLock, time::Duration};

use tower_lock::engine::{LockEngine, postgres::PostgresBackend};
use tower_lock_test_support::postgres::PostgresServer;

use crate::harness::unique_schema;

/// A database of the shared cluster whose sessions end after 1 s idle.
async fn idle_timeout_url() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    tokio::task::spawn_blocking(|| {
        URL.get_or_init(|| {
            PostgresServer::shared().database("idle_session", &[("idle_session_timeout", "1s")])
        })
        .clone()
    })
    .await
    .unwrap()
}

async fn psql(sql: String) -> String {
    tokio::task::spawn_blocking(move || PostgresServer::shared().psql(&sql))
        .await
        .unwrap()
}

/// A holder engine whose pool's sessions are named `app` (its listener's another name),
/// and another engine, both on `url`'s database, in one fresh schema.
async fn engines(url: &str, app: &str) -> (LockEngine, LockEngine) {
    let schema = unique_schema("dead_idle");
    let holder = PostgresBackend::builder(format!("{url}?application_name={app}"))
        .listen_url(format!("{url}?application_name={app}_listener"))
        .schema(&schema);
    holder.migrate().await.unwrap();
    let holder = holder.build().await.unwrap();
    let other = PostgresBackend::builder(url)
        .schema(&schema)
        .build()
        .await
        .unwrap();
    (LockEngine::new(holder), LockEngine::new(other))
}

/// Until the server has no session named `app` left (the pool's were all ended).
async fn until_sessions_gone(app: &str) {
    let sql = format!("SELECT count(*) FROM pg_stat_activity WHERE application_name = '{app}'");
    while psql(sql.clone()).await != "0" {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The holder's release frees `key` at once: another engine takes it without waiting.
async fn released_at_once(holder: tower_lock::engine::Lease, other: &LockEngine, key: &str) {
    holder
        .release()
        .await
        .expect("a release whose connection died while idle is sent again");
    other
        .lock(key)
        .try_acquire()
        .await
        .expect("the key is free at once, not held for its 30 s TTL")
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_the_idle_session_timeout_ended_the_pools_sessions_frees_the_key_at_once() {
    let url = idle_timeout_url().await;
    let (holder, other) = engines(&url, "idle_holder").await;
    let lease = holder
        .lock("k")
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await
        .unwrap();
    // The holder idles past the timeout: the server ends its pool's sessions.
    until_sessions_gone("idle_holder").await;
    released_at_once(lease, &other, "k").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_the_pools_backends_were_terminated_frees_the_key_at_once() {
    let url = tokio::task::spawn_blocking(|| PostgresServer::shared().url())
        .await
        .unwrap();
    let (holder, other) = engines(&url, "terminated_holder").await;
    let lease = holder
        .lock("k")
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await
        .unwrap();
    psql(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE application_name = 'terminated_holder'"
            .into(),
    )
    .await;
    until_sessions_gone("terminated_holder").await;
    released_at_once(lease, &other, "k").await;
}
