//! Least privilege: `migrate()` run by the schema's owner, the application connecting as a
//! role with only the rights the engine's README lists (`USAGE` on the schema; `SELECT`,
//! `INSERT`, `UPDATE`, `DELETE` on its tables; `EXECUTE` on its functions, which `PUBLIC`
//! has unless revoked; nothing to create, no ownership). The cases between them call every
//! function of the schema: acquire, a waiter's leave, release and hand-off, extend, renew,
//! holders, waiters, the shared space, admin, numeric, pools, records, and the sweep.

use std::{sync::OnceLock, time::Duration};

use tower_lock::engine::postgres::{
    PostgresBackend,
    sqlx::{self, Executor},
};
use tower_lock_test_support::{
    conformance::BackendHarness,
    conformance_tests,
    postgres::{PostgresServer, TEST_USER},
};

use crate::harness::{residue, unique_schema};

/// The application's role.
const APP: &str = "lock_app";

/// The rights the engine's README lists, on `schema`, for [`APP`].
fn grants(schema: &str) -> String {
    format!(
        "GRANT USAGE ON SCHEMA \"{schema}\" TO {APP};
         GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA \"{schema}\" TO {APP};
         REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA \"{schema}\" FROM PUBLIC;
         GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA \"{schema}\" TO {APP};"
    )
}

/// The owner's and the application's URLs (the role made on first use, with no rights).
async fn urls() -> (String, String) {
    static APP_URL: OnceLock<(String, String)> = OnceLock::new();
    tokio::task::spawn_blocking(|| {
        APP_URL
            .get_or_init(|| {
                let server = PostgresServer::shared();
                server.psql(&format!("CREATE ROLE {APP} LOGIN"));
                let owner = server.url();
                let app = owner.replacen(&format!("//{TEST_USER}@"), &format!("//{APP}@"), 1);
                (owner, app)
            })
            .clone()
    })
    .await
    .unwrap()
}

/// A fresh schema migrated by its owner, and a backend on it as [`APP`].
async fn app_backend(name: &str) -> PostgresBackend {
    let (owner, app) = urls().await;
    let schema = unique_schema(name);
    let by_owner = PostgresBackend::builder(owner).schema(&schema);
    by_owner.migrate().await.expect("migrate as the owner");
    let owner = sqlx::PgPool::connect_lazy(&by_owner_url().await).unwrap();
    owner
        .execute(sqlx::raw_sql(&grants(&schema)))
        .await
        .unwrap();
    owner.close().await;
    PostgresBackend::builder(app)
        .schema(&schema)
        .build()
        .await
        .expect("build as the application's role")
}

async fn by_owner_url() -> String {
    urls().await.0
}

async fn harness() -> BackendHarness<PostgresBackend> {
    let backend = app_backend("m_least").await;
    BackendHarness::new(backend, Duration::from_millis(200), |b| {
        Box::pin(residue(b))
    })
}

conformance_tests!(@in_mode [tokio::test(flavor = "multi_thread", worker_threads = 2)]
    harness(), tower_lock::engine::Mode::Exclusive;
    fifo_grants_in_arrival_order_with_zero_overtakes,
    timed_out_waiters_leave_no_residue,
    extend_adds_or_replaces_and_reacquire_resets,
    watchdog_keeps_lease_past_its_ttl,
    locked_and_owned_report_state,
    max_waiters_is_enforced,
);

conformance_tests!(@cases [tokio::test(flavor = "multi_thread", worker_threads = 2)]
    harness();
    a_departed_writer_lets_the_readers_behind_it_in,
    admin_force_release_hands_the_key_to_the_next_waiter,
    numeric_values_expire_and_delete,
    pool_membership_and_health,
    a_waiter_granted_by_a_completion_finds_the_record,
    a_record_or_tombstone_is_deleted_by_key_and_the_lock_is_left_alone,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_application_role_sweeps_and_cannot_create() {
    let backend = app_backend("m_least_sweep").await;
    backend
        .sweep()
        .await
        .expect("the sweep as the application's role");
    let created = backend
        .pool()
        .execute(sqlx::raw_sql(&format!(
            "CREATE TABLE \"{}\".intruder (x int)",
            backend.schema()
        )))
        .await;
    assert!(
        created.is_err(),
        "the application's role has no CREATE on the schema"
    );
}
