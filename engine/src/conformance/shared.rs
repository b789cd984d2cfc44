//! The shared-only behaviours (what the cases run in each mode cannot say): N holders at
//! once and no more; grants in arrival order across limits; no writer starvation; a
//! departed head lets those behind it in. (The same under load is in `shared_load`; the
//! key's lock among its shared leases in `cross_mode`.)

use std::{collections::HashSet, time::Duration};

use tokio::time::{Instant, timeout};

use super::{Harness, assert_no_residue, until_waiters};
use crate::{AcquireRequest, Fence, Grant, LockError, LockKey, Mode, Token};

/// A grant straight from the backend that nobody will renew or release: a holder that
/// crashed.
async fn crashed_holder(h: &impl Harness, key: &str, limit: u32, ttl: Duration) -> (Token, Grant) {
    let token = Token::random();
    let mut req = AcquireRequest::new(
        LockKey::new(key).unwrap(),
        Mode::Shared { limit },
        token.clone(),
        ttl,
    );
    // Leases dropped just before may still be on their way out.
    req.wait = Some(Duration::from_secs(10));
    req.fifo = true;
    let grant = h.backend().acquire(req).await.expect("a free lease");
    (token, grant)
}

/// N shared holders at once, each with its own rising fence; the next is busy, and so is
/// one asking to be alone; a release lets the next in; each request brings its own limit;
/// a holder whose lease ran out frees only its own place. A limit of zero is refused and
/// leaves nothing.
pub async fn n_shared_leases_are_held_at_once_and_no_more(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let tenant = engine.lock("tenant").shared(3).ttl(u * 10);
    let mut held: Vec<crate::Lease> = Vec::new();
    for _ in 0..3 {
        let lease = tenant.try_acquire().await.expect("one of three");
        // Holders at once get fences of their own, the later grant the higher.
        assert!(held.last().is_none_or(|l| lease.fence() > l.fence()));
        held.push(lease);
    }
    let holders = tenant.holders().await.unwrap();
    assert_eq!(holders.len(), 3);
    assert!(holders.iter().all(|h| !h.mode.is_alone()));
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
    // Re-entry with a held token keeps its fence, and is no new holder.
    let again = tenant
        .clone()
        .token(held[0].token().clone())
        .acquire()
        .await
        .unwrap();
    assert_eq!(again.fence(), held[0].fence());
    assert_eq!(tenant.holders().await.unwrap().len(), 3);
    // Held beside others, it is not made alone.
    assert!(matches!(
        engine
            .lock("tenant")
            .shared(1)
            .token(held[0].token().clone())
            .try_acquire()
            .await,
        Err(LockError::InvalidValue(_))
    ));
    // One holding, which either lease releases: the other then finds it gone (not its
    // own while the others hold).
    again.release().await.unwrap();
    let first = held.remove(0);
    assert!(matches!(first.release().await, Err(LockError::NotOwned)));
    held.push(tenant.try_acquire().await.expect("a place was given back"));
    match tenant.try_acquire().await {
        Err(LockError::Busy {
            retry_after: Some(r),
        }) => assert!(r <= u * 10, "retry_after {r:?}"),
        other => panic!("a fourth of three: {other:?}"),
    }
    assert!(matches!(
        engine.lock("tenant").shared(1).try_acquire().await,
        Err(LockError::Busy { .. })
    ));
    held.pop().unwrap().release().await.unwrap();
    held.push(tenant.try_acquire().await.expect("a place was given back"));
    // Each request brings its own limit: one of four is free for a caller allowing four.
    let fourth = engine
        .lock("tenant")
        .shared(4)
        .try_acquire()
        .await
        .expect("four allowed");
    assert_eq!(tenant.holders().await.unwrap().len(), 4);
    for lease in held {
        lease.release().await.unwrap();
    }
    fourth.release().await.unwrap();
    // A holder alone keeps out every shared one, whatever its limit.
    let writer = engine.lock("tenant").shared(1).try_acquire().await.unwrap();
    let holders = tenant.holders().await.unwrap();
    assert!(holders.len() == 1 && holders[0].mode.is_alone());
    // Held alone, asking again with any limit re-enters what it holds.
    let again = tenant
        .clone()
        .token(writer.token().clone())
        .try_acquire()
        .await
        .unwrap();
    assert_eq!(again.fence(), writer.fence());
    assert!(matches!(
        engine.lock("tenant").shared(u32::MAX).try_acquire().await,
        Err(LockError::Busy { .. })
    ));
    again.release().await.unwrap();
    assert!(matches!(writer.release().await, Err(LockError::Expired)));
    assert!(tenant.holders().await.unwrap().is_empty());
    // A crashed holder among two: its place goes to a waiter when its TTL runs out, and
    // the living holder keeps its own.
    let two = engine.lock("crashed").shared(2).ttl(u * 50);
    let alive = two.acquire().await.unwrap();
    let (crashed, _) = crashed_holder(h, "crashed", 2, u * 3).await;
    let started = Instant::now();
    let waiter = two
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
    let tokens: HashSet<String> = two
        .holders()
        .await
        .unwrap()
        .iter()
        .map(|h| h.token.as_str().to_owned())
        .collect();
    let expected = [alive.token(), waiter.token()].map(|t| t.as_str().to_owned());
    assert_eq!(tokens, HashSet::from(expected));
    // The crashed holder's late release is reported, and changes nothing.
    let key = LockKey::new("crashed").unwrap();
    assert!(matches!(
        h.backend()
            .release(&key, &crashed, Mode::Shared { limit: 2 })
            .await,
        Err(LockError::NotOwned)
    ));
    assert_eq!(two.holders().await.unwrap().len(), 2);
    alive.release().await.unwrap();
    waiter.release().await.unwrap();
    // A limit of zero admits nobody, and is an error rather than a wait.
    let zero = engine.lock("tenant").shared(0);
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

/// Waiters are granted in arrival order, limits 2 and 1 mixed: the fence of each grant
/// tells the order in which the backend granted it.
pub async fn shared_grants_follow_arrival_order_across_limits(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let alone = [false, false, true, false, true, true, false, false, false];
    let first = engine
        .lock("order")
        .shared(1)
        .fifo(true)
        .acquire()
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for (i, &alone) in alone.iter().enumerate() {
        let lock = engine
            .lock("order")
            .shared(if alone { 1 } else { 2 })
            .fifo(true)
            .ttl(u * 50)
            .wait(u * 100);
        tasks.push(tokio::spawn(async move {
            let lease = lock.acquire().await.expect("granted in turn");
            let fence = lease.fence();
            lease.release().await.unwrap();
            fence
        }));
        // Arrival order is defined once the waiter is queued.
        until_waiters(&engine, "order", i + 1).await;
    }
    first.release().await.unwrap();
    let mut fences: Vec<(Fence, usize)> = Vec::new();
    for (i, t) in tasks.into_iter().enumerate() {
        fences.push((t.await.unwrap(), i));
    }
    fences.sort();
    let order: Vec<usize> = fences.iter().map(|(_, i)| *i).collect();
    assert_eq!(order, (0..alone.len()).collect::<Vec<_>>(), "grant order");
    assert_no_residue(h).await;
}

/// Once a request to hold alone (a writer) waits, shared requests that arrive later queue
/// behind it, even though they would fit beside the shared holders: a steady stream of
/// readers never starves it.
pub async fn a_writer_is_not_starved_by_a_stream_of_readers(h: &impl Harness) {
    const READERS: usize = 6;
    const ROUNDS: usize = 5;
    let engine = h.engine();
    let u = h.unit();
    let doc = engine.lock("doc").shared(u32::MAX).fifo(true).ttl(u * 50);
    let reader = doc.acquire().await.unwrap();
    // A second reader joins at once: shared holders share.
    let joined = doc.try_acquire().await.expect("readers share");
    let writer = {
        let doc = doc.clone().shared(1).wait(u * 100);
        tokio::spawn(async move {
            let lease = doc.acquire().await.expect("the writer is granted");
            let fence = lease.fence();
            lease.release().await.unwrap();
            fence
        })
    };
    until_waiters(&engine, "doc", 1).await;
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
    until_waiters(&engine, "doc", 1 + READERS).await;
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

/// A writer at the head that does not fit holds up the readers behind it; when it leaves
/// (timed out, or its future dropped), those that now fit are granted at once, without
/// waiting for a release.
pub async fn a_departed_writer_lets_the_readers_behind_it_in(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let doc = engine
        .lock("departed")
        .shared(u32::MAX)
        .fifo(true)
        .ttl(u * 100);
    let reader = doc.acquire().await.unwrap();
    for timed_out in [false, true] {
        let writer = {
            let doc = doc.clone().shared(1);
            let doc = if timed_out { doc.wait(u * 3) } else { doc };
            tokio::spawn(async move { doc.acquire().await })
        };
        until_waiters(&engine, "departed", 1).await;
        let behind = {
            let doc = doc.clone().wait(u * 50);
            tokio::spawn(async move { doc.acquire().await })
        };
        until_waiters(&engine, "departed", 2).await;
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
