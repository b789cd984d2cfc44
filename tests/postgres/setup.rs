//! Setting the backend up: the schema check at build time, names that are refused, the
//! application's own pool, and released keys that leave no row beyond the tombstone margin.

use std::time::Duration;

use tokio::time::Instant;
use tower_lock::engine::{
    Backend, BackendErrorKind, LockEngine, LockError,
    postgres::{
        PostgresBackend, TOMBSTONE_MARGIN,
        sqlx::{self, Executor, Row, postgres::PgPoolOptions},
    },
};
use tower_lock_test_support::postgres::PostgresServer;

use crate::harness::{backend, unique_schema};

async fn url() -> String {
    tokio::task::spawn_blocking(|| PostgresServer::shared().url())
        .await
        .unwrap()
}

async fn psql(sql: String) {
    tokio::task::spawn_blocking(move || PostgresServer::shared().psql(&sql))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_refuses_a_missing_or_older_schema_and_names_the_fix() {
    let schema = unique_schema("unmigrated");
    let builder = PostgresBackend::builder(url().await).schema(&schema);
    let missing = builder.clone().build().await.unwrap_err();
    assert_eq!(missing.kind(), BackendErrorKind::Config, "{missing}");
    assert!(missing.to_string().contains("migrate()"), "{missing}");

    builder.migrate().await.unwrap();
    drop(
        builder
            .clone()
            .build()
            .await
            .expect("a migrated schema is accepted"),
    );

    psql(format!(
        "UPDATE \"{schema}\".schema_version SET version = 0"
    ))
    .await;
    let older = builder.clone().build().await.unwrap_err();
    assert_eq!(older.kind(), BackendErrorKind::Config, "{older}");
    assert!(
        older.to_string().contains("older") && older.to_string().contains("migrate()"),
        "{older}"
    );
    // Migrating again brings it up to date.
    builder.migrate().await.unwrap();
    drop(
        builder
            .build()
            .await
            .expect("a migrated schema is accepted"),
    );
}

/// A version 1 schema (no shared leases; `holder` without its `kind`) under a held lease:
/// `build()` refuses it naming `migrate()`, which brings it up in place, the lease kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_upgrades_a_version_1_schema_in_place() {
    let backend = backend(url().await, None, "v1").await;
    let s = backend.schema().to_owned();
    let builder = PostgresBackend::builder(url().await).schema(&s);
    let engine = LockEngine::new(backend);
    let held = engine
        .lock("k")
        .auto_renew(false)
        .ttl(Duration::from_secs(60));
    let held = held.try_acquire().await.unwrap();
    // What version 1 had of what later versions changed.
    psql(format!(
        r#"DROP TABLE "{s}".shared_leases;
        ALTER TABLE "{s}".locks DROP COLUMN shared_until, DROP COLUMN released;
        ALTER TABLE "{s}".tickets DROP COLUMN lim, DROP COLUMN nonce;
        DROP FUNCTION "{s}".holder;
        CREATE FUNCTION "{s}".holder(k text, OUT token text, OUT ms bigint)
          RETURNS SETOF record LANGUAGE sql AS $fn$
          SELECT l.token, "{s}".ms(l.expires_at, clock_timestamp()) FROM "{s}".locks l
            WHERE l.key = k AND l.token IS NOT NULL AND l.expires_at > clock_timestamp() $fn$;
        UPDATE "{s}".schema_version SET version = 1"#
    ))
    .await;
    let older = builder.clone().build().await.unwrap_err();
    assert_eq!(older.kind(), BackendErrorKind::Config, "{older}");
    assert!(
        older.to_string().contains("older") && older.to_string().contains("migrate()"),
        "{older}"
    );
    builder.migrate().await.expect("migrate a version 1 schema");
    let upgraded = builder.build().await.expect("the upgraded schema");
    let holders = upgraded.holders(held.key()).await.unwrap();
    assert_eq!(holders.len(), 1, "the lease outlived the upgrade");
    assert_eq!(&holders[0].token, held.token());
    let shared = LockEngine::new(upgraded.clone()).lock("k").shared(2);
    assert!(
        matches!(shared.try_acquire().await, Err(LockError::Busy { .. })),
        "shared leases now, excluded by the lock"
    );
    held.release().await.unwrap();
}

