//! Each sentence of `docs/transactional.md`'s "Behind PgBouncer", through a PgBouncer in
//! transaction mode: what the pooler must be told (`ignore_startup_parameters`), and what a
//! handler's own queries need inside the lent transaction and outside any, through two
//! server connections that other clients keep busy (so consecutive transactions of one
//! client, and the two halves of an extended-protocol statement sent outside a
//! transaction, reach different server connections). The other sentences' tests:
//! `server_login_retry` and `Retry-After` after a database restart, [`super::restarts`];
//! the lock engine's direct `listen_url`,
//! `fence::through_pgbouncer_a_paused_holders_writes_are_refused_after_a_newer_holder_wrote`;
//! every statement of the layer and the sweep, `busy_pooler`.

use std::{str::FromStr, time::Duration};

use axum::{
    Extension, Router,
    http::{HeaderMap, StatusCode},
    routing,
};
use tower_lock::sqlx::{
    self, Executor, Row,
    postgres::{PgConnectOptions, PgPoolOptions},
};
use tower_lock_axum::Tx;
use tower_lock_test_support::{
    http::serve,
    postgres::{BusyClients, PgBouncer, PostgresServer},
};

use crate::app::{Db, pool};

/// Without `extra_float_digits` ignored, PgBouncer refuses sqlx's connections (sqlx sends
/// it at start-up); with it (and nothing else), they work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbouncer_needs_ignore_startup_parameters_extra_float_digits_for_sqlx() {
    let (refusing, accepting) = tokio::task::spawn_blocking(|| {
        let server = PostgresServer::shared();
        (
            PgBouncer::configured(server, &[("ignore_startup_parameters", "")]),
            PgBouncer::configured(
                server,
                &[("ignore_startup_parameters", "extra_float_digits")],
            ),
        )
    })
    .await
    .unwrap();
    let refused = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&refusing.url())
        .await
        .expect_err("PgBouncer refuses extra_float_digits");
    assert!(
        refused
            .to_string()
            .contains("unsupported startup parameter: extra_float_digits"),
        "{refused}"
    );
    let accepted = pool(&accepting.url()).await;
    accepted.execute(sqlx::raw_sql("SELECT 1")).await.unwrap();
}

/// Inserts a payment noted with the body through the lent transaction, as a named prepared
/// statement (sqlx's default), or an unnamed one (`.persistent(false)`) when the request
/// says `x-unnamed`; a failure is answered `503` with its text.
async fn pay(
    Extension(schema): Extension<String>,
    headers: HeaderMap,
    mut tx: Tx,
    body: String,
) -> (StatusCode, String) {
    let inserted = sqlx::query(&format!("INSERT INTO {schema}.payments (note) VALUES ($1)"))
        .persistent(!headers.contains_key("x-unnamed"))
        .bind(body)
        .execute(&mut *tx)
        .await;
    match inserted {
        Ok(_) => (StatusCode::CREATED, "paid".to_owned()),
        Err(error) => (StatusCode::SERVICE_UNAVAILABLE, error.to_string()),
    }
}

/// Through a busy PgBouncer of two server connections: inside `Tx`, named prepared
/// statements (sqlx's default) fail (a later transaction lands on a server connection that
/// never prepared them, or one where another client prepared that name), unnamed ones
/// (`.persistent(false)`) work; outside a transaction, a bound statement fails (`unnamed prepared
/// statement does not exist`), while `raw_sql` and the same bound statement in an explicit
/// transaction work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handlers_own_queries_inside_and_outside_the_transaction_behind_a_busy_pgbouncer() {
    let (bouncer, _busy) = tokio::task::spawn_blocking(|| {
        let bouncer = PgBouncer::with_pool_size(PostgresServer::shared(), 2);
        let busy = BusyClients::start(&bouncer.url(), 4, Duration::from_millis(2));
        (bouncer, busy)
    })
    .await
    .unwrap();
    let db = Db::new(&bouncer.url(), "pgb_queries").await;
    // One connection: the statements it prepares are on the server connections it met,
    // and only there.
    let one = Db {
        schema: db.schema.clone(),
        pool: PgPoolOptions::new()
            .max_connections(1)
            .connect(&bouncer.url())
            .await
            .unwrap(),
    };
    let layer = one.layer(|b| b).await;
    let app = serve(
        Router::new()
            .route("/payments", routing::post(pay))
            .layer(layer)
            .layer(Extension(db.schema.clone())),
    )
    .await;
    for i in 0..20 {
        let key = format!("unnamed{i}");
        let headers = [("idempotency-key", key.as_str()), ("x-unnamed", "1")];
        let reply = app.send_body("POST", "/payments", &headers, "card").await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text());
    }
    // After the unnamed ones: sqlx would reuse a statement it cached for the same text.
    let mut failed = None;
    for i in 0..100 {
        let key = format!("named{i}");
        let reply = app
            .send_body("POST", "/payments", &[("idempotency-key", &key)], "card")
            .await;
        if reply.status != StatusCode::CREATED {
            failed = Some(reply.text());
            break;
        }
    }
    let failed = failed.expect("a named prepared statement fails in some transaction");
    assert!(failed.contains("prepared statement"), "{failed}");

    // Outside any transaction.
    let bound = || sqlx::query("SELECT $1::int").persistent(false).bind(7);
    let mut split = None;
    for _ in 0..100 {
        if let Err(error) = bound().fetch_one(&db.pool).await {
            split = Some(error.to_string());
            break;
        }
    }
    let split = split.expect("a bound statement outside a transaction fails under load");
    assert!(
        split.contains("unnamed prepared statement does not exist"),
        "{split}"
    );
    for _ in 0..20 {
        let simple: i32 = sqlx::raw_sql("SELECT 7")
            .fetch_one(&db.pool)
            .await
            .expect("raw_sql outside a transaction")
            .get(0);
        assert_eq!(simple, 7);
        let mut tx = db.pool.begin().await.unwrap();
        let row = bound()
            .fetch_one(&mut *tx)
            .await
            .expect("a bound statement in an explicit transaction");
        tx.commit().await.unwrap();
        assert_eq!(row.get::<i32, _>(0), 7);
    }
}

/// `statement_cache_capacity(0)` does not make sqlx's statements unnamed (sqlx 0.8): each
/// bound query is still prepared under a new name, and left on the server connection,
/// where behind a transaction pooler another client connection's same name meets it
/// (`prepared statement "sqlx_s_1" already exists`). Seen directly, on one connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_cache_capacity_zero_still_prepares_named_statements() {
    let url = crate::app::shared_url().await;
    let options = PgConnectOptions::from_str(&url)
        .unwrap()
        .statement_cache_capacity(0);
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    for _ in 0..2 {
        sqlx::query("SELECT $1::int")
            .bind(7)
            .fetch_one(&mut *conn)
            .await
            .unwrap();
    }
    let named: i64 = (&mut *conn)
        .fetch_one(sqlx::raw_sql(
            "SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'sqlx_s_%'",
        ))
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        named, 2,
        "each query left a named statement on the connection"
    );
}
