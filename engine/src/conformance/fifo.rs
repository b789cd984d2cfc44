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
