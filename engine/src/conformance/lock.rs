//! The core lock operations: try, acquire with a wait limit, release, extend, re-entry by
//! token, expiry, key validation, inspection, and durations out of range.

use std::time::Duration;

use tokio::time::{Instant, sleep};

use super::{Harness, assert_no_residue, in_mode, remaining, until_waiters};
use crate::{ExtendMode, LockError, LockKey, Mode, Token};

pub async fn try_acquire_under_contention_is_busy_with_retry_after(h: &impl Harness, mode: Mode) {
    let engine = in_mode(h, mode);
    let ttl = h.unit() * 10;
    let lease = engine.lock("busy").ttl(ttl).acquire().await.unwrap();
    match engine.lock("busy").try_acquire().await {
        Err(LockError::Busy {
            retry_after: Some(r),
        }) => {
            assert!(
                r <= ttl && r > ttl / 2,
                "retry_after {r:?} for a TTL of {ttl:?}"
            )
        }
        other => panic!("expected Busy with retry_after, got {other:?}"),
    }
    lease.release().await.unwrap();
    let again = engine
        .lock("busy")
        .try_acquire()
        .await
        .expect("free after release");
    again.release().await.unwrap();
    assert_no_residue(h).await;
}

pub async fn only_one_of_simultaneous_tries_wins(h: &impl Harness, mode: Mode) {
    let engine = in_mode(h, mode);
    for round in 0..5 {
        let key = format!("race-{round}");
        let tries = (0..16).map(|_| {
            let engine = engine.clone();
            let key = key.clone();
            tokio::spawn(async move { engine.lock(&key).try_acquire().await })
        });
        let mut won = Vec::new();
        for t in tries.collect::<Vec<_>>() {
            match t.await.unwrap() {
                Ok(lease) => won.push(lease),
                Err(LockError::Busy { .. }) => {}
                Err(e) => panic!("unexpected {e:?}"),
            }
        }
        assert_eq!(won.len(), 1, "exactly one simultaneous try must win");
        won.pop().unwrap().release().await.unwrap();
    }
    assert_no_residue(h).await;
}

pub async fn acquire_times_out_after_wait_limit(h: &impl Harness, mode: Mode) {
    let engine = in_mode(h, mode);
    let u = h.unit();
    let lease = engine.lock("timeout").ttl(u * 50).acquire().await.unwrap();
    let started = Instant::now();
    let err = engine
        .lock("timeout")
        .wait(u * 2)
        .acquire()
        .await
        .unwrap_err();
    let waited = started.elapsed();
    assert!(matches!(err, LockError::TimedOut { .. }), "{err:?}");
    assert!(err.retry_after().is_some());
    assert!(
        waited >= u * 2 && waited < u * 2 + Duration::from_secs(1),
        "waited {waited:?}"
    );
    lease.release().await.unwrap();
    assert_no_residue(h).await;
}

pub async fn release_by_non_owner_is_refused(h: &impl Harness, mode: Mode) {
    let engine = in_mode(h, mode);
    let lease = engine.lock("owner").acquire().await.unwrap();
    let key = LockKey::new("owner").unwrap();
    let err = h
        .backend()
        .release(&key, &Token::random(), mode)
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::NotOwned), "{err:?}");
    let err = h
        .backend()
        .extend(&key, &Token::random(), mode, h.unit(), ExtendMode::Add)
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::NotOwned), "{err:?}");
    assert!(
        lease.owned().await.unwrap(),
        "a refused release or extend must not change the holder"
    );
    lease.release().await.unwrap();
    assert_no_residue(h).await;
}

pub async fn late_release_after_expiry_is_reported_and_not_applied(h: &impl Harness, mode: Mode) {
    let engine = in_mode(h, mode);
    let u = h.unit();
    // Expired and nobody else took it: "already gone".
    let a = engine
        .lock("late")
        .ttl(u * 2)
        .auto_renew(false)
        .acquire()
        .await
        .unwrap();
    sleep(u * 4).await;
    assert!(matches!(a.release().await, Err(LockError::Expired)));
    // Expired and someone else holds it now: refused, and the new holder keeps it.
    let a = engine
        .lock("late")
        .ttl(u * 2)
        .auto_renew(false)
        .acquire()
        .await
        .unwrap();
    sleep(u * 4).await;
    let b = engine.lock("late").ttl(u * 50).try_acquire().await.unwrap();
    assert!(matches!(a.release().await, Err(LockError::NotOwned)));
    assert!(b.owned().await.unwrap());
    b.release().await.unwrap();
    assert_no_residue(h).await;
}

pub async fn extend_adds_or_replaces_and_reacquire_resets(h: &impl Harness, mode: Mode) {
    let engine = in_mode(h, mode);
    let u = h.unit();
    let lease = engine
        .lock("extend")
        .ttl(u * 10)
        .auto_renew(false)
        .acquire()
        .await
        .unwrap();
    let after_add = lease.extend(u * 10).await.unwrap();
    assert!(after_add > u * 15 && after_add <= u * 20, "{after_add:?}");
    let held = remaining(&engine, "extend").await;
    assert!(held > u * 15 && held <= u * 20, "{held:?}");
    let after_replace = lease.extend_to(u * 3).await.unwrap();
    assert!(
        after_replace <= u * 3 && after_replace > u * 2,
        "{after_replace:?}"
    );
    assert!(remaining(&engine, "extend").await <= u * 3);
    let after_reacquire = lease.reacquire().await.unwrap();
    assert!(
        after_reacquire <= u * 10 && after_reacquire > u * 9,
        "{after_reacquire:?}"
    );
    lease.release().await.unwrap();
    // Extending a lease that is gone is refused.
    let gone = engine
        .lock("extend")
        .ttl(u * 2)
        .auto_renew(false)
        .acquire()
        .await
        .unwrap();
    sleep(u * 4).await;
    assert!(matches!(gone.extend(u).await, Err(LockError::Expired)));
    assert!(matches!(gone.reacquire().await, Err(LockError::Expired)));
    drop(gone);
    assert_no_residue(h).await;
}