/// A version 2 schema (no `queued` flag on a lock's row) with a ticket queued behind a
/// holder (a waiter of a node that is not refreshing it now): `migrate()` marks the key
/// queued, so the holder's release still hands the key to the ticket in its statement (its
/// token the holder, the releaser's fence + 1) rather than freeing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_upgrades_a_version_2_schema_with_waiters_in_place() {
    let backend = backend(url().await, None, "v2").await;
    let s = backend.schema().to_owned();
    let builder = PostgresBackend::builder(url().await).schema(&s);
    let engine = LockEngine::new(backend.clone());
    let holder = engine
        .lock("k")
        .ttl(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    // What version 2 lacked of what version 3 added, and a waiter's ticket.
    psql(format!(
        r#"ALTER TABLE "{s}".locks DROP COLUMN queued;
        INSERT INTO "{s}".tickets (key, id, token, deadline, ttl_ms, claim_ms)
          VALUES ('k', 'w', 'waiter', clock_timestamp() + interval '60 s', 1000, 1000);
        UPDATE "{s}".schema_version SET version = 2"#
    ))
    .await;
    let older = builder.clone().build().await.unwrap_err();
    assert!(older.to_string().contains("migrate()"), "{older}");
    builder.migrate().await.expect("migrate a version 2 schema");
    drop(builder.build().await.expect("the upgraded schema"));
    let fence = holder.fence().get();
    holder.release().await.unwrap();
    let row = backend
        .pool()
        .fetch_one(sqlx::raw_sql(&format!(
            r#"SELECT token, fence FROM "{s}".locks WHERE key = 'k'"#
        )))
        .await
        .unwrap();
    assert_eq!(
        row.get::<String, _>(0),
        "waiter",
        "handed over by the release"
    );
    assert_eq!(row.get::<i64, _>(1), i64::try_from(fence + 1).unwrap());
}

