//! The permits capability: never more than N shared holders nor anyone beside an exclusive
//! one, grants in arrival order without writer starvation, fences rising per key, a
//! crashed holder's permit freed on time, waiters that leave take nothing with them, and
//! the release / extend / renew contracts of a lease.

use std::{
    collections::HashSet,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::time::{Instant, sleep, timeout};

use super::{Harness, assert_no_residue};
use crate::{
    AcquireRequest, ExtendMode, Fence, Grant, LockEngine, LockError, LockKey, PermitBackend,
    PermitRequest, Renewal, Token,
};

/// The backend's permits, for the cases that act behind a holder's back.
fn permit_backend(backend: &dyn crate::Backend) -> &dyn PermitBackend {
    backend
        .capabilities()
        .permits
        .expect("the backend offers permits")
}

/// Wait until `n` callers are queued for a permit of `key` (observable backend state, no
/// event to await).
async fn until_permit_waiters(engine: &LockEngine, key: &str, n: usize) {
    let permits = engine.permits(key, 1);
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        if permits.waiters().await.unwrap() == n {
            return;
        }
        assert!(
            Instant::now() < give_up,
            "never saw {n} permit waiters on {key}"
        );
        tokio::task::yield_now().await;
        sleep(Duration::from_millis(1)).await;
    }
}

/// A grant straight from the backend that nobody will renew or release: a holder that
/// crashed.
async fn crashed_holder(
    h: &impl Harness,
    key: &str,
    permits: u32,
    exclusive: bool,
    ttl: Duration,
) -> (Token, Grant) {
    let backend = h.backend();
    let token = Token::random();
    let grant = permit_backend(&*backend)
        .acquire_permit(PermitRequest {
            acquire: AcquireRequest {
                key: LockKey::new(key).unwrap(),
                token: token.clone(),
                ttl,
                // Leases dropped just before may still be on their way out.
                wait: Some(Duration::from_secs(10)),
                fifo: true,
                max_waiters: None,
            },
            permits,
            exclusive,
        })
        .await
        .expect("a free permit");
    (token, grant)
}

async fn permit_rounds(h: &impl Harness, fifo: bool) {
    const TASKS: usize = 12;
    const ITERATIONS: usize = 25;
    const N: usize = 3;
    let engine = h.engine();
    let key = format!("permits-load-{fifo}");
    // Holders inside their critical section now, by kind. Each is counted from after its
    // grant to before its release, so any overlap seen here is a real one.
    let shared = Arc::new(AtomicUsize::new(0));
    let exclusive = Arc::new(AtomicUsize::new(0));
    let violations = Arc::new(Mutex::new(Vec::new()));
    // Deliberately racy read-modify-write by exclusive holders: only their exclusion
    // keeps it exact.
    let counter = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (engine, key) = (engine.clone(), key.clone());
        let (shared, exclusive, violations, counter) = (
            shared.clone(),
            exclusive.clone(),
            violations.clone(),
            counter.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut writes = 0;
            for i in 0..ITERATIONS {
                let alone = (t + i) % 5 == 0;
                let permits = engine
                    .permits(&key, N as u32)
                    .fifo(fifo)
                    .ttl(Duration::from_secs(10));
                let permits = if alone { permits.exclusive() } else { permits };
                let lease = permits.acquire().await.expect("acquire");
                if alone {
                    let writers = exclusive.fetch_add(1, Ordering::SeqCst) + 1;
                    let readers = shared.load(Ordering::SeqCst);
                    if writers > 1 || readers > 0 {
                        violations.lock().unwrap().push((writers, readers));
                    }
                    let v = counter.load(Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    counter.store(v + 1, Ordering::SeqCst);
                    writes += 1;
                    exclusive.fetch_sub(1, Ordering::SeqCst);
                } else {
                    let readers = shared.fetch_add(1, Ordering::SeqCst) + 1;
                    let writers = exclusive.load(Ordering::SeqCst);
                    if readers > N || writers > 0 {
                        violations.lock().unwrap().push((writers, readers));
                    }
                    tokio::task::yield_now().await;
                    tokio::task::yield_now().await;
                    shared.fetch_sub(1, Ordering::SeqCst);
                }
                lease.release().await.expect("release");
            }
            writes
        }));
    }
    let mut writes = 0;
    for t in tasks {
        writes += t.await.unwrap();
    }
    let violations = violations.lock().unwrap().clone();
    assert!(
        violations.is_empty(),
        "(exclusive, shared) holders at once: {violations:?}"
    );
    assert_eq!(counter.load(Ordering::SeqCst), writes);
    assert_no_residue(h).await;
}

