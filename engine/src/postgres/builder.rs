//! [`PostgresBackendBuilder`]: validates the configuration, installs or checks the schema,
//! opens the pool and starts the listener and the sweeper.

use std::{str::FromStr, sync::Arc, time::Duration};

use sqlx::{
    Executor,
    postgres::{PgConnectOptions, PgPool, PgPoolOptions},
};

use super::{
    DEFAULT_SCHEMA, FALLBACK_CAP, Inner, PostgresBackend,
    listener::{ListenTarget, Listener},
    names::Names,
    restarts::Restarts,
    schema::SCHEMA_VERSION,
    sweeper::{Sweep, Sweeper},
};
use crate::{BackendError, BackendErrorKind, runtime};

/// The longest call timeout accepted: one hour (a waiter's claim period is three times it).
pub const MAX_COMMAND_TIMEOUT: Duration = Duration::from_secs(60 * 60);

/// What the `LISTEN` connection's first start may take in `build`, when longer than the
/// command timeout: a session's start (a fork and the authentication) on a loaded server
/// can outlast a call's bound.
const SETUP_TIMEOUT: Duration = Duration::from_secs(10);

/// The default most connections of a backend's own pool: with the listener's, 4
/// connections per engine, so a fleet of 20 engines opens at most 80 of Postgres's default
/// `max_connections` of 100 (the sweeper takes one of the pool's). Measured against the
/// former 10: the same uncontended cycle (one call at a time needs one connection); see the
/// engine README for the figures with many keys at once.
pub const DEFAULT_POOL_SIZE: u32 = 3;

/// Where the calls go: a URL (the backend opens its pool), or the application's pool.
#[derive(Clone, Debug)]
pub(super) enum Source {
    Url(String),
    Pool(PgPool),
}

/// Builds a [`PostgresBackend`]; see [`PostgresBackend::builder`] and
/// [`PostgresBackend::from_pool`].
#[derive(Clone, Debug)]
#[must_use]
pub struct PostgresBackendBuilder {
    source: Source,
    listen_url: Option<String>,
    schema: String,
    prefix: String,
    command_timeout: Duration,
    pool_size: u32,
}

fn config(message: impl Into<String>) -> BackendError {
    BackendError::new(BackendErrorKind::Config, message)
}

fn options(url: &str) -> Result<PgConnectOptions, BackendError> {
    PgConnectOptions::from_str(url)
        .map_err(|e| config("the postgres URL is malformed").with_source(e))
}

impl PostgresBackendBuilder {
    pub(super) fn new(source: Source) -> Self {
        Self {
            source,
            listen_url: None,
            schema: DEFAULT_SCHEMA.to_owned(),
            prefix: String::new(),
            command_timeout: Duration::from_secs(2),
            pool_size: DEFAULT_POOL_SIZE,
        }
    }

    /// The direct address of the database for the listener's `LISTEN` connection: needed
    /// when the calls go through PgBouncer in transaction mode (a `LISTEN` there would be
    /// forgotten with its transaction). Default: the builder's URL (or a connection of the
    /// application's pool).
    pub fn listen_url(mut self, url: impl Into<String>) -> Self {
        self.listen_url = Some(url.into());
        self
    }

