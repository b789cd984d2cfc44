//! The two modes on one key: one space and one queue. A request to hold alone (the key's
//! lock, or a shared lease with a limit of 1) excludes every other holder of the key, and
//! shared holders share up to their limit, never beside a lone one; one arrival order
//! across modes; fences rise across both.
//!
//! Status is judged at the seam ([`Backend::holders`](crate::Backend::holders) lists every
//! holder with its mode, [`Backend::waiters`](crate::Backend::waiters) counts the one
//! queue), so these cases judge the backend alone.

use std::time::Duration;

use tokio::task::JoinHandle;

use super::{Harness, assert_no_residue, until_waiters};
use crate::{Lease, Lock, LockError, LockKey, Mode, Renewal, Token};

/// The modes of `key`'s holders as the backend lists them, sorted by token.
async fn holder_modes(h: &impl Harness, key: &str) -> Vec<(String, Mode)> {
    let key = LockKey::new(key).unwrap();
    let mut modes: Vec<(String, Mode)> = h
        .backend()
        .holders(&key)
        .await
        .unwrap()
        .into_iter()
        .map(|h| (h.token.as_str().to_owned(), h.mode))
        .collect();
    modes.sort_by(|a, b| a.0.cmp(&b.0));
    modes
}

async fn waiting(h: &impl Harness, key: &str) -> usize {
    h.backend()
        .waiters(&LockKey::new(key).unwrap())
        .await
        .unwrap()
}

fn busy(result: Result<Lease, LockError>, what: &str) {
    match result {
        Err(LockError::Busy { .. }) => {}
        other => panic!("{what}: expected Busy, got {other:?}"),
    }
}

/// An acquire on its own task: it waits there, and hands back its lease.
fn waiter(lock: &Lock) -> JoinHandle<Result<Lease, LockError>> {
    let lock = lock.clone();
    tokio::spawn(async move { lock.acquire().await })
}

/// A lock is refused (and waits) while shared leases of its key are held, and a shared
/// lease of any limit is refused (and waits) while the lock is held; a shared lease with a
/// limit of 1 and the lock exclude each other too. The backend lists every holder with its
/// mode and counts both modes' waiters in one queue.
pub async fn a_keys_lock_and_its_shared_leases_exclude_each_other(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let lock = engine.lock("both").ttl(u * 20).wait(u * 50);
    let readers = engine.lock("both").shared(3).ttl(u * 20).wait(u * 50);
    let (r1, r2) = (
        readers.try_acquire().await.unwrap(),
        readers.try_acquire().await.unwrap(),
    );
    busy(lock.try_acquire().await, "a lock beside two shared leases");
    let modes = holder_modes(h, "both").await;
    assert_eq!(modes.len(), 2, "{modes:?}");
    assert!(modes.iter().all(|(_, m)| m.is_shared() && !m.is_alone()));
    assert_eq!(waiting(h, "both").await, 0);
    // Waiting, the lock is counted among the key's waiters, and keeps newcomers out.
    let writer = waiter(&lock);
    until_waiters(&engine, "both", 1).await;
    busy(
        readers.try_acquire().await,
        "a shared lease past a waiting lock",
    );
    r1.release().await.unwrap();
    assert_eq!(waiting(h, "both").await, 1, "one shared holder is left");
    r2.release().await.unwrap();
    let writer = writer
        .await
        .unwrap()
        .expect("granted once the readers left");
    assert_eq!(writer.mode(), Mode::Exclusive);
    assert_eq!(
        holder_modes(h, "both").await,
        [(writer.token().as_str().to_owned(), Mode::Exclusive)]
    );
    // Held, the lock keeps out shared leases of every limit.
    for limit in [1, 2, 3, u32::MAX] {
        busy(
            engine.lock("both").shared(limit).try_acquire().await,
            &format!("shared({limit}) beside the lock"),
        );
    }
    busy(lock.try_acquire().await, "a second lock");
    let reader = waiter(&readers);
    until_waiters(&engine, "both", 1).await;
    writer.release().await.unwrap();
    let reader = reader
        .await
        .unwrap()
        .expect("granted at the lock's release");
    let modes = holder_modes(h, "both").await;
    assert_eq!(modes.len(), 1);
    assert!(modes[0].1.is_shared() && !modes[0].1.is_alone());
    reader.release().await.unwrap();
    // A shared lease held alone (a limit of 1) and the lock exclude each other too.
    let alone = engine.lock("both").shared(1).try_acquire().await.unwrap();
    busy(lock.try_acquire().await, "a lock beside shared(1)");
    alone.release().await.unwrap();
    let held = lock.try_acquire().await.unwrap();
    busy(
        engine.lock("both").shared(1).try_acquire().await,
        "shared(1) beside the lock",
    );
    // One renewal batch covers both modes, each lease in the mode it holds.
    let other = engine
        .lock("both-other")
        .shared(2)
        .ttl(u * 20)
        .try_acquire()
        .await
        .unwrap();
    let renewal = |key: &str, mode, token: &Token| Renewal {
        key: LockKey::new(key).unwrap(),
        mode,
        token: token.clone(),
        ttl: u * 30,
    };
    let renewed = h
        .backend()
        .renew(&[
            renewal("both", Mode::Exclusive, held.token()),
            renewal("both-other", Mode::Shared { limit: 2 }, other.token()),
            renewal("both", Mode::Exclusive, &Token::random()),
        ])
        .await
        .unwrap();
    assert_eq!(renewed, [true, true, false]);
    held.release().await.unwrap();
    other.release().await.unwrap();
    assert_no_residue(h).await;
}

