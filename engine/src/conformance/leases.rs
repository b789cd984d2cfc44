//! Leases over time: the watchdog renews a live lease, `lost()` fires when it is gone or
//! its deadline passes unconfirmed, and dropping a lease releases it at once.

use std::time::Duration;

use tokio::time::{Instant, sleep, timeout};

use super::{Harness, assert_no_residue, in_mode};
use crate::{LockError, Mode};

pub async fn watchdog_keeps_lease_past_its_ttl(h: &impl Harness, mode: Mode) {
    let engine = in_mode(h, mode);
    let u = h.unit();
    let lease = engine.lock("renewed").ttl(u * 3).acquire().await.unwrap();
    sleep(u * 10).await;
    assert!(!lease.is_lost());
    assert!(
        lease.owned().await.unwrap(),
        "watchdog should have renewed the lease"
    );
    assert!(matches!(
        engine.lock("renewed").try_acquire().await,
        Err(LockError::Busy { .. })
    ));
    lease.release().await.unwrap();
    assert_no_residue(h).await;
}

pub async fn lost_fires_when_the_lease_is_gone(h: &impl Harness, mode: Mode) {
    let engine = in_mode(h, mode);
    let u = h.unit();
    let lease = engine.lock("lost").ttl(u * 3).acquire().await.unwrap();
    let signal = lease.lost_signal();
    assert!(!signal.is_lost());
    // Someone removes the key behind the holder's back.
    h.backend()
        .release(lease.key(), lease.token(), lease.mode())
        .await
        .unwrap();
    timeout(u * 6, lease.lost())
        .await
        .expect("lost() should fire after the next renewal");
    assert!(signal.is_lost());
    drop(lease);
    assert_no_residue(h).await;
}

pub async fn lost_fires_at_the_deadline_without_renewal(h: &impl Harness, mode: Mode) {
    let engine = in_mode(h, mode);
    let u = h.unit();
    let started = Instant::now();
    let lease = engine
        .lock("deadline")
        .ttl(u * 3)
        .auto_renew(false)
        .acquire()
        .await
        .unwrap();
    timeout(u * 6, lease.lost())
        .await
        .expect("lost() at the validity deadline");
    // Less the millisecond a server's clock may round a command's time down by.
    assert!(
        started.elapsed() >= u * 3 - Duration::from_millis(1),
        "lost before the TTL ran out"
    );
    drop(lease);
    assert_no_residue(h).await;
}

pub async fn drop_releases_without_waiting_for_the_ttl(h: &impl Harness, mode: Mode) {
    let engine = in_mode(h, mode);
    let u = h.unit();
    let lease = engine.lock("dropped").ttl(u * 100).acquire().await.unwrap();
    drop(lease);
    // Well within the TTL: only the release on drop can free it this soon.
    let next = engine
        .lock("dropped")
        .wait(u * 5)
        .acquire()
        .await
        .expect("released on drop");
    next.release().await.unwrap();
    assert_no_residue(h).await;
}
