//! A completion ([`Lease::complete`]) that its backend refuses for a while (a Redis busy
//! with a script, loading, a replica: [`BackendError::is_refusal`]) is sent again, with
//! the lease still renewed meanwhile, until the backend takes it; refused for longer than
//! the lease can last, it ends with the refusal and writes nothing. The backend here is
//! the in-process one behind a switch that refuses completions (and, when asked,
//! renewals), so a refusal can outlast several TTLs while renewals go through.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use tokio::sync::watch;
use tower_lock::{
    LockEngine, LockError, MemoryBackend, Token,
    engine::{
        AcquireRequest, Backend, BackendError, BackendErrorKind, BoxFuture, Capabilities,
        ExtendMode, Grant, Holder, LockKey, Mode, Record, RecordBackend, Renewal,
    },
};

/// The in-process backend, whose completions (and renewals) are refused while a switch is
/// set; counts the refused completions and the renewals that went through.
#[derive(Debug, Default)]
struct Refusing {
    inner: MemoryBackend,
    refuse_completions: AtomicBool,
    refuse_renewals: AtomicBool,
    refused: watch::Sender<usize>,
    renewed: watch::Sender<usize>,
}

fn busy<T>() -> Result<T, LockError> {
    Err(LockError::Backend(
        BackendError::new(BackendErrorKind::Unavailable, "busy (test backend)").refused(),
    ))
}

impl Backend for Refusing {
    fn acquire(&self, req: AcquireRequest) -> BoxFuture<'_, Result<Grant, LockError>> {
        self.inner.acquire(req)
    }

    fn release<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        mode: Mode,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        self.inner.release(key, token, mode)
    }

    fn extend<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        mode: Mode,
        ttl: Duration,
        how: ExtendMode,
    ) -> BoxFuture<'a, Result<Duration, LockError>> {
        self.inner.extend(key, token, mode, ttl, how)
    }

    fn renew<'a>(&'a self, leases: &'a [Renewal]) -> BoxFuture<'a, Result<Vec<bool>, LockError>> {
        Box::pin(async move {
            if self.refuse_renewals.load(Ordering::SeqCst) {
                return busy();
            }
            let result = self.inner.renew(leases).await;
            self.renewed.send_modify(|n| *n += 1);
            result
        })
    }

    fn holders<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<Vec<Holder>, LockError>> {
        self.inner.holders(key)
    }

    fn waiters<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<usize, LockError>> {
        self.inner.waiters(key)
    }

    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities::none().with_records(self)
    }
}

impl RecordBackend for Refusing {
    fn record<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<Option<Record>, LockError>> {
        self.inner.record(key)
    }

    fn complete<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        record: &'a Record,
        retention: Duration,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        if self.refuse_completions.load(Ordering::SeqCst) {
            self.refused.send_modify(|n| *n += 1);
            return Box::pin(async { busy() });
        }
        self.inner.complete(key, token, record, retention)
    }

    fn forget<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<bool, LockError>> {
        self.inner.forget(key)
    }
}

fn record() -> Record {
    Record::new(
        Bytes::from_static(b"fingerprint"),
        Bytes::from_static(b"meta"),
        Bytes::from_static(b"body"),
    )
}

/// Until `counter` reaches `n`.
async fn until(counter: &watch::Sender<usize>, n: usize) {
    counter.subscribe().wait_for(|c| *c >= n).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_completion_keeps_its_lease_renewed_until_the_backend_takes_it() {
    let backend = Arc::new(Refusing::default());
    backend.refuse_completions.store(true, Ordering::SeqCst);
    let engine = LockEngine::from_arc(backend.clone());
    let key = LockKey::new("k").unwrap();
    // A TTL long enough that a renewal a loaded machine's scheduler delays by a few
    // hundred milliseconds still lands in time.
    let lease = engine
        .lock_on(key.clone())
        .ttl(Duration::from_millis(900))
        .acquire()
        .await
        .unwrap();
    let lost = lease.lost_signal();
    let mut complete = tokio::spawn(lease.complete(record(), Duration::from_secs(60)));
    until(&backend.refused, 1).await;
    // Refused for two whole TTLs (a renewal per third of one): unrenewed, the lease would
    // have expired on the backend, and the completion would find it gone.
    let renewed = *backend.renewed.borrow();
    tokio::select! {
        () = until(&backend.renewed, renewed + 6) => {}
        ended = &mut complete => panic!("the completion ended while refused: {:?}", ended.unwrap()),
    }
    backend.refuse_completions.store(false, Ordering::SeqCst);
    let completed = complete.await.unwrap();
    assert!(completed.is_ok(), "{completed:?}");
    assert!(!lost.is_lost(), "the lease was reported lost");
    let stored = engine.record(&key).await.unwrap().expect("the record");
    assert_eq!(stored.body, record().body);
    assert!(!engine.lock_on(key).locked().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_refused_past_its_lease_ends_with_the_refusal_and_writes_nothing() {
    let backend = Arc::new(Refusing::default());
    backend.refuse_completions.store(true, Ordering::SeqCst);
    backend.refuse_renewals.store(true, Ordering::SeqCst);
    let engine = LockEngine::from_arc(backend.clone());
    let key = LockKey::new("k").unwrap();
    let ttl = Duration::from_millis(300);
    let lease = engine
        .lock_on(key.clone())
        .ttl(ttl)
        .acquire()
        .await
        .unwrap();
    // The backend's expiry: its TTL from a moment before this one.
    let expired_by = tokio::time::Instant::now() + ttl;
    let valid_until = lease.valid_until();
    let completed = lease.complete(record(), Duration::from_secs(60)).await;
    match completed {
        Err(LockError::Backend(e)) => assert!(e.is_refusal(), "{e}"),
        other => panic!("a completion refused past its lease ended with {other:?}"),
    }
    assert!(
        tokio::time::Instant::now() >= valid_until,
        "given up before the lease ran out"
    );
    assert!(*backend.refused.borrow() > 1, "never sent again");
    backend.refuse_completions.store(false, Ordering::SeqCst);
    assert!(engine.record(&key).await.unwrap().is_none());
    // The lease's local deadline is a millisecond short of the backend's expiry (a server
    // may round its clock down by that much): the key is free once the expiry has passed.
    tokio::time::sleep_until(expired_by).await;
    assert!(!engine.lock_on(key).locked().await.unwrap());
}
