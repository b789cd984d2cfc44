//! The contention bench on Postgres: the database (`--database-url`, or a throwaway cluster
//! the bench starts with the test-support fixture and stops on exit), the engines on it in a
//! schema of the run's own, the simple-lock baseline the engine is compared with, and what
//! the run counts there (transactions per cycle, rows left behind). The advisory-lock
//! baselines run through the engine's own harness (`lockers`).
//!
//! The baseline here, on the same kind of connection as the engine (a sqlx pool of the
//! same size, the simple query protocol, values written into the statement):
//! `postgres-baseline`, the simplest correct Postgres lock. Acquire is one conditional
//! `INSERT … ON CONFLICT DO UPDATE … WHERE expired` (a row affected: ours), release one
//! `DELETE` by key and token. A refused try retries at once: no waiting, no fairness, no
//! fences, and the row of a released key is gone.
//!
//! Transactions per cycle come from `pg_stat_database` (commits and rollbacks of the
//! database) before the run and after it, once the run's connections are closed (a backend
//! reports all its statistics as it exits; an idle one may hold them back for 10 s). The
//! few statements of the warm-up count too. Each engine call is one statement in its own
//! transaction, so for the engine it is its statements per cycle; the simple baseline's
//! two statements are two transactions, the transaction-level advisory lock's three
//! (`BEGIN`, the lock, `COMMIT`) one, the session advisory lock's two (lock, unlock) two.

#[cfg(feature = "postgres")]
pub(crate) use on::*;

/// Built without the `postgres` feature: a clear error.
#[cfg(not(feature = "postgres"))]
pub(crate) async fn open(config: &crate::config::Config) -> Result<(), String> {
    let _ = (&config.database_url, config.pool);
    Err(
        "postgres backend not built (tower-lock was built without the `postgres` feature; \
         cargo bench --features postgres)"
            .into(),
    )
}

#[cfg(feature = "postgres")]
mod on {
    use std::{
        sync::{
            Arc, OnceLock,
            atomic::{AtomicU64, AtomicUsize, Ordering},
        },
        time::{Duration, Instant},
    };

    use serde_json::{Value, json};
    use tower_lock::{
        LockEngine,
        engine::postgres::{
            PostgresBackend,
            sqlx::{self, Executor, Row, postgres::PgPoolOptions},
        },
    };
    use tower_lock_test_support::postgres::PostgresServer;

    use crate::{
        config::Config,
        report::{extend, header},
        run_id,
        support::round,
        turns::hold,
    };

    /// The run's database: where it is, and the cluster the bench started, if it did.
    pub(crate) struct Database {
        url: String,
        /// The run's schema: its tables and nobody else's.
        schema: String,
        _server: Option<PostgresServer>,
    }

    static DATABASE: OnceLock<Database> = OnceLock::new();

    /// Open the run's database (start a throwaway cluster when no URL is given) and create
    /// the run's schema.
    pub(crate) async fn open(config: &Config) -> Result<(), String> {
        let (url, server) = match &config.database_url {
            Some(url) => (url.clone(), None),
            None => {
                let server = tokio::task::spawn_blocking(PostgresServer::start)
                    .await
                    .map_err(|e| format!("start a throwaway Postgres: {e}"))?;
                (server.url(), Some(server))
            }
        };
        let schema = format!("bench_{}", run_id());
        PostgresBackend::builder(&url)
            .schema(&schema)
            .migrate()
            .await
            .map_err(|e| format!("migrate the bench schema at {url}: {e}"))?;
        let database = Database {
            url,
            schema,
            _server: server,
        };
        DATABASE
            .set(database)
            .map_err(|_| "the database is opened once".to_string())
    }

