//! [`LockEngine`]: a cheap-to-clone handle on a backend and its renewal task.

use std::{any::Any, fmt, sync::Arc, time::Duration};

use super::{
    AdminBackend, Backend, HolderLabel, KeyMutex, LockAdmin, LockError, LockKey, LockOptions,
    LockPool, MemoryBackend, NumericBackend, NumericKey, PoolBackend, Record, RecordBackend,
    SynchronousBackend, lock::Lock, watchdog::Watchdog,
};

impl EngineShared {
    /// Whether the backend still vouches for a grant whose request was sent at `sent`: it
    /// reported no reset since (see [`Resets`](crate::Resets)).
    pub(crate) fn vouches_for(&self, sent: tokio::time::Instant) -> bool {
        self.resets.as_ref().is_none_or(|r| r.vouch_for(sent))
    }
}

pub(crate) struct EngineShared {
    pub(crate) backend: Arc<dyn Backend>,
    /// The same backend's synchronous path, when it is the in-process one.
    pub(crate) synchronous: Option<Arc<dyn SynchronousBackend>>,
    pub(crate) watchdog: Arc<Watchdog>,
    /// The backend's resets, if it reports them.
    pub(crate) resets: Option<crate::Resets>,
    /// The releases begun and not yet answered, which an acquire of their key awaits.
    pub(crate) releasing: Arc<crate::releasing::Releasing>,
    /// Stored with every lease this engine takes (see [`LockEngine::holder_label`]).
    pub(crate) label: Option<HolderLabel>,
    defaults: LockOptions,
}

/// A handle on a lock engine: cheap to clone, shared by every clone.
///
/// Create it once (at startup) and clone it wherever locks are needed; all clones share
/// one backend and one renewal task.
#[derive(Clone)]
pub struct LockEngine {
    pub(super) shared: Arc<EngineShared>,
}

impl fmt::Debug for LockEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockEngine")
            .field("defaults", &self.shared.defaults)
            .finish_non_exhaustive()
    }
}

impl LockEngine {
    /// An engine over the in-process backend: serializes within this process only.
    pub fn in_memory() -> Self {
        Self::new(MemoryBackend::new())
    }

    /// An engine over one Redis at `url`, with the Redis backend's defaults (see
    /// [`RedisBackend::connect`](super::redis::RedisBackend::connect)); for anything else,
    /// build a [`RedisBackend`](super::redis::RedisBackend) and hand it to
    /// [`LockEngine::new`].
    ///
    /// ```rust,no_run
    /// # async fn f() -> Result<(), tower_lock_engine::BackendError> {
    /// let engine = tower_lock_engine::LockEngine::redis("redis://127.0.0.1:6379").await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "redis")]
    pub async fn redis(url: impl Into<String>) -> Result<Self, crate::BackendError> {
        Ok(Self::new(super::redis::RedisBackend::connect(url).await?))
    }

    /// An engine over the Postgres at `url`, with the Postgres backend's defaults (see
    /// [`PostgresBackend::connect`](super::postgres::PostgresBackend::connect)); the schema
    /// must have been installed with
    /// [`migrate`](super::postgres::PostgresBackendBuilder::migrate). For anything else,
    /// build a [`PostgresBackend`](super::postgres::PostgresBackend) and hand it to
    /// [`LockEngine::new`].
    ///
    /// ```rust,no_run
    /// # async fn f() -> Result<(), tower_lock_engine::BackendError> {
    /// let engine = tower_lock_engine::LockEngine::postgres("postgres://app@127.0.0.1/app").await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "postgres")]
    pub async fn postgres(url: impl Into<String>) -> Result<Self, crate::BackendError> {
        Ok(Self::new(
            super::postgres::PostgresBackend::connect(url).await?,
        ))
    }

    /// An engine over any backend.
    pub fn new(backend: impl Backend) -> Self {
        let backend = Arc::new(backend);
        // The in-process backend itself (not a wrapper around one, whose own `acquire` and
        // `release` must run) also answers on the spot: see `SynchronousBackend`.
        let any: Arc<dyn Any + Send + Sync> = backend.clone();
        let synchronous = any
            .downcast::<MemoryBackend>()
            .ok()
            .map(|memory| memory as Arc<dyn SynchronousBackend>);
        Self::build(backend, synchronous, LockOptions::default())
    }

    /// An engine over a shared backend.
    pub fn from_arc(backend: Arc<dyn Backend>) -> Self {
        Self::build(backend, None, LockOptions::default())
    }

    fn build(
        backend: Arc<dyn Backend>,
        synchronous: Option<Arc<dyn SynchronousBackend>>,
        defaults: LockOptions,
    ) -> Self {
        Self::build_with(backend, synchronous, defaults, Arc::default())
    }

