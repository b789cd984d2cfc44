//! Numeric compare-and-set and compare-and-delete on a key.

use std::time::Duration;

use super::{KeyError, LockEngine, LockError, LockKey, MAX_TTL};

/// How the given value must relate to the stored one for the action to apply. An absent
/// key always satisfies the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compare {
    /// given > stored
    Greater,
    /// given < stored
    Less,
    /// given ≥ stored − ε
    GreaterOrEqual,
    /// given ≤ stored + ε
    LessOrEqual,
    /// |given − stored| ≤ ε
    Equal,
    /// |given − stored| > ε
    NotEqual,
}

impl Compare {
    /// Whether `given` relates to `stored` as this comparison says, with tolerance
    /// `epsilon` for the comparisons that include equality.
    pub fn holds(self, given: f64, stored: f64, epsilon: f64) -> bool {
        match self {
            Self::Greater => given > stored,
            Self::Less => given < stored,
            Self::GreaterOrEqual => given >= stored - epsilon,
            Self::LessOrEqual => given <= stored + epsilon,
            Self::Equal => (given - stored).abs() <= epsilon,
            Self::NotEqual => (given - stored).abs() > epsilon,
        }
    }

    /// A stable name (used by backends on the wire).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Greater => "gt",
            Self::Less => "lt",
            Self::GreaterOrEqual => "ge",
            Self::LessOrEqual => "le",
            Self::Equal => "eq",
            Self::NotEqual => "ne",
        }
    }
}

/// What to do when the comparison holds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum NumericAction {
    /// Store the given value, with a TTL (`None`: no expiry).
    Set {
        /// Expiry of the stored value.
        ttl: Option<Duration>,
    },
    /// Delete the key.
    Delete,
}

/// One compare-and-set / compare-and-delete, as sent to a backend.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NumericOp {
    /// The comparison.
    pub compare: Compare,
    /// The given value.
    pub value: f64,
    /// Tolerance for the equality-based comparisons.
    pub epsilon: f64,
    /// The action when the comparison holds.
    pub action: NumericAction,
}

/// A numeric value under a key, changed only by atomic compare-and-set / delete.
///
/// ```
/// use tower_lock_engine::{Compare, LockEngine};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_lock_engine::LockError> {
/// let engine = LockEngine::in_memory();
/// let high_water = engine.numeric("offset:orders");
/// assert!(high_water.set_if(Compare::Greater, 10.0, None).await?); // absent: set
/// assert!(!high_water.set_if(Compare::Greater, 7.0, None).await?); // 7 > 10 is false
/// assert_eq!(high_water.get().await?, Some(10.0));
/// assert!(high_water.delete_if(Compare::Equal, 10.0).await?);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct NumericKey {
    engine: LockEngine,
    key: Result<LockKey, KeyError>,
    epsilon: f64,
}

impl NumericKey {
    pub(crate) fn new(engine: LockEngine, key: Result<LockKey, KeyError>) -> Self {
        Self {
            engine,
            key,
            epsilon: 1e-9,
        }
    }

    /// Tolerance for the equality-based comparisons (default 1e-9).
    pub fn epsilon(mut self, epsilon: f64) -> Self {
        self.epsilon = epsilon.abs();
        self
    }

    fn key(&self) -> Result<&LockKey, LockError> {
        self.key
            .as_ref()
            .map_err(|e| LockError::InvalidKey(e.clone()))
    }

    /// The stored value, if any.
    pub async fn get(&self) -> Result<Option<f64>, LockError> {
        self.engine
            .numeric_backend()?
            .numeric_get(self.key()?)
            .await
    }

    /// Store `value` (with `ttl`) if `compare` holds between `value` and the stored value.
    ///
    /// A `ttl` longer than [`MAX_TTL`] is [`LockError::InvalidValue`] on every backend
    /// (store it without expiry instead: `None`); so is a value that is not finite.
    pub async fn set_if(
        &self,
        compare: Compare,
        value: f64,
        ttl: Option<Duration>,
    ) -> Result<bool, LockError> {
        self.apply(compare, value, NumericAction::Set { ttl }).await
    }

    /// Delete the key if `compare` holds between `value` and the stored value.
    pub async fn delete_if(&self, compare: Compare, value: f64) -> Result<bool, LockError> {
        self.apply(compare, value, NumericAction::Delete).await
    }

    async fn apply(
        &self,
        compare: Compare,
        value: f64,
        action: NumericAction,
    ) -> Result<bool, LockError> {
        if !value.is_finite() {
            return Err(LockError::InvalidValue("numeric value must be finite"));
        }
        if let NumericAction::Set { ttl: Some(ttl) } = action
            && ttl > MAX_TTL
        {
            return Err(LockError::InvalidValue(
                "a numeric value's TTL may be at most MAX_TTL (365 days)",
            ));
        }
        let op = NumericOp {
            compare,
            value,
            epsilon: self.epsilon,
            action,
        };
        self.engine
            .numeric_backend()?
            .compare_and_set(self.key()?, &op)
            .await
    }
}