/// A version 3 schema (a key's lock and its shared leases in two spaces, each with its
/// queue and fences) with two shared leases held, the shared leases' fence row above
/// theirs, and a writer (limit 1) queued in the shared leases' own queue: `build()`
/// refuses it naming `migrate()`, which upgrades it in place. The leases are still held
/// and now keep the lock out; the writer is in the key's one queue and is granted by the
/// readers' last release, with a fence above the old fence row; a node of version 3 still
/// running calls the functions as it did (the lock's added arguments have defaults; the
/// shared leases' functions call the one space's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_upgrades_a_version_3_schema_with_shared_leases_in_place() {
    let backend = backend(url().await, None, "v3").await;
    let s = backend.schema().to_owned();
    let builder = PostgresBackend::builder(url().await).schema(&s);
    let engine = LockEngine::new(backend.clone());
    let readers = engine
        .lock("k")
        .shared(3)
        .auto_renew(false)
        .ttl(Duration::from_secs(60));
    let (r1, r2) = (
        readers.try_acquire().await.unwrap(),
        readers.try_acquire().await.unwrap(),
    );
    let old_fence = r2.fence().get() + 1000;
    // What version 3 had in place of what version 4 changed, and what it held.
    psql(format!(
        r#"ALTER TABLE "{s}".locks DROP COLUMN shared_until, DROP COLUMN released;
        ALTER TABLE "{s}".tickets DROP COLUMN lim, DROP COLUMN nonce;
        CREATE TABLE "{s}".shared_fences (key text PRIMARY KEY, fence bigint NOT NULL);
        CREATE TABLE "{s}".shared_tickets (key text NOT NULL, id text NOT NULL,
          seq bigint GENERATED ALWAYS AS IDENTITY, token text NOT NULL,
          deadline timestamptz NOT NULL, ttl_ms bigint NOT NULL, claim_ms bigint NOT NULL,
          lim bigint NOT NULL, PRIMARY KEY (key, id));
        CREATE FUNCTION "{s}".shared_pump() RETURNS void LANGUAGE sql AS 'SELECT';
        INSERT INTO "{s}".shared_fences VALUES ('k', {old_fence});
        INSERT INTO "{s}".shared_tickets (key, id, token, deadline, ttl_ms, claim_ms, lim)
          VALUES ('k', 'w', 'writer', clock_timestamp() + interval '60 s', 60000, 60000, 1);
        UPDATE "{s}".schema_version SET version = 3;
        DO $do$ DECLARE o name := (SELECT tableowner FROM pg_tables
                                     WHERE schemaname = '{s}' AND tablename = 'locks');
        BEGIN
          EXECUTE format('ALTER TABLE "{s}".shared_fences OWNER TO %I', o);
          EXECUTE format('ALTER TABLE "{s}".shared_tickets OWNER TO %I', o);
          EXECUTE format('ALTER FUNCTION "{s}".shared_pump OWNER TO %I', o);
        END $do$"#
    ))
    .await;
    let older = builder.clone().build().await.unwrap_err();
    assert!(older.to_string().contains("migrate()"), "{older}");
    builder.migrate().await.expect("migrate a version 3 schema");
    let upgraded = builder.build().await.expect("the upgraded schema");
    let key = r1.key().clone();
    assert_eq!(upgraded.holders(&key).await.unwrap().len(), 2, "still held");
    let new_node = LockEngine::new(upgraded.clone());
    assert!(
        matches!(
            new_node.lock("k").try_acquire().await,
            Err(LockError::Busy { .. })
        ),
        "the shared leases keep the lock out"
    );
    assert_eq!(new_node.lock("k").waiters().await.unwrap(), 1, "one queue");
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    let holders = upgraded.holders(&key).await.unwrap();
    assert_eq!(holders.len(), 1, "the writer, granted by the release");
    assert_eq!(holders[0].token.as_str(), "writer");
    assert!(holders[0].mode.is_alone());
    let fence = backend
        .pool()
        .fetch_one(sqlx::raw_sql(&format!(
            r#"SELECT fence FROM "{s}".shared_leases WHERE token = 'writer'"#
        )))
        .await
        .unwrap()
        .get::<i64, _>(0);
    assert_eq!(
        fence,
        i64::try_from(old_fence).unwrap() + 1,
        "above the old fence row"
    );
    // A version 3 node's calls: the lock's acquire and release with their old arguments.
    let old = backend
        .pool()
        .fetch_one(sqlx::raw_sql(&format!(
            r#"SELECT status FROM "{s}".acquire('k2', 'old', 60000, '', 1000, -1)"#
        )))
        .await
        .unwrap()
        .get::<i32, _>(0);
    assert_eq!(old, 1, "a version 3 node's acquire");
    let old = backend
        .pool()
        .fetch_one(sqlx::raw_sql(&format!(
            r#"SELECT "{s}".release('k2', 'old')"#
        )))
        .await
        .unwrap()
        .get::<i32, _>(0);
    assert_eq!(old, 1, "a version 3 node's release");
    // And its shared leases', in the same space: one excludes the lock.
    let call = |sql: String| {
        let pool = backend.pool().clone();
        async move {
            let row = pool.fetch_one(sqlx::raw_sql(&sql)).await.unwrap();
            row.get::<i32, _>(0)
        }
    };
    let acquire =
        format!(r#"SELECT status FROM "{s}".shared_acquire('k2', 'olds', 60000, '', 1000, -1, 2)"#);
    assert_eq!(call(acquire).await, 1, "a version 3 node's shared lease");
    assert!(
        matches!(
            new_node.lock("k2").try_acquire().await,
            Err(LockError::Busy { .. })
        ),
        "excludes the lock"
    );
    let release = format!(r#"SELECT "{s}".shared_release('k2', 'olds')"#);
    assert_eq!(call(release).await, 1, "a version 3 node's shared release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemas_and_prefixes_that_are_not_plain_identifiers_are_refused() {
    let url = url().await;
    for (schema, prefix) in [("Public", ""), ("s", "x;drop"), ("a\"b", ""), ("", "")] {
        let builder = PostgresBackend::builder(url.clone())
            .schema(schema)
            .table_prefix(prefix);
        let e = builder.migrate().await.unwrap_err();
        assert_eq!(
            e.kind(),
            BackendErrorKind::Config,
            "{schema:?} {prefix:?}: {e}"
        );
        let e = builder.build().await.unwrap_err();
        assert_eq!(
            e.kind(),
            BackendErrorKind::Config,
            "{schema:?} {prefix:?}: {e}"
        );
    }
}

/// The application's pool serves the calls, and (no listen URL given) one of its
/// connections listens: a waiter is handed the key its holder releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_applications_own_pool_serves_the_backend() {
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect(&url().await)
        .await
        .unwrap();
    let builder = PostgresBackend::from_pool(pool.clone()).schema(unique_schema("own_pool"));
    builder.migrate().await.unwrap();
    let engine = LockEngine::new(builder.build().await.unwrap());
    let holder = engine.lock("k").acquire().await.unwrap();
    let waiter = {
        let lock = engine.lock("k").wait(Duration::from_secs(10));
        tokio::spawn(async move { lock.acquire().await })
    };
    let give_up = Instant::now() + Duration::from_secs(10);
    while engine.lock("k").waiters().await.unwrap() != 1 {
        assert!(Instant::now() < give_up, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let first = holder.fence();
    holder.release().await.unwrap();
    let next = waiter.await.unwrap().expect("the waiter is handed the key");
    assert!(next.fence() > first);
    next.release().await.unwrap();
}

/// A released key's row is its fence tombstone, swept within the margin and one sweep
/// period; the next grant's fence still exceeds the last one, in either mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_key_leaves_no_row_once_its_tombstone_is_swept() {
    let backend = backend(url().await, None, "sweep").await;
    let count = |table: &str| {
        format!(
            "SELECT count(*)::bigint FROM \"{}\".{table}",
            backend.schema()
        )
    };
    let (locks, shared) = (count("locks"), count("shared_leases"));
    let rows = |backend: PostgresBackend, sql: String| async move {
        let row = backend.pool().fetch_one(sqlx::raw_sql(&sql)).await.unwrap();
        row.get::<i64, _>(0)
    };
    let engine = LockEngine::new(backend.clone());
    let lease = engine.lock("k").try_acquire().await.unwrap();
    lease.release().await.unwrap();
    let permit = engine.lock("k").shared(3).try_acquire().await.unwrap();
    let fence = permit.fence();
    permit.release().await.unwrap();
    let released = Instant::now();
    assert_eq!(
        rows(backend.clone(), locks.clone()).await,
        1,
        "the tombstone"
    );
    assert_eq!(rows(backend.clone(), shared).await, 0, "no shared lease");
    // The sweeper runs every 5 s and takes rows past the margin: at most 10 s in all.
    let bound = TOMBSTONE_MARGIN * 2 + Duration::from_secs(5);
    while rows(backend.clone(), locks.clone()).await != 0 {
        assert!(
            released.elapsed() < bound,
            "the tombstone outlived {bound:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let again = engine.lock("k").shared(3).try_acquire().await.unwrap();
    assert!(again.fence() > fence, "fences rise past a swept tombstone");
    again.release().await.unwrap();
    let again = engine.lock("k").try_acquire().await.unwrap();
    assert!(again.fence() > fence, "in both modes");
    again.release().await.unwrap();
}

/// A `migrate()` of a schema that is up to date takes no table lock that conflicts with a
/// call in flight: with a transaction holding `ROW EXCLUSIVE` on each of the backend's
/// tables (what every call's writes take), it ends at once (it waited for the transaction:
/// `ADD COLUMN IF NOT EXISTS` and `CREATE INDEX IF NOT EXISTS` lock before they check).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrating_an_up_to_date_schema_waits_for_no_call_in_flight() {
    let schema = unique_schema("live_migrate");
    let builder = PostgresBackend::builder(url().await).schema(&schema);
    builder.migrate().await.unwrap();
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&url().await)
        .await
        .unwrap();
    let mut holder = pool.begin().await.unwrap();
    for table in ["locks", "tickets", "shared_leases"] {
        (&mut *holder)
            .execute(format!("LOCK TABLE \"{schema}\".\"{table}\" IN ROW EXCLUSIVE MODE").as_str())
            .await
            .unwrap();
    }
    for _ in 0..3 {
        tokio::time::timeout(Duration::from_secs(3), builder.migrate())
            .await
            .expect("migrate() waited for the transaction in flight")
            .unwrap();
    }
    holder.rollback().await.unwrap();
    drop(
        builder
            .build()
            .await
            .expect("a migrated schema is accepted"),
    );
}

/// On a database nobody migrated, `LockEngine::postgres(url)` and `build()` name the exact
/// call that installs the schema, with the builder's own schema and table prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_database_names_the_exact_call_that_installs_the_schema() {
    let fresh = tokio::task::spawn_blocking(|| {
        PostgresServer::shared().database(&unique_schema("fresh"), &[])
    })
    .await
    .unwrap();
    let Err(missing) = LockEngine::postgres(fresh.clone()).await else {
        panic!("an engine was built on a database without the tables");
    };
    assert_eq!(missing.kind(), BackendErrorKind::Config, "{missing}");
    assert!(
        missing
            .to_string()
            .contains("`PostgresBackend::builder(url).migrate().await?`"),
        "{missing}"
    );
    let missing = PostgresBackend::builder(fresh.clone())
        .schema("app_locks")
        .table_prefix("svc_")
        .build()
        .await
        .unwrap_err();
    assert!(
        missing.to_string().contains(
            "`PostgresBackend::builder(url).schema(\"app_locks\").table_prefix(\"svc_\")\
             .migrate().await?`"
        ),
        "{missing}"
    );
    // The call it names is the fix.
    PostgresBackend::builder(fresh.clone())
        .migrate()
        .await
        .unwrap();
    LockEngine::postgres(fresh).await.unwrap();
}

/// An engine with the default pool opens at most 4 connections to the database however
/// many calls it has in flight (its pool's 3 and its listener's), so 20 engines fit
/// Postgres's default `max_connections` of 100 with room to spare.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_opens_at_most_four_connections_by_default() {
    let name = unique_schema("conns");
    let fresh = {
        let name = name.clone();
        tokio::task::spawn_blocking(move || PostgresServer::shared().database(&name, &[]))
            .await
            .unwrap()
    };
    PostgresBackend::builder(fresh.clone())
        .migrate()
        .await
        .unwrap();
    let engine = LockEngine::postgres(fresh).await.unwrap();
    let count = format!("SELECT count(*) FROM pg_stat_activity WHERE datname = '{name}'");
    let most = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let watch = {
        let (count, most) = (count.clone(), most.clone());
        tokio::task::spawn_blocking(move || {
            for _ in 0..20 {
                let n: usize = PostgresServer::shared().psql(&count).parse().unwrap();
                most.fetch_max(n, std::sync::atomic::Ordering::Relaxed);
            }
        })
    };
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..50 {
        let engine = engine.clone();
        calls.spawn(async move {
            for _ in 0..10 {
                let lease = engine
                    .lock(format!("c{i}"))
                    .wait(Duration::from_secs(10))
                    .acquire()
                    .await
                    .unwrap();
                lease.release().await.unwrap();
            }
        });
    }
    calls.join_all().await;
    watch.await.unwrap();
    let after: usize = tokio::task::spawn_blocking(move || PostgresServer::shared().psql(&count))
        .await
        .unwrap()
        .parse()
        .unwrap();
    let most = most.load(std::sync::atomic::Ordering::Relaxed).max(after);
    assert!(most >= 2, "the pool and the listener were seen: {most}");
    assert!(most <= 4, "{most} connections for one engine");
}