/// Many tasks on a multi-threaded runtime, shared and exclusive mixed: never more than N
/// shared holders, never an exclusive holder beside anyone.
pub async fn permits_never_exceed_n_nor_share_an_exclusive_holder(h: &impl Harness) {
    permit_rounds(h, false).await;
}

/// The same in FIFO mode.
pub async fn fifo_permits_never_exceed_n_nor_share_an_exclusive_holder(h: &impl Harness) {
    permit_rounds(h, true).await;
}

/// N shared holders at once; the next is busy, and so is an exclusive one; a release lets
/// the next in. A limit of zero is refused and leaves nothing.
pub async fn n_permits_are_held_at_once_and_no_more(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let tenant = engine.permits("tenant", 3).ttl(u * 10);
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(tenant.try_acquire().await.expect("one of three permits"));
    }
    let holders = tenant.holders().await.unwrap();
    assert_eq!(holders.len(), 3);
    assert!(holders.iter().all(|h| !h.exclusive));
    assert!(
        holders
            .iter()
            .all(|h| h.ttl.is_some_and(|t| t <= u * 10 && t > u * 5))
    );
    let mut tokens: Vec<&str> = held.iter().map(|l| l.token().as_str()).collect();
    tokens.sort_unstable();
    let mut listed: Vec<&str> = holders.iter().map(|h| h.token.as_str()).collect();
    listed.sort_unstable();
    assert_eq!(tokens, listed);
    match tenant.try_acquire().await {
        Err(LockError::Busy {
            retry_after: Some(r),
        }) => assert!(r <= u * 10, "retry_after {r:?}"),
        other => panic!("a fourth permit of three: {other:?}"),
    }
    assert!(matches!(
        tenant.clone().exclusive().try_acquire().await,
        Err(LockError::Busy { .. })
    ));
    held.pop().unwrap().release().await.unwrap();
    held.push(tenant.try_acquire().await.expect("a permit was given back"));
    // Each request brings its own limit: one of four is free for a caller allowing four.
    let fourth = engine
        .permits("tenant", 4)
        .try_acquire()
        .await
        .expect("four allowed");
    assert_eq!(tenant.holders().await.unwrap().len(), 4);
    for lease in held {
        lease.release().await.unwrap();
    }
    fourth.release().await.unwrap();
    // An exclusive holder keeps out every shared one, whatever its limit.
    let writer = tenant.clone().exclusive().try_acquire().await.unwrap();
    let holders = tenant.holders().await.unwrap();
    assert!(holders.len() == 1 && holders[0].exclusive);
    assert!(matches!(
        engine.permits("tenant", u32::MAX).try_acquire().await,
        Err(LockError::Busy { .. })
    ));
    writer.release().await.unwrap();
    assert!(tenant.holders().await.unwrap().is_empty());
    // A limit of zero admits nobody, and is an error rather than a wait.
    let zero = engine.permits("tenant", 0);
    assert!(matches!(
        zero.try_acquire().await,
        Err(LockError::InvalidValue(_))
    ));
    assert!(matches!(
        zero.wait(u).acquire().await,
        Err(LockError::InvalidValue(_))
    ));
    assert_no_residue(h).await;
}

/// Waiters are granted in arrival order, shared and exclusive mixed: the fence of each
/// grant tells the order in which the backend granted it.
pub async fn permit_grants_follow_arrival_order(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let kinds = [false, false, true, false, true, true, false, false, false];
    let first = engine
        .permits("order", 2)
        .fifo(true)
        .exclusive()
        .acquire()
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for (i, &alone) in kinds.iter().enumerate() {
        let permits = engine
            .permits("order", 2)
            .fifo(true)
            .ttl(u * 50)
            .wait(u * 100);
        let permits = if alone { permits.exclusive() } else { permits };
        tasks.push(tokio::spawn(async move {
            let lease = permits.acquire().await.expect("granted in turn");
            let fence = lease.fence();
            lease.release().await.unwrap();
            fence
        }));
        // Arrival order is defined once the waiter is queued.
        until_permit_waiters(&engine, "order", i + 1).await;
    }
    first.release().await.unwrap();
    let mut fences: Vec<(Fence, usize)> = Vec::new();
    for (i, t) in tasks.into_iter().enumerate() {
        fences.push((t.await.unwrap(), i));
    }
    fences.sort();
    let order: Vec<usize> = fences.iter().map(|(_, i)| *i).collect();
    assert_eq!(order, (0..kinds.len()).collect::<Vec<_>>(), "grant order");
    assert_no_residue(h).await;
}

