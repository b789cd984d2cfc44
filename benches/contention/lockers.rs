//! What a contention run's workers lock with: the run's engines, or one of the Postgres
//! advisory-lock baselines, so that both go through the same harness (the same workers,
//! clock reads, grant logs and analysis) and their figures compare.
//!
//! The advisory baselines are what a Postgres user writes without tower-lock, on a sqlx
//! pool of `--pool` connections per engine, the simple query protocol (the key written
//! into the statement, hashed by the server with `hashtext`, as the engine writes its
//! values):
//!
//! - `postgres-advisory`: `BEGIN`, `SELECT pg_advisory_xact_lock(..)`, the critical
//!   section, `COMMIT` (three round trips, one transaction, no WAL written: the commit of a
//!   transaction with no writes flushes nothing);
//! - `postgres-advisory-session`: `SELECT pg_advisory_lock(..)` on a pooled connection,
//!   the section, `SELECT pg_advisory_unlock(..)` on the same connection (two round trips,
//!   two transactions), as sqlx's `PgAdvisoryLock` does.
//!
//! Both hold a connection for the whole wait and section, have no fences, no TTL and no
//! lost-lease signal; Postgres's lock manager queues waiters of one lock in arrival order.

use tower_lock::{Lease, LockEngine};

use crate::{config::Config, engines::engines};

/// One node's way to lock: an engine, or a pool for an advisory baseline.
#[derive(Clone)]
pub(crate) enum Locker {
    Engine(LockEngine),
    #[cfg(feature = "postgres")]
    Advisory {
        pool: tower_lock::engine::postgres::sqlx::PgPool,
        /// A session lock (`pg_advisory_lock` / `pg_advisory_unlock`) rather than a
        /// transaction's (`pg_advisory_xact_lock`, ended by the `COMMIT`).
        session: bool,
    },
}

/// A key held, until [`Held::release`].
pub(crate) enum Held {
    Lease(Lease),
    #[cfg(feature = "postgres")]
    Xact(on::Transaction),
    #[cfg(feature = "postgres")]
    Session(on::Connection, String),
}

/// The run's lockers: one per `--engines`.
pub(crate) async fn lockers(config: &Config) -> Result<Vec<Locker>, String> {
    #[cfg(feature = "postgres")]
    if let Some(session) = match config.backend.as_str() {
        "postgres-advisory" => Some(false),
        "postgres-advisory-session" => Some(true),
        _ => None,
    } {
        let mut lockers = Vec::with_capacity(config.engines);
        for _ in 0..config.engines {
            let pool = crate::postgres::database().pool(config.pool).await?;
            lockers.push(Locker::Advisory { pool, session });
        }
        return Ok(lockers);
    }
    let (engines, _memory) = engines(config).await?;
    Ok(engines.into_iter().map(Locker::Engine).collect())
}

impl Locker {
    /// Open what a run needs before it is measured (pool connections, the engine's
    /// scripts and watchdog) with one lock cycle on `key`; an advisory pool also opens as
    /// many connections as the run's workers use.
    pub(crate) async fn warm_up(&self, key: &str, config: &Config) -> Result<(), String> {
        #[cfg(feature = "postgres")]
        if let Self::Advisory { pool, .. } = self {
            let opened: Vec<_> = (0..config.pool.min(config.workers as u32))
                .map(|_| pool.acquire())
                .collect();
            for conn in futures_util::future::join_all(opened).await {
                drop(conn.map_err(|e| e.to_string())?);
            }
        }
        let held = self.acquire(key, config).await?;
        held.release().await
    }

    /// Acquire `key` (waiting for it).
    pub(crate) async fn acquire(&self, key: &str, config: &Config) -> Result<Held, String> {
        match self {
            Self::Engine(engine) => engine
                .lock(key)
                .ttl(config.ttl)
                .fifo(config.fifo)
                .acquire()
                .await
                .map(Held::Lease)
                .map_err(|e| e.to_string()),
            #[cfg(feature = "postgres")]
            Self::Advisory { pool, session } => on::acquire(pool, *session, key).await,
        }
    }

    /// Close what the locker holds open, so that the database's backends report every
    /// transaction (see `postgres::Database::transactions_once_closed`).
    pub(crate) async fn close(self) {
        match self {
            Self::Engine(engine) => drop(engine),
            #[cfg(feature = "postgres")]
            Self::Advisory { pool, .. } => pool.close().await,
        }
    }
}

impl Held {
    /// The grant's fence; `None` for the advisory locks, which have none.
    pub(crate) fn fence(&self) -> Option<u64> {
        match self {
            Self::Lease(lease) => Some(lease.fence().get()),
            #[cfg(feature = "postgres")]
            Self::Xact(_) | Self::Session(..) => None,
        }
    }

    pub(crate) async fn release(self) -> Result<(), String> {
        match self {
            Self::Lease(lease) => lease.release().await.map_err(|e| e.to_string()),
            #[cfg(feature = "postgres")]
            held => on::release(held).await,
        }
    }
}

#[cfg(feature = "postgres")]
mod on {
    use tower_lock::engine::postgres::sqlx::{
        self, Executor, PgPool, Postgres, pool::PoolConnection,
    };

    use super::Held;

    pub(crate) type Transaction = sqlx::Transaction<'static, Postgres>;
    pub(crate) type Connection = PoolConnection<Postgres>;

    /// The advisory lock's key: the server's hash of the key's text. The run's keys are
    /// the bench's own (no quote can occur).
    fn lock_id(key: &str) -> String {
        format!("hashtext('{key}')")
    }

    pub(super) async fn acquire(pool: &PgPool, session: bool, key: &str) -> Result<Held, String> {
        let e = |e: sqlx::Error| e.to_string();
        let id = lock_id(key);
        if session {
            let mut conn = pool.acquire().await.map_err(e)?;
            (&mut *conn)
                .execute(sqlx::raw_sql(&format!("SELECT pg_advisory_lock({id})")))
                .await
                .map_err(e)?;
            return Ok(Held::Session(conn, id));
        }
        let mut tx = pool.begin().await.map_err(e)?;
        (&mut *tx)
            .execute(sqlx::raw_sql(&format!(
                "SELECT pg_advisory_xact_lock({id})"
            )))
            .await
            .map_err(e)?;
        Ok(Held::Xact(tx))
    }

    pub(super) async fn release(held: Held) -> Result<(), String> {
        let e = |e: sqlx::Error| e.to_string();
        match held {
            Held::Xact(tx) => tx.commit().await.map_err(e),
            Held::Session(mut conn, id) => {
                (&mut *conn)
                    .execute(sqlx::raw_sql(&format!("SELECT pg_advisory_unlock({id})")))
                    .await
                    .map_err(e)?;
                Ok(())
            }
            Held::Lease(_) => unreachable!("an engine's lease is released by the engine"),
        }
    }
}
