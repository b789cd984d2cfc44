//! The in-process backend's optional capabilities: admin operations, numeric
//! compare-and-set and lock pools (records have a file of their own).

use std::time::Duration;

use tokio::time::Instant;

use super::MemoryBackend;
use crate::{
    AdminBackend, BoxFuture, Fence, LockError, LockKey, NumericAction, NumericBackend, NumericOp,
    PoolBackend, PoolHolders, PoolOp, Token, options::after,
};

impl AdminBackend for MemoryBackend {
    fn admin_set<'a>(
        &'a self,
        key: &'a LockKey,
        value: &'a Token,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(async move {
            let mut shard = self.keys.shard(key);
            let now = Instant::now();
            let fence = self.next_fence().get();
            let entry = shard.entry(key);
            entry.set_alone(value.clone(), ttl.map(|t| after(now, t)), fence);
            Ok(())
        })
    }

    fn last_fence<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<Fence>, LockError>> {
        let _ = key;
        // One counter for every key: its last value is at least the key's last fence.
        let last = self.fence.load(std::sync::atomic::Ordering::Relaxed);
        Box::pin(std::future::ready(Ok((last > 0).then(|| Fence::new(last)))))
    }

    fn force_release<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<bool, LockError>> {
        Box::pin(async move {
            let mut shard = self.keys.shard(key);
            let now = Instant::now();
            let Some(entry) = shard.get_mut(key) else {
                return Ok(false);
            };
            entry.expire(now, self);
            // Each holder is told first (its lease reads lost from here on), then the key
            // passes to the waiters: nobody holds it beside a holder not yet told.
            for holder in entry.holders(now) {
                self.resets.revoke(key, &holder.token);
            }
            let was_held = entry.clear(now, self);
            shard.remove_if_empty(key);
            Ok(was_held)
        })
    }
}

impl NumericBackend for MemoryBackend {
    fn compare_and_set<'a>(
        &'a self,
        key: &'a LockKey,
        op: &'a NumericOp,
    ) -> BoxFuture<'a, Result<bool, LockError>> {
        Box::pin(async move {
            let mut numbers = self.numbers.lock().unwrap();
            let now = Instant::now();
            let stored = numbers.get(key, now);
            let holds = stored.is_none_or(|s| op.compare.holds(op.value, s, op.epsilon));
            if holds {
                match op.action {
                    NumericAction::Set { ttl } => {
                        numbers.set(key, op.value, ttl.map(|t| after(now, t)));
                    }
                    NumericAction::Delete => numbers.remove(key),
                }
            }
            Ok(holds)
        })
    }

    fn numeric_get<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<f64>, LockError>> {
        Box::pin(async move { Ok(self.numbers.lock().unwrap().get(key, Instant::now())) })
    }
}

impl PoolBackend for MemoryBackend {
    fn pool_modify<'a>(
        &'a self,
        pool: &'a LockKey,
        op: &'a PoolOp,
    ) -> BoxFuture<'a, Result<usize, LockError>> {
        Box::pin(async move {
            let mut pools = self.pools.lock().unwrap();
            let members = pools.entry(pool.clone()).or_default();
            match op {
                PoolOp::Add(keys) => members.extend(keys.iter().cloned()),
                PoolOp::Remove(keys) => {
                    for k in keys {
                        members.remove(k);
                    }
                }
                PoolOp::Replace(keys) => *members = keys.iter().cloned().collect(),
                PoolOp::Clear => members.clear(),
            }
            let len = members.len();
            if len == 0 {
                pools.remove(pool);
            }
            Ok(len)
        })
    }

    fn pool_members<'a>(
        &'a self,
        pool: &'a LockKey,
    ) -> BoxFuture<'a, Result<Vec<LockKey>, LockError>> {
        Box::pin(async move { Ok(self.members(pool)) })
    }

    fn pool_holders<'a>(
        &'a self,
        pool: &'a LockKey,
    ) -> BoxFuture<'a, Result<PoolHolders, LockError>> {
        Box::pin(async move {
            Ok(self
                .members(pool)
                .into_iter()
                .map(|k| {
                    let h = self.holder_now(&k);
                    (k, h)
                })
                .collect())
        })
    }
}