    fn build_with(
        backend: Arc<dyn Backend>,
        synchronous: Option<Arc<dyn SynchronousBackend>>,
        defaults: LockOptions,
        releasing: Arc<crate::releasing::Releasing>,
    ) -> Self {
        Self {
            shared: Arc::new(EngineShared {
                resets: backend.resets(),
                backend,
                synchronous,
                watchdog: Arc::new(Watchdog::new()),
                releasing,
                label: Some(HolderLabel::process()),
                defaults,
            }),
        }
    }

    /// Set the options every [`Lock`] from this engine starts with.
    pub fn with_defaults(self, defaults: LockOptions) -> Self {
        let label = self.shared.label.clone();
        Self::build_with(
            self.shared.backend.clone(),
            self.shared.synchronous.clone(),
            defaults,
            self.shared.releasing.clone(),
        )
        .labelled(label)
    }

    /// Store `label` with every lease this engine takes, instead of the default
    /// `<host name>:<process id>` ([`HolderLabel::process`]), so that whoever reads
    /// [`holders`](super::Backend::holders) (`tower-lock-cli status`) can tell which
    /// instance holds a key. What it costs: the label's bytes in each acquire's request
    /// and beside each stored lease (on Redis no command more, see the backend's docs).
    ///
    /// ```
    /// use tower_lock_engine::{HolderLabel, LockEngine};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_lock_engine::LockError> {
    /// let engine = LockEngine::in_memory().holder_label(HolderLabel::new("billing-1").unwrap());
    /// let _lease = engine.lock("invoice:42").acquire().await?;
    /// let holders = engine.lock("invoice:42").holders().await?;
    /// assert_eq!(holders[0].label(), Some("billing-1"));
    /// # Ok(())
    /// # }
    /// ```
    pub fn holder_label(self, label: HolderLabel) -> Self {
        self.labelled(Some(label))
    }

    /// Store no label with this engine's leases (each acquire then sends none).
    pub fn without_holder_label(self) -> Self {
        self.labelled(None)
    }

    /// The label stored with this engine's leases, if any.
    pub fn label(&self) -> Option<&HolderLabel> {
        self.shared.label.as_ref()
    }

    /// This engine (its backend, watchdog and releases in flight) with `label`.
    fn labelled(self, label: Option<HolderLabel>) -> Self {
        let shared = &self.shared;
        Self {
            shared: Arc::new(EngineShared {
                backend: shared.backend.clone(),
                synchronous: shared.synchronous.clone(),
                watchdog: shared.watchdog.clone(),
                resets: shared.resets.clone(),
                releasing: shared.releasing.clone(),
                label,
                defaults: shared.defaults.clone(),
            }),
        }
    }

    /// A handle on `key`, with the engine's default options: its lock, or with
    /// [`Lock::shared`] one of its shared leases. The key is validated when the handle is
    /// used; an invalid key makes every operation return [`LockError::InvalidKey`].
    pub fn lock(&self, key: impl AsRef<str>) -> Lock {
        Lock::new(
            self.clone(),
            LockKey::new(key),
            self.shared.defaults.clone(),
        )
    }

    /// A handle on an already validated key (as [`lock`](Self::lock)).
    #[inline]
    pub fn lock_on(&self, key: LockKey) -> Lock {
        Lock::new(self.clone(), Ok(key), self.shared.defaults.clone())
    }

    /// A [`KeyMutex`] on `key`: run a closure while holding it, or acquire and release by
    /// hand with "already held" / "not held" errors.
    pub fn mutex(&self, key: impl AsRef<str>) -> KeyMutex {
        KeyMutex::new(self.lock(key))
    }

    /// The numeric value under `key`, for compare-and-set.
    pub fn numeric(&self, key: impl AsRef<str>) -> NumericKey {
        NumericKey::new(self.clone(), LockKey::new(key))
    }

    /// The pool named `name`: a set of lock keys with membership and health operations.
    pub fn pool(&self, name: impl AsRef<str>) -> LockPool {
        LockPool::new(self.clone(), LockKey::new(name))
    }

    /// Administrative operations that ignore ownership: reserve a key, force a
    /// release. Meant for operators and tooling, not request paths.
    pub fn admin(&self) -> LockAdmin {
        LockAdmin::new(self.clone())
    }