    /// The schema of the backend's tables and functions (default `tower_lock`): 1 to
    /// [`MAX_NAME_LEN`](super::MAX_NAME_LEN) bytes of `a-z`, `0-9`, `_`.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// A prefix for the backend's table and function names (default none), so that
    /// several deployments can share a schema: up to
    /// [`MAX_NAME_LEN`](super::MAX_NAME_LEN) bytes of `a-z`, `0-9`, `_`.
    pub fn table_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The bound on every call (default 2 s, at most [`MAX_COMMAND_TIMEOUT`]). A waiter's
    /// ticket lives three times as long unrefreshed, and so does a hand-off to it before it
    /// confirms (its claim period). The `LISTEN` connection's first start, in
    /// [`build`](Self::build), may take up to 10 s, or this bound if longer.
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// The most connections the backend's own pool opens (default [`DEFAULT_POOL_SIZE`],
    /// 3; ignored over the application's pool). The backend opens these on demand (none
    /// held idle beyond what was used), plus one `LISTEN` connection of its own for as
    /// long as it lives, and one more for the time of [`migrate`](Self::migrate): at most
    /// `pool_size + 1` at once after `build()`. Calls beyond the pool's size wait for a
    /// connection (within the call timeout).
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = size;
        self
    }

    /// The exact call that installs this builder's schema, for the error that finds it
    /// missing or older: the user's own builder with `.migrate().await?`.
    fn migrate_call(&self) -> String {
        let mut call = match self.source {
            Source::Url(_) => "PostgresBackend::builder(url)".to_owned(),
            Source::Pool(_) => "PostgresBackend::from_pool(pool)".to_owned(),
        };
        if self.schema != DEFAULT_SCHEMA {
            call.push_str(&format!(".schema({:?})", self.schema));
        }
        if !self.prefix.is_empty() {
            call.push_str(&format!(".table_prefix({:?})", self.prefix));
        }
        call.push_str(".migrate().await?");
        call
    }

    fn names(&self) -> Result<Names, BackendError> {
        Names::new(&self.schema, &self.prefix)
    }

    /// Create the schema, tables and functions, or bring them to this version: one
    /// multi-statement message, one transaction, serialized against concurrent migrations.
    /// Idempotent; run it once per deployment or at every start.
    pub async fn migrate(&self) -> Result<(), BackendError> {
        let sql = self.names()?.migration();
        let source = self.source.clone();
        let timeout = self.command_timeout.max(Duration::from_secs(30));
        on_engine_runtime(async move {
            let run = async {
                match source {
                    Source::Url(url) => {
                        let once = PgPoolOptions::new()
                            .max_connections(1)
                            .connect_with(options(&url)?)
                            .await?;
                        sqlx::raw_sql(&sql).execute(&once).await?;
                        once.close().await;
                    }
                    Source::Pool(pool) => {
                        sqlx::raw_sql(&sql).execute(&pool).await?;
                    }
                }
                Ok::<_, Migrate>(())
            };
            match tokio::time::timeout(timeout, run).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(Migrate::Config(e))) => Err(e),
                Ok(Err(Migrate::Sql(e))) => Err(BackendError::new(
                    BackendErrorKind::Unavailable,
                    "postgres migration failed",
                )
                .with_source(e)),
                Err(_) => Err(BackendError::new(
                    BackendErrorKind::Timeout,
                    format!("postgres migration did not finish within {timeout:?}"),
                )),
            }
        })
        .await
    }

    /// Validate the configuration, open the pool, check that the schema is there at this
    /// version, `LISTEN`, and start the sweeper. A schema that is missing, older or newer
    /// is refused with a [`Config`](BackendErrorKind::Config) error that names the fix.
    pub async fn build(self) -> Result<PostgresBackend, BackendError> {
        let names = self.names()?;
        if self.command_timeout.is_zero() || self.command_timeout > MAX_COMMAND_TIMEOUT {
            return Err(config(format!(
                "command timeout {:?}: more than zero, at most {MAX_COMMAND_TIMEOUT:?}",
                self.command_timeout
            )));
        }
        if self.pool_size == 0 {
            return Err(config("pool size 0: at least one connection"));
        }
        on_engine_runtime(self.build_here(names)).await
    }

    /// [`build`](Self::build), on the engine's runtime (which then owns every connection).
    async fn build_here(self, names: Names) -> Result<PostgresBackend, BackendError> {
        let timeout = self.command_timeout;
        let (pool, direct) = match &self.source {
            Source::Url(url) => {
                let options = options(url)?;
                let pool = PgPoolOptions::new()
                    .max_connections(self.pool_size)
                    .acquire_timeout(timeout)
                    // A ping per call would double the round trips; a connection that died
                    // idle fails its call, which the caller sees as unavailable.
                    .test_before_acquire(false)
                    .connect_lazy_with(options.clone());
                (pool, Some(options))
            }
            Source::Pool(pool) => (pool.clone(), None),
        };
        check_version(&pool, &names, timeout, &self.migrate_call()).await?;
        let target = match (&self.listen_url, direct) {
            (Some(url), _) => ListenTarget::Direct(Box::new(options(url)?)),
            (None, Some(options)) => ListenTarget::Direct(Box::new(options)),
            (None, None) => ListenTarget::Pool(pool.clone()),
        };
        let restarts = Arc::new(Restarts::default());
        // A session's start (a fork and the authentication) on a loaded server can outlast
        // a call's bound: the listener's first connection gets at least `SETUP_TIMEOUT`.
        let setup = timeout.max(SETUP_TIMEOUT);
        let listener =
            Listener::start(target, &names.channel(), timeout, setup, restarts.clone()).await?;
        let sweep = Sweep::new(pool.clone(), names.sweep(), timeout);
        let sweeper = Sweeper::start(sweep.clone());
        let ticket_ttl_ms =
            u64::try_from((timeout * 3).max(FALLBACK_CAP * 4).as_millis()).unwrap_or(u64::MAX);
        Ok(PostgresBackend {
            inner: Arc::new(Inner {
                pool,
                names,
                timeout,
                ticket_ttl_ms,
                listener,
                restarts,
                sweep,
                _sweeper: sweeper,
            }),
        })
    }
}