/// Readers hold, a lock waits for them, and a reader that arrives later queues behind the
/// lock though it would fit beside the readers: the lock is granted first, then the reader
/// (FIFO or not).
pub async fn a_lone_waiter_is_not_overtaken_by_later_shared_arrivals(h: &impl Harness) {
    for fifo in [true, false] {
        let engine = h.engine();
        let u = h.unit();
        let key = format!("overtake-{fifo}");
        let readers = engine.lock(&key).shared(3).fifo(fifo).ttl(u * 50);
        let lock = engine.lock(&key).fifo(fifo).ttl(u * 50).wait(u * 100);
        let held = [
            readers.try_acquire().await.unwrap(),
            readers.try_acquire().await.unwrap(),
        ];
        let writer = waiter(&lock);
        until_waiters(&engine, &key, 1).await;
        busy(
            readers.try_acquire().await,
            "a reader arriving after a waiting lock",
        );
        let late = waiter(&readers.clone().wait(u * 100));
        until_waiters(&engine, &key, 2).await;
        for lease in held {
            lease.release().await.unwrap();
        }
        let writer = writer.await.unwrap().expect("the lock is granted first");
        // The late reader still waits: the lock holds alone.
        assert_eq!(waiting(h, &key).await, 1);
        assert_eq!(
            holder_modes(h, &key).await,
            [(writer.token().as_str().to_owned(), Mode::Exclusive)]
        );
        let writer_fence = writer.fence();
        writer.release().await.unwrap();
        let late = late.await.unwrap().expect("then the reader");
        assert!(late.fence() > writer_fence, "grant order: lock, reader");
        late.release().await.unwrap();
    }
    assert_no_residue(h).await;
}

/// Shared waiters queued behind a held lock are all granted at its release (as many as
/// fit), at once; a lock queued behind them waits for all of them.
pub async fn shared_waiters_behind_a_lock_are_granted_together_at_its_release(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let lock = engine.lock("together").fifo(true).ttl(u * 50).wait(u * 100);
    let first = lock.try_acquire().await.unwrap();
    let readers = engine
        .lock("together")
        .shared(3)
        .fifo(true)
        .ttl(u * 50)
        .wait(u * 100);
    let waiting_readers: Vec<_> = (0..3).map(|_| waiter(&readers)).collect();
    until_waiters(&engine, "together", 3).await;
    let second = waiter(&lock);
    until_waiters(&engine, "together", 4).await;
    let first_fence = first.fence();
    first.release().await.unwrap();
    // One release grants the three: nobody else releases until all are in.
    let mut held = Vec::new();
    for w in waiting_readers {
        held.push(w.await.unwrap().expect("granted at the lock's release"));
    }
    assert_eq!(holder_modes(h, "together").await.len(), 3);
    assert_eq!(waiting(h, "together").await, 1, "the second lock waits");
    for lease in &held {
        assert!(lease.fence() > first_fence);
    }
    let last_reader = held.iter().map(|l| l.fence()).max().unwrap();
    for lease in held {
        lease.release().await.unwrap();
    }
    let second = second.await.unwrap().expect("granted after the readers");
    assert!(second.fence() > last_reader);
    second.release().await.unwrap();
    assert_no_residue(h).await;
}

/// Every grant of a key gets a fence above every earlier grant's, whatever mode each is
/// in: alternating, at a hand-off, and across an expiry.
pub async fn fences_rise_across_both_modes(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let modes = [
        Mode::Exclusive,
        Mode::Shared { limit: 2 },
        Mode::Shared { limit: 1 },
        Mode::Exclusive,
        Mode::Shared { limit: u32::MAX },
        Mode::Exclusive,
    ];
    let mut last = None;
    for mode in modes {
        let lease = engine
            .lock("fences")
            .in_mode(mode)
            .try_acquire()
            .await
            .unwrap();
        assert!(last.is_none_or(|l| lease.fence() > l), "{mode:?}");
        last = Some(lease.fence());
        lease.release().await.unwrap();
    }
    // Two shared holders, then a lock handed over at their release.
    let readers = engine.lock("fences").shared(2).ttl(u * 50);
    let (a, b) = (
        readers.try_acquire().await.unwrap(),
        readers.try_acquire().await.unwrap(),
    );
    assert!(a.fence() > last.unwrap() && b.fence() > a.fence());
    let writer = waiter(&engine.lock("fences").ttl(u * 50).wait(u * 100));
    until_waiters(&engine, "fences", 1).await;
    let b_fence = b.fence();
    a.release().await.unwrap();
    b.release().await.unwrap();
    let writer = writer.await.unwrap().unwrap();
    assert!(writer.fence() > b_fence);
    // A lock whose lease ran out, then a shared lease.
    drop(writer.release().await);
    let stale = engine
        .lock("fences")
        .ttl(u * 2)
        .auto_renew(false)
        .try_acquire()
        .await
        .unwrap();
    tokio::time::sleep(u * 4).await;
    let next = readers.try_acquire().await.unwrap();
    assert!(next.fence() > stale.fence());
    next.release().await.unwrap();
    drop(stale);
    // And back: a shared lease whose lease ran out, then a lock.
    let stale = readers
        .clone()
        .ttl(u * 2)
        .auto_renew(false)
        .try_acquire()
        .await
        .unwrap();
    tokio::time::sleep(u * 4).await;
    let next = engine
        .lock("fences")
        .wait(Duration::ZERO)
        .acquire()
        .await
        .unwrap();
    assert!(next.fence() > stale.fence());
    next.release().await.unwrap();
    drop(stale);
    assert_no_residue(h).await;
}
