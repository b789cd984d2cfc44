//! Waiters: cancelled and timed-out waiters leave nothing behind, the waiter limit holds, a
//! stale waiter cannot harm the next holder, and a waiter follows a shorter successor
//! lease.

use std::time::Duration;

use tokio::time::sleep;

use super::{Harness, assert_no_residue, in_mode, until_waiters};
use crate::{LockError, Mode};

pub async fn cancelled_waiters_leave_no_residue(h: &impl Harness, mode: Mode) {
    for fifo in [false, true] {
        let engine = in_mode(h, mode);
        let holder = engine.lock("cancel").fifo(fifo).acquire().await.unwrap();
        let waiters: Vec<_> = (0..5)
            .map(|_| {
                let engine = engine.clone();
                tokio::spawn(async move { engine.lock("cancel").fifo(fifo).acquire().await })
            })
            .collect();
        until_waiters(&engine, "cancel", 5).await;
        for w in &waiters {
            w.abort();
        }
        for w in waiters {
            assert!(w.await.unwrap_err().is_cancelled());
        }
        until_waiters(&engine, "cancel", 0).await;
        holder.release().await.unwrap();
        // The key is free at once: no cancelled waiter was handed the lock.
        let next = engine
            .lock("cancel")
            .fifo(fifo)
            .try_acquire()
            .await
            .unwrap();
        next.release().await.unwrap();
        assert_no_residue(h).await;
    }
}

pub async fn timed_out_waiters_leave_no_residue(h: &impl Harness, mode: Mode) {
    let engine = in_mode(h, mode);
    let u = h.unit();
    let holder = engine.lock("waited").fifo(true).acquire().await.unwrap();
    let waiters: Vec<_> = (0..4)
        .map(|_| {
            let engine = engine.clone();
            tokio::spawn(
                async move { engine.lock("waited").fifo(true).wait(u * 2).acquire().await },
            )
        })
        .collect();
    for w in waiters {
        let waited = w.await.unwrap();
        assert!(
            matches!(waited, Err(LockError::TimedOut { .. })),
            "{waited:?}"
        );
    }
    assert_eq!(engine.lock("waited").waiters().await.unwrap(), 0);
    holder.release().await.unwrap();
    assert_no_residue(h).await;
}

pub async fn max_waiters_is_enforced(h: &impl Harness, mode: Mode) {
    let engine = in_mode(h, mode);
    let holder = engine.lock("bounded").acquire().await.unwrap();
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let engine = engine.clone();
            tokio::spawn(async move {
                let lease = engine.lock("bounded").max_waiters(2).acquire().await?;
                lease.release().await
            })
        })
        .collect();
    until_waiters(&engine, "bounded", 2).await;
    let err = engine
        .lock("bounded")
        .max_waiters(2)
        .acquire()
        .await
        .unwrap_err();
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
    for w in waiters {
        w.await.unwrap().expect("queued waiters are served");
    }
    assert_no_residue(h).await;
}

/// A waiter registers, is then left unpolled while the key passes it by (its grant runs
/// out, or an admin frees the key), another caller X takes the key, and only then is the
/// waiter's future dropped: X must still hold the key. (Every state change compares the
/// owner token, the clean-up of a dropped waiter included.)
pub async fn a_stale_waiter_dropped_late_leaves_the_next_holder_alone(
    h: &impl Harness,
    mode: Mode,
) {
    let u = h.unit();
    for forced in [false, true] {
        if forced && mode.is_shared() {
            // An admin frees a key's lock only: the shared run has the other variant.
            continue;
        }
        let engine = in_mode(h, mode);
        let first = engine.lock("stale").acquire().await.unwrap();
        let lock = engine.lock("stale").ttl(u).auto_renew(false);
        let mut waiter = tokio_test::task::spawn(async move { lock.acquire().await });
        assert!(
            waiter.poll().is_pending(),
            "the key is held: the waiter waits"
        );
        until_waiters(&engine, "stale", 1).await;
        first.release().await.unwrap();
        if forced {
            // Whoever holds it now (the unpolled waiter, on a hand-off backend) is thrown out;
            // a backend without admin operations runs the other variant only.
            if let Err(LockError::Unsupported(_)) = engine.admin().force_release("stale").await {
                drop(waiter);
                continue;
            }
        } else {
            // The waiter's grant (if it got one) runs out unseen.
            sleep(u * 3).await;
        }
        let x = engine
            .lock("stale")
            .wait(u * 20)
            .acquire()
            .await
            .expect("X takes the key the waiter never used");
        drop(waiter);
        assert!(
            x.owned().await.unwrap(),
            "dropping the stale waiter took X's key"
        );
        assert!(
            matches!(
                engine.lock("stale").try_acquire().await,
                Err(LockError::Busy { .. })
            ),
            "a third caller acquired while X holds the key (forced: {forced})"
        );
        x.release().await.unwrap();
        assert_no_residue(h).await;
    }
}

/// After a hand-off to a holder with a shorter lease than the one a waiter first saw, the
/// waiter gets the key when that shorter lease runs out, not when the first one would have.
pub async fn a_waiter_is_granted_when_a_shorter_successor_lease_expires(
    h: &impl Harness,
    mode: Mode,
) {
    let engine = in_mode(h, mode);
    let u = h.unit();
    let first = engine
        .lock("successor")
        .ttl(u * 60)
        .auto_renew(false)
        .acquire()
        .await
        .unwrap();
    let spawn_waiter = |ttl: Duration, wait: Duration| {
        let lock = engine
            .lock("successor")
            .fifo(true)
            .ttl(ttl)
            .wait(wait)
            .auto_renew(false);
        tokio::spawn(async move { lock.acquire().await })
    };
    // The successor: a short lease it never renews nor releases.
    let successor = spawn_waiter(u * 2, u * 60);
    until_waiters(&engine, "successor", 1).await;
    let last = spawn_waiter(u * 3, u * 30);
    until_waiters(&engine, "successor", 2).await;
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

/// A grant that reaches a waiter which is never polled again goes on to the next waiter
/// when the first one's future is dropped, not when its lease runs out.
pub async fn a_grant_to_a_dropped_waiter_goes_on_to_the_next(h: &impl Harness, mode: Mode) {
    let engine = in_mode(h, mode);
    let u = h.unit();
    let lock = engine.lock("handed").fifo(true);
    let holder = lock.acquire().await.unwrap();
    let first = lock.clone().ttl(u * 200).auto_renew(false);
    let mut first = tokio_test::task::spawn(async move { first.acquire().await });
    assert!(first.poll().is_pending(), "the key is held: it waits");
    until_waiters(&engine, "handed", 1).await;
    let next = {
        let lock = lock.clone().wait(u * 30);
        tokio::spawn(async move { lock.acquire().await })
    };
    until_waiters(&engine, "handed", 2).await;
    holder.release().await.unwrap();
    // The first waiter is granted (or told), but never polled again; it is dropped.
    drop(first);
    let next = next
        .await
        .unwrap()
        .expect("the next waiter is granted well before the first one's TTL");
    let holders = lock.holders().await.unwrap();
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].token, *next.token());
    next.release().await.unwrap();
    assert_no_residue(h).await;
}