    /// The run's database; [`open`] first.
    pub(crate) fn database() -> &'static Database {
        DATABASE.get().expect("postgres::open before the run")
    }

    impl Database {
        /// An engine (a node of its own: its pool of `pool` connections, its listener).
        pub(crate) async fn engine(&self, pool: u32) -> Result<LockEngine, String> {
            let backend = PostgresBackend::builder(&self.url)
                .schema(&self.schema)
                .pool_size(pool)
                .build()
                .await
                .map_err(|e| format!("cannot connect to Postgres at {}: {e}", self.url))?;
            Ok(LockEngine::new(backend))
        }

        /// A pool of `size` connections to the run's database, for an advisory baseline.
        pub(crate) async fn pool(&self, size: u32) -> Result<sqlx::PgPool, String> {
            PgPoolOptions::new()
                .max_connections(size)
                .test_before_acquire(false)
                .connect(&self.url)
                .await
                .map_err(|e| format!("cannot connect to Postgres at {}: {e}", self.url))
        }

        async fn query_one(&self, sql: &str) -> Result<i64, String> {
            let pool = PgPoolOptions::new()
                .max_connections(1)
                .connect(&self.url)
                .await
                .map_err(|e| e.to_string())?;
            let row = pool
                .fetch_one(sqlx::raw_sql(sql))
                .await
                .map_err(|e| e.to_string())?;
            pool.close().await;
            Ok(row.get::<i64, _>(0))
        }

        /// The database's committed and rolled-back transactions that its backends have
        /// reported so far (an idle backend may hold its last second's back for 10 s; an
        /// exiting one reports everything).
        pub(crate) async fn transactions(&self) -> Result<i64, String> {
            self.query_one(
                "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database \
                 WHERE datname = current_database()",
            )
            .await
        }

        /// [`transactions`](Self::transactions), once every other client connection to the
        /// database is closed (the run's engines or pool dropped): so every transaction is
        /// counted. (An autovacuum worker may be connected too; it is not waited for.)
        pub(crate) async fn transactions_once_closed(&self) -> Result<i64, String> {
            let give_up = Instant::now() + Duration::from_secs(10);
            let others = "SELECT count(*) FROM pg_stat_activity \
                          WHERE datname = current_database() AND pid <> pg_backend_pid() \
                          AND backend_type = 'client backend'";
            // A connection the pool has not closed yet (sqlx's `close` sometimes leaves one
            // behind) whose last statement was on the run's schema, or the advisory
            // baselines' `COMMIT` or unlock: the run's own, ended.
            let leftover = format!(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid() \
                 AND backend_type = 'client backend' \
                 AND (query LIKE '%{}%' OR query = 'COMMIT' \
                 OR query LIKE 'SELECT pg_advisory_unlock(%')",
                self.schema
            );
            while self.query_one(others).await? > 0 {
                if Instant::now() > give_up {
                    return Err("the run's connections did not close within 10 s".into());
                }
                self.query_one(&leftover).await?;
                // A bench's poll, not a test's synchronization: the backends exit on their own.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            self.transactions().await
        }

        /// Rows in the run's lock and ticket tables: (every lock row, live leases, tickets).
        pub(crate) async fn rows(&self) -> Result<(i64, i64, i64), String> {
            let s = &self.schema;
            let locks = self
                .query_one(&format!("SELECT count(*) FROM \"{s}\".locks"))
                .await?;
            let live = self
                .query_one(&format!(
                    "SELECT count(*) FROM \"{s}\".locks \
                     WHERE token IS NOT NULL AND expires_at > clock_timestamp()"
                ))
                .await?;
            let tickets = self
                .query_one(&format!("SELECT count(*) FROM \"{s}\".tickets"))
                .await?;
            Ok((locks, live, tickets))
        }
    }

    /// The simple-lock baseline (see the module docs), measured like the engine: cycles
    /// per second, transactions per cycle, exclusion checked on every grant.
    pub(crate) async fn baseline(config: &Config) -> Result<Value, String> {
        let db = database();
        let pool = PgPoolOptions::new()
            .max_connections(config.pool)
            .test_before_acquire(false)
            .connect(&db.url)
            .await
            .map_err(|e| e.to_string())?;
        let table = format!("\"{}\".simple_locks", db.schema);
        pool.execute(sqlx::raw_sql(&format!(
            "CREATE TABLE IF NOT EXISTS {table} \
             (key text PRIMARY KEY, token text NOT NULL, expires_at timestamptz NOT NULL)"
        )))
        .await
        .map_err(|e| e.to_string())?;
        // Open the pool's connections before the measurement, as the engine's warm-up does.
        let warm: Vec<_> = (0..config.pool.min(config.workers as u32))
            .map(|_| pool.acquire())
            .collect();
        for conn in futures_util::future::join_all(warm).await {
            drop(conn.map_err(|e| e.to_string())?);
        }
        let run_id = run_id();
        let before = db.transactions().await?;
        let violations = Arc::new(AtomicU64::new(0));
        let holders: Arc<Vec<AtomicUsize>> =
            Arc::new((0..config.keys).map(|_| AtomicUsize::new(0)).collect());
        let began = Instant::now();
        let mut tasks = Vec::new();
        for worker in 0..config.workers {
            let (pool, holders, violations) = (pool.clone(), holders.clone(), violations.clone());
            let (config, table) = (config.clone(), table.clone());
            // Keys are the bench's own (no quote can occur): written into the statement, as
            // the engine writes its values.
            let key = format!("baseline:{run_id}:{}", worker % config.keys);
            tasks.push(tokio::spawn(async move {
                let ttl_ms = config.ttl.as_millis() as u64;
                let e = |e: sqlx::Error| e.to_string();
                let slot = &holders[worker % config.keys];
                for _ in 0..config.iterations {
                    let token = format!("{:032x}", rand::random::<u128>());
                    let acquire = format!(
                        "INSERT INTO {table} AS l (key, token, expires_at) \
                         VALUES ('{key}', '{token}', clock_timestamp() + interval '{ttl_ms} ms') \
                         ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token, \
                         expires_at = EXCLUDED.expires_at WHERE l.expires_at < clock_timestamp()"
                    );
                    while pool
                        .execute(sqlx::raw_sql(&acquire))
                        .await
                        .map_err(e)?
                        .rows_affected()
                        == 0
                    {
                        tokio::task::yield_now().await;
                    }
                    if slot.swap(worker + 1, Ordering::SeqCst) != 0 {
                        violations.fetch_add(1, Ordering::Relaxed);
                    }
                    hold(config.hold, config.hold_mode).await;
                    slot.store(0, Ordering::SeqCst);
                    pool.execute(sqlx::raw_sql(&format!(
                        "DELETE FROM {table} WHERE key = '{key}' AND token = '{token}'"
                    )))
                    .await
                    .map_err(e)?;
                }
                Ok::<_, String>(())
            }));
        }
        for task in tasks {
            task.await.map_err(|e| format!("worker panicked: {e}"))??;
        }
        let wall = began.elapsed();
        let cycles = config.workers * config.iterations;
        pool.close().await;
        let transactions = db.transactions_once_closed().await? - before;
        let mut report = header(config, "contention");
        extend(
            &mut report,
            json!({
                "cycles": cycles,
                "errors": 0,
                "wall_s": round(wall.as_secs_f64(), 4),
                "cycles_per_s": round(cycles as f64 / wall.as_secs_f64(), 1),
                "mutual_exclusion_violations": violations.load(Ordering::Relaxed),
                "postgres_transactions_per_cycle":
                    round(transactions as f64 / cycles.max(1) as f64, 2),
            }),
        );
        Ok(report)
    }
}
