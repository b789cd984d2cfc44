//! Names a user picks: a schema and a table prefix that are SQL reserved words work (the
//! backend quotes every name it splices); a name with capitals (or anything but `a-z`,
//! `0-9`, `_`) is refused by `migrate()` and `build()` with a configuration error that says
//! the rule, before any statement is sent (`names.rs`: Postgres folds unquoted names to
//! lower case, so `Orders` and `orders` would otherwise be two names for a user's tools).

use std::time::Duration;

use tower_lock::engine::{BackendErrorKind, LockEngine, postgres::PostgresBackend};
use tower_lock_test_support::postgres::PostgresServer;

use crate::harness::residue;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserved_words_as_schema_and_table_prefix_work_and_capitals_are_refused_by_name() {
    let url = tokio::task::spawn_blocking(|| PostgresServer::shared().url())
        .await
        .unwrap();
    for (schema, prefix) in [("select", "order"), ("user", ""), ("table", "from_")] {
        let builder = PostgresBackend::builder(url.clone())
            .schema(schema)
            .table_prefix(prefix);
        builder
            .migrate()
            .await
            .expect("migrate under reserved words");
        let backend = builder.build().await.expect("build under reserved words");
        let engine = LockEngine::new(backend.clone());
        let lock = engine.lock("k").ttl(Duration::from_secs(5));
        let held = lock.try_acquire().await.unwrap();
        let waiter = {
            let lock = lock.clone().wait(Duration::from_secs(5));
            tokio::spawn(async move { lock.acquire().await })
        };
        while engine.lock("k").waiters().await.unwrap() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        held.release().await.unwrap();
        waiter.await.unwrap().unwrap().release().await.unwrap();
        backend
            .sweep()
            .await
            .expect("the sweep under reserved words");
        assert_eq!(residue(&backend).await, Vec::<String>::new());
    }
    for (schema, prefix) in [("Orders", ""), ("orders", "Lock_")] {
        let builder = PostgresBackend::builder(url.clone())
            .schema(schema)
            .table_prefix(prefix);
        let refused = builder.migrate().await.expect_err("capitals are refused");
        assert_eq!(refused.kind(), BackendErrorKind::Config);
        assert!(refused.to_string().contains("a-z, 0-9 and _"), "{refused}");
        let refused = builder.build().await.expect_err("capitals are refused");
        assert_eq!(refused.kind(), BackendErrorKind::Config);
    }
}