enum Migrate {
    Config(BackendError),
    Sql(sqlx::Error),
}

impl From<BackendError> for Migrate {
    fn from(e: BackendError) -> Self {
        Self::Config(e)
    }
}

impl From<sqlx::Error> for Migrate {
    fn from(e: sqlx::Error) -> Self {
        Self::Sql(e)
    }
}

/// Run `work` on the engine's runtime, so that the connections it opens (and the pool's
/// own tasks) live there, not on a runtime the user may shut down.
async fn on_engine_runtime<T: Send + 'static>(
    work: impl Future<Output = Result<T, BackendError>> + Send + 'static,
) -> Result<T, BackendError> {
    runtime::handle().spawn(work).await.unwrap_or_else(|e| {
        Err(BackendError::new(
            BackendErrorKind::Unavailable,
            format!("postgres set-up did not finish: {e}"),
        ))
    })
}

/// Refuse a schema that is missing or at another version, naming the fix.
async fn check_version(
    pool: &PgPool,
    names: &Names,
    timeout: Duration,
    call: &str,
) -> Result<(), BackendError> {
    let sql = names.version_query();
    let read = tokio::time::timeout(timeout, pool.fetch_optional(sqlx::raw_sql(&sql))).await;
    let fix = format!(
        "run `{call}` once (schema {:?}, table prefix {:?}; idempotent, so at every start \
         is fine too), then build again",
        names.schema(),
        names.prefix()
    );
    let row = match read {
        Err(_) => {
            return Err(BackendError::new(
                BackendErrorKind::Timeout,
                format!("postgres did not answer within {timeout:?}"),
            ));
        }
        Ok(Err(sqlx::Error::Database(db)))
            if matches!(db.code().as_deref(), Some("42P01" | "3F000")) =>
        {
            return Err(config(format!("the tower-lock tables are missing: {fix}")));
        }
        Ok(Err(e)) => {
            return Err(BackendError::new(
                BackendErrorKind::Unavailable,
                "postgres is unreachable",
            )
            .with_source(e));
        }
        Ok(Ok(row)) => row,
    };
    let version = row
        .and_then(|row| sqlx::Row::try_get::<Option<i64>, _>(&row, 0).ok().flatten())
        .unwrap_or(0);
    match version.cmp(&i64::from(SCHEMA_VERSION)) {
        std::cmp::Ordering::Equal => Ok(()),
        std::cmp::Ordering::Less => Err(config(format!(
            "the tower-lock schema is at version {version}, older than this library's \
             {SCHEMA_VERSION}: {fix}"
        ))),
        std::cmp::Ordering::Greater => Err(config(format!(
            "the tower-lock schema is at version {version}, newer than this library's \
             {SCHEMA_VERSION}: upgrade the library, or use another schema or table prefix"
        ))),
    }
}
