//! The admin capability: a key's status, and a forced release that hands the key on.

use super::{Harness, assert_no_residue, until_waiters};
use crate::{LockError, LockStatus, Token};

pub async fn status_tells_free_locked_reserved_and_no_expiry(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let lock = engine.lock("status").ttl(u * 10);
    assert_eq!(lock.status().await.unwrap(), LockStatus::Free);
    let lease = lock.acquire().await.unwrap();
    match lock.status().await.unwrap() {
        LockStatus::Locked { owner, ttl } => {
            assert_eq!(&owner, lease.token());
            assert!(ttl <= u * 10 && ttl > u * 5, "{ttl:?}");
        }
        other => panic!("expected Locked, got {other:?}"),
    }
    lease.release().await.unwrap();
    let admin = engine.admin();
    let down = Token::new("maintenance").unwrap();
    admin.set("status", &down, Some(u * 100)).await.unwrap();
    assert!(
        matches!(lock.status().await.unwrap(), LockStatus::Reserved { owner, .. } if owner == down)
    );
    assert!(matches!(
        lock.try_acquire().await,
        Err(LockError::Busy { .. })
    ));
    admin.set("status", &down, None).await.unwrap();
    assert_eq!(
        lock.status().await.unwrap(),
        LockStatus::NoExpiry {
            owner: down.clone()
        }
    );
    let holder = lock.holder().await.unwrap().unwrap();
    assert_eq!((holder.token, holder.ttl), (down, None));
    assert!(admin.force_release("status").await.unwrap());
    assert!(!admin.force_release("status").await.unwrap());
    assert_eq!(lock.status().await.unwrap(), LockStatus::Free);
    assert_no_residue(h).await;
}

pub async fn admin_force_release_hands_the_key_to_the_next_waiter(h: &impl Harness) {
    let engine = h.engine();
    let stuck = engine.lock("forced").acquire().await.unwrap();
    let waiter = {
        let engine = engine.clone();
        tokio::spawn(async move { engine.lock("forced").acquire().await })
    };
    until_waiters(&engine, "forced", 1).await;
    assert!(engine.admin().force_release("forced").await.unwrap());
    let next = waiter
        .await
        .unwrap()
        .expect("waiter gets the key after a forced release");
    assert!(next.fence() > stuck.fence());
    assert!(matches!(stuck.release().await, Err(LockError::NotOwned)));
    next.release().await.unwrap();
    assert_no_residue(h).await;
}

/// An admin's force release tells the holder first: its lease reads lost before the
/// waiter (another node) is granted the key, and long before the holder's next renewal
/// (a third of a long TTL) would have told it.
pub async fn a_force_released_holder_reads_lost_before_its_waiter_is_granted(h: &impl Harness) {
    let (holder_node, waiter_node, admin) = (h.engine(), h.engine(), h.engine());
    let ttl = std::time::Duration::from_secs(60);
    for round in 0..5 {
        let key = format!("revoked-{round}");
        let held = holder_node.lock(&key).ttl(ttl).acquire().await.unwrap();
        let told = held.lost_signal();
        let waiter = {
            let (node, key) = (waiter_node.clone(), key.clone());
            tokio::spawn(async move {
                let lease = node.lock(&key).ttl(ttl).acquire().await;
                // Read the moment the grant is back: was the holder told before it?
                (lease, told.is_lost())
            })
        };
        until_waiters(&admin, &key, 1).await;
        let started = tokio::time::Instant::now();
        assert!(admin.admin().force_release(&key).await.unwrap());
        let (next, told_first) = waiter.await.unwrap();
        let next = next.expect("the waiter is granted the key");
        assert!(
            told_first,
            "round {round}: the holder read its lease lost before the waiter was granted"
        );
        assert!(held.is_lost(), "round {round}");
        assert!(next.fence() > held.fence(), "round {round}");
        assert!(
            started.elapsed() < ttl / 6,
            "round {round}: told by the release, not a renewal: {:?}",
            started.elapsed()
        );
        next.release().await.unwrap();
        drop(held);
    }
    // A holder no engine answers for (set by an admin, or its node gone): released all the
    // same, once its engine had its chance.
    let orphan = Token::new("a-node-gone").unwrap();
    admin
        .admin()
        .set("orphaned", &orphan, Some(ttl))
        .await
        .unwrap();
    let waiter = {
        let node = waiter_node.clone();
        tokio::spawn(async move { node.lock("orphaned").ttl(ttl).acquire().await })
    };
    until_waiters(&admin, "orphaned", 1).await;
    assert!(admin.admin().force_release("orphaned").await.unwrap());
    let next = waiter
        .await
        .unwrap()
        .expect("granted after the orphan's release");
    assert_ne!(next.token(), &orphan);
    next.release().await.unwrap();
    assert_no_residue(h).await;
}

/// What an operator reads as a key's last fence (`tower-lock-cli status`): at least every
/// fence granted for the key, held or released, and below the next grant's.
pub async fn the_last_fence_bounds_every_grant_and_the_next_exceeds_it(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let admin = engine.admin();
    let lock = engine.lock("last-fence").ttl(u * 100);
    let first = lock.acquire().await.unwrap();
    let held = admin.last_fence("last-fence").await.unwrap();
    assert!(
        held.is_some_and(|f| f >= first.fence()),
        "held: {held:?}, granted {:?}",
        first.fence()
    );
    let granted = first.fence();
    first.release().await.unwrap();
    let released = admin
        .last_fence("last-fence")
        .await
        .unwrap()
        .expect("a released key's fence is remembered");
    assert!(released >= granted, "{released:?} < {granted:?}");
    let next = lock.acquire().await.unwrap();
    assert!(
        next.fence() > released,
        "the next grant {:?} is above the last fence {released:?}",
        next.fence()
    );
    next.release().await.unwrap();
    assert_no_residue(h).await;
}
