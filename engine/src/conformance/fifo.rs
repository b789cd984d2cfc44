//! FIFO mode: grants follow arrival order, with no waiter overtaken.

use std::sync::{Arc, Mutex};

use crate::Mode;

use super::{Harness, assert_no_residue, in_mode, until_waiters};

pub async fn fifo_grants_in_arrival_order_with_zero_overtakes(h: &impl Harness, mode: Mode) {
    const WAITERS: usize = 8;
    let engine = in_mode(h, mode);
    for round in 0..3 {
        let key = format!("fifo-{round}");
        let holder = engine.lock(&key).fifo(true).acquire().await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..WAITERS {
            let (e, k, order) = (engine.clone(), key.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let lease = e.lock(&k).fifo(true).acquire().await.unwrap();
                order.lock().unwrap().push(i);
                lease.release().await.unwrap();
            }));
            // Arrival order is only defined once the waiter is queued.
            until_waiters(&engine, &key, i + 1).await;
        }
        holder.release().await.unwrap();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), (0..WAITERS).collect::<Vec<_>>());
    }
    assert_no_residue(h).await;
}

/// Waiters whose acquires are called one after another on one node, all at once (nothing
/// waited for between the calls but the call itself), are granted in that order: a node's
/// call order is the arrival order, whatever connections its calls take to the backend.
pub async fn fifo_waiters_called_in_order_are_granted_in_that_order(h: &impl Harness, mode: Mode) {
    use std::{future::Future, pin::Pin, task::Poll};

    const WAITERS: usize = 12;
    let engine = in_mode(h, mode);
    for round in 0..10 {
        let key = format!("fifo-called-{round}");
        let holder = engine.lock(&key).fifo(true).acquire().await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters: Vec<Pin<Box<dyn Future<Output = ()> + Send>>> = Vec::new();
        for i in 0..WAITERS {
            let (e, k, order) = (engine.clone(), key.clone(), order.clone());
            let mut waiter: Pin<Box<dyn Future<Output = ()> + Send>> = Box::pin(async move {
                let lease = e.lock(&k).fifo(true).acquire().await.unwrap();
                order.lock().unwrap().push(i);
                lease.release().await.unwrap();
            });
            // The call: polled once, here, before the next one is made.
            std::future::poll_fn(|cx| {
                let _ = waiter.as_mut().poll(cx);
                Poll::Ready(())
            })
            .await;
            waiters.push(waiter);
        }
        // From here on the runtime polls them (a waiter may still be on its way in).
        let waiters: Vec<_> = waiters.into_iter().map(tokio::spawn).collect();
        until_waiters(&engine, &key, WAITERS).await;
        holder.release().await.unwrap();
        for w in waiters {
            w.await.unwrap();
        }
        assert_eq!(
            *order.lock().unwrap(),
            (0..WAITERS).collect::<Vec<_>>(),
            "round {round}"
        );
    }
    assert_no_residue(h).await;
}

/// A FIFO waiter polled once and then put aside (its task busy elsewhere) does not hold
/// back this node's next caller of the key: that one queues at once, not after the
/// engine's bound (1 s) on waiting for the calls made before it.
pub async fn a_put_aside_fifo_waiter_does_not_hold_back_the_next(h: &impl Harness, mode: Mode) {
    use std::time::Duration;

    let engine = in_mode(h, mode);
    let lock = engine.lock("aside").fifo(true);
    let holder = lock.acquire().await.unwrap();
    let mut first = tokio_test::task::spawn({
        let lock = lock.clone();
        async move { lock.acquire().await }
    });
    assert!(first.poll().is_pending(), "the key is held: it waits");
    until_waiters(&engine, "aside", 1).await;
    let started = tokio::time::Instant::now();
    let next = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.acquire().await })
    };
    until_waiters(&engine, "aside", 2).await;
    let queued_after = started.elapsed();
    assert!(
        queued_after < Duration::from_millis(500),
        "the next caller queued after {queued_after:?}"
    );
    drop(first);
    holder.release().await.unwrap();
    next.await.unwrap().unwrap().release().await.unwrap();
    assert_no_residue(h).await;
}

/// FIFO across modes: waiters for the key's lock and for its shared leases (limits 1, 2
/// and 3) queued in one arrival order are granted in that order; the fence of each grant
/// tells the order in which the backend granted it.
pub async fn fifo_grants_follow_arrival_order_across_modes(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let modes = [
        Mode::Shared { limit: 2 },
        Mode::Exclusive,
        Mode::Shared { limit: 3 },
        Mode::Shared { limit: 2 },
        Mode::Shared { limit: 1 },
        Mode::Exclusive,
        Mode::Exclusive,
        Mode::Shared { limit: 3 },
        Mode::Shared { limit: 3 },
    ];
    let first = engine
        .lock("fifo-modes")
        .fifo(true)
        .acquire()
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for (i, &mode) in modes.iter().enumerate() {
        let lock = engine
            .lock("fifo-modes")
            .in_mode(mode)
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
        until_waiters(&engine, "fifo-modes", i + 1).await;
    }
    first.release().await.unwrap();
    let mut fences = Vec::new();
    for (i, t) in tasks.into_iter().enumerate() {
        fences.push((t.await.unwrap(), i));
    }
    fences.sort();
    let order: Vec<usize> = fences.iter().map(|(_, i)| *i).collect();
    assert_eq!(order, (0..modes.len()).collect::<Vec<_>>(), "grant order");
    assert_no_residue(h).await;
}
