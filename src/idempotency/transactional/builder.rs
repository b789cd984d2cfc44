//! [`TransactionalLayerBuilder`]: an idempotency builder's settings plus where the
//! records live, checked against the database when it is built.

use std::fmt;

use sqlx::{Executor, PgPool, Row};

use super::{SetupError, TransactionalLayer, shared::Shared, tables::Tables};
use crate::IdempotencyLayerBuilder;

/// A [`TransactionalLayer`] under construction, from
/// [`IdempotencyLayerBuilder::transactional`]: the idempotency settings already made, the
/// application's pool, and the schema and prefix of the layer's tables (default `public`
/// and `tower_lock_`: `public.tower_lock_idempotency_records` and
/// `public.tower_lock_fences`).
#[must_use]
pub struct TransactionalLayerBuilder {
    idempotency: IdempotencyLayerBuilder,
    pool: PgPool,
    schema: String,
    prefix: String,
}

impl fmt::Debug for TransactionalLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransactionalLayerBuilder")
            .field("idempotency", &self.idempotency)
            .field("schema", &self.schema)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl TransactionalLayerBuilder {
    pub(crate) fn new(idempotency: IdempotencyLayerBuilder, pool: PgPool) -> Self {
        Self {
            idempotency,
            pool,
            schema: "public".to_owned(),
            prefix: "tower_lock_".to_owned(),
        }
    }

    /// The schema of the layer's tables (default `public`): lower-case ASCII letters,
    /// digits and `_`, not starting with a digit (the characters the Postgres lock engine
    /// takes), at most 40 bytes; capitals are refused by `migrate` and `build` with
    /// [`SetupError::Name`]. Every name is quoted in the layer's SQL, so a reserved word
    /// (`order`, `user`) is fine.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// The prefix of the layer's table names (default `tower_lock_`): empty, or as
    /// [`schema`](Self::schema) says.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Create the schema and the layer's tables if they are missing, or bring tables an
    /// earlier version made up to this one (idempotent, safe from several nodes at once).
    /// Run it once, at start-up or from a migration step.
    pub async fn migrate(&self) -> Result<(), SetupError> {
        let tables = Tables::new(&self.schema, &self.prefix)?;
        let mut tx = self.pool.begin().await?;
        for statement in tables.migration().into_iter().chain(tables.claim_check()) {
            (&mut *tx).execute(sqlx::raw_sql(&statement)).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Check the settings (as [`IdempotencyLayerBuilder::build`] does) and that the tables
    /// exist and are this version's ([`SetupError::MissingTable`] and
    /// [`SetupError::Outdated`] name the fix: [`migrate`](Self::migrate)), then build the
    /// layer.
    pub async fn build(self) -> Result<TransactionalLayer, SetupError> {
        let tables = Tables::new(&self.schema, &self.prefix)?;
        let replay = self.idempotency.build_core()?;
        let exists: bool = sqlx::raw_sql(&tables.exists())
            .fetch_one(&self.pool)
            .await?
            .try_get(0)?;
        if !exists {
            return Err(SetupError::MissingTable {
                table: tables.records().to_owned(),
            });
        }
        let checked: bool = sqlx::raw_sql(&tables.claim_check_exists())
            .fetch_one(&self.pool)
            .await?
            .try_get(0)?;
        if !checked {
            return Err(SetupError::Outdated {
                table: tables.records().to_owned(),
            });
        }
        Ok(TransactionalLayer::new(Shared::new(
            replay, self.pool, tables,
        )))
    }
}
