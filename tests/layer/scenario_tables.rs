//! The scenarios' lock tables keep apart: two tables made with one name (one scenario
//! instantiated twice in a test binary, under two frameworks or two macro calls, and run at
//! once) share no key on the binary's shared server, so neither one's locks exclude the
//! other's requests and neither one's residue check sees the other's live keys.

use tower_lock_test_support::scenarios::{Backend, Framework, LockTable, Stack};

/// The name both tables are made with.
const NAME: &str = "one-name";

/// A key `a` holds is free in `b`, and `b`'s residue check passes meanwhile; then `a`'s
/// passes once it lets the key go.
async fn assert_apart(a: &LockTable, b: &LockTable) {
    let held = a.engine().lock("k").acquire().await.unwrap();
    b.assert_no_residue(&[]).await;
    let other = b
        .engine()
        .lock("k")
        .try_acquire()
        .await
        .expect("a key held in one table is free in the other");
    other.release().await.unwrap();
    b.assert_no_residue(&["k".to_owned()]).await;
    held.release().await.unwrap();
    a.assert_no_residue(&["k".to_owned()]).await;
}

/// Two tables made with one name on `backend` keep apart, whether made by the backend
/// itself or by two stacks that differ only in their framework (the case of a scenario run
/// under the tower layer and under the actix middleware at once).
async fn tables_made_with_one_name_keep_apart(backend: Backend) {
    let (a, b) = (backend.table(NAME).await, backend.table(NAME).await);
    assert_apart(&a, &b).await;
    let tower = Stack::new(Framework::Tower, backend).table(NAME).await;
    let actix = Stack::new(Framework::Actix, backend).table(NAME).await;
    assert_apart(&tower, &actix).await;
    assert_apart(&actix, &tower).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tables_made_with_one_name_never_share_keys_in_process() {
    tables_made_with_one_name_keep_apart(Backend::InProcess).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tables_made_with_one_name_never_share_keys_on_redis() {
    tables_made_with_one_name_keep_apart(Backend::Redis).await;
}

#[cfg(feature = "redis-cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tables_made_with_one_name_never_share_keys_on_a_redis_cluster() {
    tables_made_with_one_name_keep_apart(Backend::RedisCluster).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tables_made_with_one_name_never_share_keys_on_postgres() {
    tables_made_with_one_name_keep_apart(Backend::Postgres).await;
}