/// Once an exclusive request waits, shared requests that arrive later queue behind it, even
/// though they would fit beside the shared holders: a steady stream of shared holders never
/// starves it.
pub async fn an_exclusive_waiter_is_not_starved_by_a_stream_of_shared_ones(h: &impl Harness) {
    const READERS: usize = 6;
    const ROUNDS: usize = 5;
    let engine = h.engine();
    let u = h.unit();
    let doc = engine.permits("doc", u32::MAX).fifo(true).ttl(u * 50);
    let reader = doc.acquire().await.unwrap();
    // A second reader joins at once: shared holders share.
    let joined = doc.try_acquire().await.expect("readers share");
    let writer = {
        let doc = doc.clone().exclusive().wait(u * 100);
        tokio::spawn(async move {
            let lease = doc.acquire().await.expect("the writer is granted");
            let fence = lease.fence();
            lease.release().await.unwrap();
            fence
        })
    };
    until_permit_waiters(&engine, "doc", 1).await;
    // A newcomer does not overtake the waiting writer, though it fits beside the readers.
    assert!(matches!(
        doc.try_acquire().await,
        Err(LockError::Busy { .. })
    ));
    // A steady stream of readers, each coming back as soon as it is done.
    let stream: Vec<_> = (0..READERS)
        .map(|_| {
            let doc = doc.clone().wait(u * 100);
            tokio::spawn(async move {
                let mut fences = Vec::new();
                for _ in 0..ROUNDS {
                    let lease = doc.acquire().await.expect("a reader is granted");
                    fences.push(lease.fence());
                    tokio::task::yield_now().await;
                    lease.release().await.unwrap();
                }
                fences
            })
        })
        .collect();
    until_permit_waiters(&engine, "doc", 1 + READERS).await;
    assert_eq!(doc.holders().await.unwrap().len(), 2, "the readers queued");
    // The readers who were there leave one after the other; the writer goes first then.
    reader.release().await.unwrap();
    assert_eq!(doc.waiters().await.unwrap(), 1 + READERS);
    joined.release().await.unwrap();
    let writer = writer.await.unwrap();
    for r in stream {
        for fence in r.await.unwrap() {
            assert!(
                fence > writer,
                "a reader that came after the writer was granted before it"
            );
        }
    }
    assert_no_residue(h).await;
}

/// A waiter at the head that does not fit holds up those behind it; when it leaves, those
/// that now fit are granted at once, without waiting for a release.
pub async fn a_departed_exclusive_waiter_lets_the_shared_ones_behind_it_in(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let doc = engine.permits("departed", u32::MAX).fifo(true).ttl(u * 100);
    let reader = doc.acquire().await.unwrap();
    for timed_out in [false, true] {
        let writer = {
            let doc = doc.clone().exclusive();
            let doc = if timed_out { doc.wait(u * 3) } else { doc };
            tokio::spawn(async move { doc.acquire().await })
        };
        until_permit_waiters(&engine, "departed", 1).await;
        let behind = {
            let doc = doc.clone().wait(u * 50);
            tokio::spawn(async move { doc.acquire().await })
        };
        until_permit_waiters(&engine, "departed", 2).await;
        if timed_out {
            assert!(matches!(
                writer.await.unwrap(),
                Err(LockError::TimedOut { .. })
            ));
        } else {
            writer.abort();
            assert!(writer.await.unwrap_err().is_cancelled());
        }
        let behind = timeout(u * 20, behind)
            .await
            .expect("the reader behind the writer that left is granted beside the reader")
            .unwrap()
            .expect("granted");
        assert_eq!(doc.holders().await.unwrap().len(), 2);
        assert_eq!(doc.waiters().await.unwrap(), 0);
        behind.release().await.unwrap();
    }
    reader.release().await.unwrap();
    assert_no_residue(h).await;
}