    /// The record stored under `key` by [`Lease::complete`](super::Lease::complete), if
    /// any and within its retention (a tombstone, [`Record::kept`](Record#structfield.kept)
    /// `false`, when the store kept only that the operation completed).
    /// [`LockError::Unsupported`] on a backend without records.
    ///
    /// ```
    /// use std::time::Duration;
    /// use bytes::Bytes;
    /// use tower_lock_engine::{LockEngine, LockKey, Record};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_lock_engine::LockError> {
    /// let engine = LockEngine::in_memory();
    /// let key = LockKey::new("order-7")?;
    /// let lease = engine.lock_on(key.clone()).acquire().await?;
    /// let record = Record::new(Bytes::from("fp"), Bytes::new(), Bytes::from("done"));
    /// lease.complete(record, Duration::from_secs(3600)).await?;
    /// let stored = engine.record(&key).await?.expect("completed");
    /// assert_eq!(stored.body, "done");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn record(&self, key: &LockKey) -> Result<Option<Record>, LockError> {
        self.record_backend()?.record(key).await
    }

    /// How long the record (or tombstone) stored under `key` lives on: `None` when there is
    /// none. What an operator reads beside [`record`](Self::record) (`tower-lock-cli
    /// record get`). [`LockError::Unsupported`] on a backend without records.
    ///
    /// ```
    /// use std::time::Duration;
    /// use bytes::Bytes;
    /// use tower_lock_engine::{LockEngine, LockKey, Record};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_lock_engine::LockError> {
    /// let engine = LockEngine::in_memory();
    /// let key = LockKey::new("order-7")?;
    /// let lease = engine.lock_on(key.clone()).acquire().await?;
    /// let record = Record::new(Bytes::from("fp"), Bytes::new(), Bytes::from("done"));
    /// lease.complete(record, Duration::from_secs(3600)).await?;
    /// let left = engine.record_expiry(&key).await?.expect("stored");
    /// assert!(left <= Duration::from_secs(3600) && left > Duration::from_secs(3590));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn record_expiry(&self, key: &LockKey) -> Result<Option<Duration>, LockError> {
        self.record_backend()?.record_expiry(key).await
    }

    /// Delete the record (or tombstone) stored under `key`, so that the next operation
    /// under `key` runs as if none had completed: an operator purging one record after an
    /// incident. Returns whether there was one within its retention. The lock on `key` is
    /// not touched: a holder keeps it, and its completion writes a new record. Logged at
    /// `warn`, as the [admin operations](super::LockAdmin) are. [`LockError::Unsupported`]
    /// on a backend without records.
    ///
    /// ```
    /// use std::time::Duration;
    /// use bytes::Bytes;
    /// use tower_lock_engine::{LockEngine, LockKey, Record};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_lock_engine::LockError> {
    /// let engine = LockEngine::in_memory();
    /// let key = LockKey::new("order-7")?;
    /// let lease = engine.lock_on(key.clone()).acquire().await?;
    /// let record = Record::new(Bytes::from("fp"), Bytes::new(), Bytes::from("done"));
    /// lease.complete(record, Duration::from_secs(3600)).await?;
    /// assert!(engine.forget_record(&key).await?);
    /// assert_eq!(engine.record(&key).await?, None);
    /// assert!(!engine.forget_record(&key).await?, "nothing left to delete");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn forget_record(&self, key: &LockKey) -> Result<bool, LockError> {
        let records = self.record_backend()?;
        tracing::warn!(%key, "deleting the stored record");
        records.forget(key).await
    }

    /// Whether the backend keeps records ([`RecordBackend`]).
    pub fn has_records(&self) -> bool {
        self.record_backend().is_ok()
    }

    /// Whether `self` and `other` are handles on one engine (clones of one another).
    pub fn same_engine(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// Whether the backend has shared mode ([`Lock::shared`]; see
    /// [`Backend::has_shared_mode`]).
    pub fn has_shared_mode(&self) -> bool {
        self.shared.backend.has_shared_mode()
    }

    pub(crate) fn record_backend(&self) -> Result<&dyn RecordBackend, LockError> {
        self.shared
            .backend
            .capabilities()
            .records
            .ok_or(LockError::Unsupported("records"))
    }

    pub(crate) fn admin_backend(&self) -> Result<&dyn AdminBackend, LockError> {
        self.shared
            .backend
            .capabilities()
            .admin
            .ok_or(LockError::Unsupported("admin operations"))
    }

    pub(crate) fn numeric_backend(&self) -> Result<&dyn NumericBackend, LockError> {
        self.shared
            .backend
            .capabilities()
            .numeric
            .ok_or(LockError::Unsupported("numeric compare-and-set"))
    }

    pub(crate) fn pool_backend(&self) -> Result<&dyn PoolBackend, LockError> {
        self.shared
            .backend
            .capabilities()
            .pools
            .ok_or(LockError::Unsupported("lock pools"))
    }
}
