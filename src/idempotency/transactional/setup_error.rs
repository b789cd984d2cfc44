//! [`SetupError`]: why a transactional idempotency layer could not be set up.

use std::fmt;

use crate::ConfigError;

/// Why [`TransactionalLayerBuilder::build`](super::TransactionalLayerBuilder::build) or
/// [`migrate`](super::TransactionalLayerBuilder::migrate) failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum SetupError {
    /// A setting of the idempotency builder was refused (as `IdempotencyLayerBuilder::build`
    /// would refuse it).
    Config(ConfigError),
    /// The schema or the prefix breaks the names' rule (in the characters the Postgres
    /// lock engine takes): lower-case ASCII letters, digits and `_`, not starting with a
    /// digit, at most 40 bytes (the prefix may be empty). Capitals are refused; reserved
    /// words are fine (every name is quoted).
    Name(String),
    /// The records or fences table does not exist: run
    /// [`migrate`](super::TransactionalLayerBuilder::migrate) once (at start-up, or from
    /// your deployment's migration step) before `build`.
    MissingTable {
        /// The records table, qualified.
        table: String,
    },
    /// The tables were made by an earlier version: the records table lacks the commit
    /// check that refuses a claim committed without its response (a handler's `COMMIT`),
    /// or the claim function that a first request's `BEGIN` travels with. Run
    /// [`migrate`](super::TransactionalLayerBuilder::migrate) once to add them.
    Outdated {
        /// The records table, qualified.
        table: String,
    },
    /// The database refused or could not be reached.
    Database(sqlx::Error),
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Config(e) => write!(f, "{e}"),
            Self::Name(name) => write!(
                f,
                "the schema and the table prefix take a-z, 0-9 and _ only, not starting with \
                 a digit, at most 40 bytes (the prefix may be empty; capitals are refused, \
                 as the Postgres lock engine refuses them; reserved words are fine): {name}"
            ),
            Self::MissingTable { table } => write!(
                f,
                "the idempotency table {table} (or its fences table) does not exist: call \
                 `TransactionalLayerBuilder::migrate()` once before `build()`"
            ),
            Self::Outdated { table } => write!(
                f,
                "the idempotency table {table} was made by an earlier version (it lacks the \
                 commit check of unfinished claims, or the claim function sent with \
                 `BEGIN`): call \
                 `TransactionalLayerBuilder::migrate()` once before `build()`"
            ),
            Self::Database(e) => write!(f, "the database failed: {e}"),
        }
    }
}

impl std::error::Error for SetupError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Config(e) => Some(e),
            Self::Database(e) => Some(e),
            Self::Name(_) | Self::MissingTable { .. } | Self::Outdated { .. } => None,
        }
    }
}

impl From<sqlx::Error> for SetupError {
    fn from(e: sqlx::Error) -> Self {
        Self::Database(e)
    }
}

impl From<ConfigError> for SetupError {
    fn from(e: ConfigError) -> Self {
        Self::Config(e)
    }
}