/// Every grant's fence is above every earlier grant's on the key, shared or exclusive,
/// across re-entry (which keeps its fence) and expiry.
pub async fn permit_fences_strictly_increase_per_key(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let permits = engine.permits("fenced", 2);
    let mut last: Option<Fence> = None;
    for i in 0..10 {
        let p = if i % 3 == 0 {
            permits.clone().exclusive()
        } else {
            permits.clone()
        };
        let lease = p.acquire().await.unwrap();
        assert!(last.is_none_or(|l| lease.fence() > l), "fence went back");
        last = Some(lease.fence());
        lease.release().await.unwrap();
    }
    // Two holders at once get two fences, the later grant the higher.
    let a = permits.acquire().await.unwrap();
    let b = permits.acquire().await.unwrap();
    assert!(b.fence() > a.fence() && a.fence() > last.unwrap());
    // Re-entry with a held token keeps its fence.
    let again = permits
        .clone()
        .token(a.token().clone())
        .acquire()
        .await
        .unwrap();
    assert_eq!(again.fence(), a.fence());
    assert_eq!(permits.holders().await.unwrap().len(), 2);
    drop((a, b, again));
    // Across an expiry: the next holder's fence is above the stale holder's.
    let (_, stale) = crashed_holder(h, "fenced", 1, true, u * 2).await;
    let next = permits.clone().wait(u * 20).acquire().await.unwrap();
    assert!(next.fence() > stale.fence);
    next.release().await.unwrap();
    // Under contention, shared and exclusive: each task sees its fences rise, and no two
    // grants share one.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..6)
        .map(|t| {
            let (permits, seen) = (permits.clone(), seen.clone());
            tokio::spawn(async move {
                let mut last = None;
                for i in 0..8 {
                    let p = if (t + i) % 4 == 0 {
                        permits.clone().exclusive()
                    } else {
                        permits.clone()
                    };
                    let lease = p.acquire().await.unwrap();
                    assert!(last.is_none_or(|l| lease.fence() > l));
                    last = Some(lease.fence());
                    seen.lock().unwrap().push(lease.fence());
                    lease.release().await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let seen = seen.lock().unwrap().clone();
    let distinct: HashSet<Fence> = seen.iter().copied().collect();
    assert_eq!(distinct.len(), seen.len(), "two grants shared a fence");
    assert_no_residue(h).await;
}

/// A holder that crashed (never renews, never releases) holds its permit only until its TTL
/// runs out; a waiter is granted then, though nobody calls the backend in between.
pub async fn an_expired_permit_is_freed_for_a_waiter_on_time(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let permits = engine.permits("crashed", 2).ttl(u * 50);
    let alive = permits.acquire().await.unwrap();
    let (crashed, _) = crashed_holder(h, "crashed", 2, false, u * 3).await;
    let started = Instant::now();
    let waiter = permits
        .clone()
        .wait(u * 30)
        .acquire()
        .await
        .expect("granted when the crashed holder's TTL ran out");
    let waited = started.elapsed();
    assert!(
        waited < u * 15,
        "waited {waited:?} for a TTL of {:?}",
        u * 3
    );
    // The living holder kept its permit; the crashed one's went to the waiter.
    let holders = permits.holders().await.unwrap();
    let tokens: HashSet<&str> = holders.iter().map(|h| h.token.as_str()).collect();
    assert_eq!(
        tokens,
        HashSet::from([alive.token().as_str(), waiter.token().as_str()])
    );
    // The crashed holder's late release is reported, and changes nothing.
    let key = LockKey::new("crashed").unwrap();
    let backend = h.backend();
    assert!(matches!(
        permit_backend(&*backend)
            .release_permit(&key, &crashed)
            .await,
        Err(LockError::NotOwned)
    ));
    assert_eq!(permits.holders().await.unwrap().len(), 2);
    // An exclusive waiter, too, is granted once the last lease runs out.
    crashed_holder(h, "crashed-alone", 1, true, u * 3).await;
    let alone = engine
        .permits("crashed-alone", 1)
        .exclusive()
        .wait(u * 30)
        .acquire()
        .await
        .expect("granted when the crashed exclusive holder's TTL ran out");
    alone.release().await.unwrap();
    alive.release().await.unwrap();
    waiter.release().await.unwrap();
    assert_no_residue(h).await;
}

/// After a hand-off to a holder with a shorter lease than the ones a waiter first saw, the
/// waiter is granted when that shorter lease runs out, not when the first one would have.
pub async fn a_permit_waiter_follows_a_shorter_successor_lease(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let permits = engine.permits("successor", 1).fifo(true).auto_renew(false);
    let first = permits.clone().ttl(u * 60).acquire().await.unwrap();
    // The successor: a short lease it never renews nor releases.
    let successor = {
        let p = permits.clone().ttl(u * 2).wait(u * 60);
        tokio::spawn(async move { p.acquire().await })
    };
    until_permit_waiters(&engine, "successor", 1).await;
    let last = {
        let p = permits.clone().ttl(u * 3).wait(u * 30);
        tokio::spawn(async move { p.acquire().await })
    };
    until_permit_waiters(&engine, "successor", 2).await;
    first.release().await.unwrap();
    let successor = successor.await.unwrap().expect("the successor is next");
    let last = last
        .await
        .unwrap()
        .expect("granted once the successor's short lease ran out");
    assert!(last.fence() > successor.fence());
    assert!(
        last.waited() < u * 20,
        "waited {:?} for a lease of {:?}",
        last.waited(),
        u * 2
    );
    drop(successor);
    last.release().await.unwrap();
    assert_no_residue(h).await;
}

/// Aborted and timed-out waiters leave no waiter behind, and take no permit with them.
pub async fn dropped_permit_waiters_leave_nothing(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let permits = engine.permits("dropped", 1);
    let holder = permits.acquire().await.unwrap();
    let waiters: Vec<_> = (0..5)
        .map(|i| {
            let p = if i % 2 == 0 {
                permits.clone().exclusive()
            } else {
                permits.clone()
            };
            tokio::spawn(async move { p.acquire().await })
        })
        .collect();
    until_permit_waiters(&engine, "dropped", 5).await;
    for w in &waiters {
        w.abort();
    }
    for w in waiters {
        assert!(w.await.unwrap_err().is_cancelled());
    }
    until_permit_waiters(&engine, "dropped", 0).await;
    let timed_out = permits.clone().wait(u * 2).acquire().await;
    assert!(matches!(timed_out, Err(LockError::TimedOut { .. })));
    assert_eq!(permits.waiters().await.unwrap(), 0);
    holder.release().await.unwrap();
    // Free at once: no waiter that left was granted the permit.
    assert!(permits.holders().await.unwrap().is_empty());
    let next = permits.clone().exclusive().try_acquire().await.unwrap();
    next.release().await.unwrap();
    assert_no_residue(h).await;
}

/// A grant that reaches a waiter which is never polled again goes on to the next waiter
/// when the first one's future is dropped, not when its lease runs out.
pub async fn a_grant_to_a_dropped_permit_waiter_goes_on_to_the_next(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let permits = engine.permits("handed", 1).fifo(true);
    let holder = permits.acquire().await.unwrap();
    let first = permits.clone().ttl(u * 200).auto_renew(false);
    let mut first = tokio_test::task::spawn(async move { first.acquire().await });
    assert!(first.poll().is_pending(), "the permit is held: it waits");
    until_permit_waiters(&engine, "handed", 1).await;
    let next = {
        let p = permits.clone().wait(u * 30);
        tokio::spawn(async move { p.acquire().await })
    };
    until_permit_waiters(&engine, "handed", 2).await;
    holder.release().await.unwrap();
    // The first waiter is granted (or told), but never polled again; it is dropped.
    drop(first);
    let next = next
        .await
        .unwrap()
        .expect("the next waiter is granted well before the first one's TTL");
    let holders = permits.holders().await.unwrap();
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].token, *next.token());
    next.release().await.unwrap();
    assert_no_residue(h).await;
}

/// Waiting is bounded: no wait is `Busy`, a wait limit is `TimedOut`, a full queue is
/// `QueueFull`, each with a retry hint; queued waiters are served.
pub async fn permit_waits_are_busy_timed_out_or_queue_full(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let permits = engine.permits("bounded", 1).ttl(u * 50);
    let holder = permits.acquire().await.unwrap();
    match permits.try_acquire().await {
        Err(LockError::Busy {
            retry_after: Some(r),
        }) => assert!(r <= u * 50 && r > u * 25, "retry_after {r:?}"),
        other => panic!("expected Busy with retry_after, got {other:?}"),
    }
    let started = Instant::now();
    let err = permits.clone().wait(u * 2).acquire().await.unwrap_err();
    let waited = started.elapsed();
    assert!(matches!(err, LockError::TimedOut { .. }), "{err:?}");
    assert!(err.retry_after().is_some());
    assert!(waited >= u * 2, "timed out early: {waited:?}");
    let queued: Vec<_> = (0..2)
        .map(|_| {
            let p = permits.clone().max_waiters(2);
            tokio::spawn(async move { p.acquire().await?.release().await })
        })
        .collect();
    until_permit_waiters(&engine, "bounded", 2).await;
    let err = permits.clone().max_waiters(2).acquire().await.unwrap_err();
    assert!(
        matches!(
            err,
            LockError::QueueFull {
                retry_after: Some(_)
            }
        ),
        "{err:?}"
    );
    holder.release().await.unwrap();
    for q in queued {
        q.await.unwrap().expect("queued waiters are served");
    }
    assert_no_residue(h).await;
}

/// Release, extend and renew compare the token: a stranger's is `NotOwned` while someone
/// holds, anything after the last holder left is `Expired`; extend adds or replaces,
/// renewal reports per permit; the watchdog keeps a permit past its TTL and `lost()` fires
/// when it is gone; permits and the lock of one key are apart.
pub async fn permit_release_extend_and_renew_compare_the_token(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let backend = h.backend();
    let backend = permit_backend(&*backend);
    let key = LockKey::new("contract").unwrap();
    let permits = engine.permits("contract", 2).ttl(u * 10).auto_renew(false);
    let lease = permits.acquire().await.unwrap();
    let stranger = Token::random();
    assert!(matches!(
        backend.release_permit(&key, &stranger).await,
        Err(LockError::NotOwned)
    ));
    assert!(matches!(
        backend
            .extend_permit(&key, &stranger, u, ExtendMode::Add)
            .await,
        Err(LockError::NotOwned)
    ));
    assert!(
        lease.owned().await.unwrap(),
        "a refused call changed nothing"
    );
    // Extend adds, or replaces; the holder list shows it.
    let added = lease.extend(u * 10).await.unwrap();
    assert!(added > u * 15 && added <= u * 20, "{added:?}");
    let listed = permits.holders().await.unwrap()[0].ttl.unwrap();
    assert!(listed > u * 15 && listed <= u * 20, "{listed:?}");
    let replaced = lease.extend_to(u * 3).await.unwrap();
    assert!(replaced > u * 2 && replaced <= u * 3, "{replaced:?}");
    // A renewal resets the TTL of the permits whose tokens hold them, and only those.
    let other = LockKey::new("contract-other").unwrap();
    let renewed = backend
        .renew_permits(&[
            Renewal {
                key: key.clone(),
                token: lease.token().clone(),
                ttl: u * 10,
            },
            Renewal {
                key: key.clone(),
                token: stranger.clone(),
                ttl: u * 10,
            },
            Renewal {
                key: other.clone(),
                token: lease.token().clone(),
                ttl: u * 10,
            },
        ])
        .await
        .unwrap();
    assert_eq!(renewed, [true, false, false]);
    let listed = permits.holders().await.unwrap()[0].ttl.unwrap();
    assert!(listed > u * 5, "renewed to {listed:?}");
    // Permits and the lock of the same key do not exclude each other.
    let lock = engine.lock("contract").try_acquire().await.expect("apart");
    assert!(lease.owned().await.unwrap());
    lock.release().await.unwrap();
    // Re-entry with the held token refreshes the TTL and keeps the fence: one holding,
    // which either lease releases.
    lease.extend_to(u * 3).await.unwrap();
    let again = permits
        .clone()
        .ttl(u * 10)
        .token(lease.token().clone())
        .acquire()
        .await
        .unwrap();
    assert_eq!(again.fence(), lease.fence());
    let listed = permits.holders().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert!(listed[0].ttl.unwrap() > u * 5, "re-entry refreshed the TTL");
    let token = lease.token().clone();
    again.release().await.unwrap();
    assert!(matches!(lease.release().await, Err(LockError::Expired)));
    // Nobody holds now: every compare-token call reports it gone.
    assert!(matches!(
        backend.release_permit(&key, &token).await,
        Err(LockError::Expired)
    ));
    assert!(matches!(
        backend
            .extend_permit(&key, &token, u, ExtendMode::Replace)
            .await,
        Err(LockError::Expired)
    ));
    // Expired and nobody else took it: a late release is "already gone".
    let lapsed = permits.clone().ttl(u * 2).acquire().await.unwrap();
    sleep(u * 4).await;
    assert!(matches!(lapsed.release().await, Err(LockError::Expired)));
    // The watchdog keeps a permit past its TTL, and `lost()` fires when it is gone.
    let renewing = engine
        .permits("contract", 2)
        .ttl(u * 3)
        .acquire()
        .await
        .unwrap();
    sleep(u * 10).await;
    assert!(!renewing.is_lost());
    assert!(renewing.owned().await.unwrap(), "the watchdog renewed it");
    backend
        .release_permit(&key, renewing.token())
        .await
        .unwrap();
    timeout(u * 6, renewing.lost())
        .await
        .expect("lost() fires after the next renewal finds the permit gone");
    drop(renewing);
    assert_no_residue(h).await;
}