pub async fn same_token_reenters_and_refreshes(h: &impl Harness, mode: Mode) {
    let engine = in_mode(h, mode);
    let u = h.unit();
    let me = Token::new("worker-1").unwrap();
    let first = engine
        .lock("reentrant")
        .token(me.clone())
        .ttl(u * 10)
        .acquire()
        .await
        .unwrap();
    sleep(u * 5).await;
    let second = engine
        .lock("reentrant")
        .token(me.clone())
        .ttl(u * 10)
        .try_acquire()
        .await
        .unwrap();
    assert_eq!(
        first.fence(),
        second.fence(),
        "re-entry is the same acquisition"
    );
    assert!(
        remaining(&engine, "reentrant").await > u * 9,
        "re-entry refreshes the TTL"
    );
    let other = Token::new("worker-2").unwrap();
    assert!(matches!(
        engine.lock("reentrant").token(other).try_acquire().await,
        Err(LockError::Busy { .. })
    ));
    second.release().await.unwrap();
    assert!(matches!(first.release().await, Err(LockError::Expired)));
    assert_no_residue(h).await;
}

pub async fn expired_holder_is_replaced_by_a_waiter(h: &impl Harness, mode: Mode) {
    let engine = in_mode(h, mode);
    let u = h.unit();
    let stale = engine
        .lock("expiry")
        .ttl(u * 3)
        .auto_renew(false)
        .acquire()
        .await
        .unwrap();
    let started = Instant::now();
    let next = engine
        .lock("expiry")
        .wait(u * 30)
        .acquire()
        .await
        .expect("granted at expiry");
    let waited = started.elapsed();
    assert!(
        waited >= u * 2 && waited < u * 3 + Duration::from_secs(1),
        "waited {waited:?}"
    );
    assert!(next.fence() > stale.fence());
    next.release().await.unwrap();
    drop(stale);
    assert_no_residue(h).await;
}

pub async fn invalid_keys_are_refused(h: &impl Harness, mode: Mode) {
    let engine = in_mode(h, mode);
    for bad in [String::new(), "x".repeat(10_000), "a\nb".to_string()] {
        let err = engine.lock(&bad).try_acquire().await.unwrap_err();
        assert!(matches!(err, LockError::InvalidKey(_)), "{bad:?}: {err:?}");
    }
    // Characters with meaning to Redis, to SQL's quoting or to the engine's own layout are
    // just data.
    let tricky = [
        "{tag}",
        "a:b:c",
        "}{",
        "*",
        "lock:queue",
        "\u{e9}t\u{e9}",
        "a'b",
        "a\\'b",
        "$l$",
        "x$l$'); --",
        "$",
        "$$",
    ];
    let leases: Vec<_> = {
        let mut v = Vec::new();
        for k in tricky {
            v.push(engine.lock(k).try_acquire().await.expect(k));
        }
        v
    };
    for (k, lease) in tricky.iter().zip(&leases) {
        assert_eq!(lease.key().as_str(), *k);
        assert!(engine.lock(k).locked().await.unwrap());
    }
    for free in ["{tag", "$l", "x", "a\\b", "ab"] {
        assert!(!engine.lock(free).locked().await.unwrap(), "{free}");
    }
    for lease in leases {
        lease.release().await.unwrap();
    }
    assert_no_residue(h).await;
}

pub async fn locked_and_owned_report_state(h: &impl Harness, mode: Mode) {
    let engine = in_mode(h, mode);
    assert!(!engine.lock("state").locked().await.unwrap());
    let lease = engine.lock("state").acquire().await.unwrap();
    assert!(engine.lock("state").locked().await.unwrap());
    assert!(lease.owned().await.unwrap());
    let holder = engine.lock("state").holder().await.unwrap().unwrap();
    assert_eq!(&holder.token, lease.token());
    lease.release().await.unwrap();
    assert!(!engine.lock("state").locked().await.unwrap());
    assert_no_residue(h).await;
}

/// Durations too long for the clock never panic: an unbounded wait is no limit, a TTL
/// or extension past the engine's maximum is refused with a typed error.
pub async fn huge_durations_never_panic(h: &impl Harness, mode: Mode) {
    let engine = in_mode(h, mode);
    let holder = engine.lock("huge").acquire().await.unwrap();
    let waiter = {
        let lock = engine.lock("huge").wait(Duration::MAX);
        tokio::spawn(async move { lock.acquire().await })
    };
    until_waiters(&engine, "huge", 1).await;
    holder.release().await.unwrap();
    let lease = waiter
        .await
        .expect("a wait of Duration::MAX does not panic")
        .expect("and is a wait without limit");
    for result in [
        lease.extend(Duration::MAX).await,
        lease.extend_to(Duration::MAX).await,
    ] {
        assert!(
            matches!(result, Err(LockError::InvalidValue(_))),
            "extend past the maximum TTL: {result:?}"
        );
    }
    assert!(lease.owned().await.unwrap());
    lease.release().await.unwrap();
    for ttl in [Duration::MAX, Duration::from_secs(u64::MAX / 4)] {
        let result = engine.lock("huge-ttl").ttl(ttl).acquire().await;
        assert!(
            matches!(result, Err(LockError::InvalidValue(_))),
            "a TTL of {ttl:?}: {result:?}"
        );
    }
    assert_no_residue(h).await;
}
