//! The Redis backend's optional capabilities: admin operations, numeric compare-and-set
//! and lock pools.

use crate::runtime::with_drivers;
use std::time::Duration;

use super::{
    FENCE_MARGIN, RedisBackend,
    commands::ScriptCall,
    malformed_member, malformed_token, millis,
    names::object_name,
    remaining,
    scripts::{
        ADMIN_SET, COMPARE_AND_SET, FORCE_RELEASE, NUMERIC_GET, POOL_HOLDERS, POOL_MEMBERS,
        POOL_MODIFY, REVOKE,
    },
};
use crate::{
    AdminBackend, BoxFuture, Fence, Holder, LockError, LockKey, NumericAction, NumericBackend,
    NumericOp, PoolBackend, PoolHolders, PoolOp, Token,
};
use crate::{BackendError, BackendErrorKind};

impl AdminBackend for RedisBackend {
    fn admin_set<'a>(
        &'a self,
        key: &'a LockKey,
        value: &'a Token,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        with_drivers(Box::pin(async move {
            let names = self.inner.names(key);
            let mut inv = ScriptCall::new(&ADMIN_SET, 3);
            inv.key(names.lock())
                .key(names.fence())
                .key(names.holders())
                .arg(value.as_str())
                .arg(ttl.map_or(-1, |t| i64::try_from(millis(t)).unwrap_or(i64::MAX)));
            let _fence: String = self.inner.call("admin set", &inv).await?;
            Ok(())
        }))
    }

    fn last_fence<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<Fence>, LockError>> {
        with_drivers(Box::pin(async move {
            // The lock's value and the fence tombstone (one hash slot) both begin with a
            // fence: a holder's, or the last release's (or a hand-off's, `<fence>@<ms>`).
            let names = self.inner.names(key);
            let mut cmd = redis::cmd("MGET");
            cmd.arg(names.lock()).arg(names.fence());
            let values: Vec<Option<String>> = self
                .inner
                .commands
                .query("last fence", &cmd)
                .await
                .map_err(LockError::Backend)?;
            Ok(values
                .iter()
                .flatten()
                .filter_map(|v| {
                    let digits = v.bytes().take_while(u8::is_ascii_digit).count();
                    v[..digits].parse().ok()
                })
                .max()
                .map(Fence::new))
        }))
    }

    /// The holders first (see `revocation`): each holder's engine reads its lease lost,
    /// then gives the key back, which hands it to the next waiter; what is still held after
    /// `GIVE_BACK` (1 s) is released here, holder by holder.
    fn force_release<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<bool, LockError>> {
        with_drivers(Box::pin(async move {
            let names = self.inner.names(key);
            let mut inv = ScriptCall::new(&REVOKE, 2);
            inv.key(names.lock())
                .key(names.holders())
                .arg(super::revocation::channel(&self.inner.prefix))
                .arg(key.as_str());
            let revoked: Vec<String> = self.inner.call("revoke", &inv).await?;
            let Some((told, tokens)) = revoked.split_first() else {
                return Ok(false);
            };
            if tokens.is_empty() {
                return Ok(false);
            }
            if told.as_str() != "0" {
                // Polled: an admin's call, rare, and the holders' engines answer within a
                // round trip or two when they are there at all.
                let give_up = tokio::time::Instant::now() + super::revocation::GIVE_BACK;
                loop {
                    let holders = crate::Backend::holders(self, key).await?;
                    if !holders
                        .iter()
                        .any(|h| tokens.iter().any(|t| t == h.token.as_str()))
                    {
                        return Ok(true);
                    }
                    if tokio::time::Instant::now() >= give_up {
                        break;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
            }
            for token in tokens {
                let mut inv = ScriptCall::new(&FORCE_RELEASE, 5);
                inv.key(names.lock())
                    .key(names.fence())
                    .key(names.queue())
                    .key(names.tickets())
                    .key(names.holders())
                    .arg(names.channel())
                    .arg(millis(FENCE_MARGIN))
                    .arg(token.as_str());
                let _released: i64 = self.inner.call("force release", &inv).await?;
            }
            Ok(true)
        }))
    }
}

impl NumericBackend for RedisBackend {
    fn compare_and_set<'a>(
        &'a self,
        key: &'a LockKey,
        op: &'a NumericOp,
    ) -> BoxFuture<'a, Result<bool, LockError>> {
        with_drivers(Box::pin(async move {
            let name = object_name(&self.inner.prefix, "num", key);
            let (action, ttl) = match op.action {
                NumericAction::Set { ttl } => (
                    "set",
                    ttl.map_or(-1, |t| i64::try_from(millis(t)).unwrap_or(i64::MAX)),
                ),
                NumericAction::Delete => ("del", -1),
            };
            let mut inv = ScriptCall::new(&COMPARE_AND_SET, 1);
            // `{:e}` is the shortest text that reads back as the same f64, in Lua and Rust.
            inv.key(&name)
                .arg(op.compare.as_str())
                .arg(format!("{:e}", op.value))
                .arg(format!("{:e}", op.epsilon))
                .arg(action)
                .arg(ttl);
            let applied: i64 = self.inner.call("compare and set", &inv).await?;
            Ok(applied == 1)
        }))
    }

    fn numeric_get<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<f64>, LockError>> {
        with_drivers(Box::pin(async move {
            let name = object_name(&self.inner.prefix, "num", key);
            let mut inv = ScriptCall::new(&NUMERIC_GET, 1);
            inv.key(&name);
            let text: Option<String> = self.inner.call("numeric get", &inv).await?;
            text.map(|t| {
                t.parse::<f64>().map_err(|e| {
                    LockError::Backend(
                        BackendError::new(
                            BackendErrorKind::Protocol,
                            "stored value is not a number",
                        )
                        .with_source(e),
                    )
                })
            })
            .transpose()
        }))
    }
}

impl PoolBackend for RedisBackend {
    fn pool_modify<'a>(
        &'a self,
        pool: &'a LockKey,
        op: &'a PoolOp,
    ) -> BoxFuture<'a, Result<usize, LockError>> {
        with_drivers(Box::pin(async move {
            let name = object_name(&self.inner.prefix, "pool", pool);
            let mut inv = ScriptCall::new(&POOL_MODIFY, 1);
            inv.key(&name);
            let with_locks = |inv: &mut ScriptCall, keys: &[LockKey]| {
                for k in keys {
                    inv.arg(k.as_str())
                        .arg(object_name(&self.inner.prefix, "lock", k));
                }
            };
            match op {
                PoolOp::Add(keys) => {
                    inv.arg("add");
                    with_locks(&mut inv, keys);
                }
                PoolOp::Replace(keys) => {
                    inv.arg("replace");
                    with_locks(&mut inv, keys);
                }
                PoolOp::Remove(keys) => {
                    inv.arg("rem");
                    for k in keys {
                        inv.arg(k.as_str());
                    }
                }
                PoolOp::Clear => {
                    inv.arg("clear");
                }
            }
            let len: i64 = self.inner.call("pool modify", &inv).await?;
            Ok(usize::try_from(len).unwrap_or(0))
        }))
    }

    fn pool_members<'a>(
        &'a self,
        pool: &'a LockKey,
    ) -> BoxFuture<'a, Result<Vec<LockKey>, LockError>> {
        with_drivers(Box::pin(async move {
            let name = object_name(&self.inner.prefix, "pool", pool);
            let mut inv = ScriptCall::new(&POOL_MEMBERS, 1);
            inv.key(&name);
            let members: Vec<String> = self.inner.call("pool members", &inv).await?;
            let mut members = members
                .iter()
                .map(|m| LockKey::new(m).map_err(malformed_member))
                .collect::<Result<Vec<_>, _>>()?;
            members.sort();
            Ok(members)
        }))
    }

    fn pool_holders<'a>(
        &'a self,
        pool: &'a LockKey,
    ) -> BoxFuture<'a, Result<PoolHolders, LockError>> {
        with_drivers(Box::pin(async move {
            let name = object_name(&self.inner.prefix, "pool", pool);
            let mut inv = ScriptCall::new(&POOL_HOLDERS, 1);
            inv.key(&name);
            let flat: Vec<(String, String, i64)> = self.inner.call("pool holders", &inv).await?;
            let mut out = Vec::with_capacity(flat.len());
            for (member, token, pttl) in flat {
                let member = LockKey::new(&member).map_err(malformed_member)?;
                let holder = if token.is_empty() {
                    None
                } else {
                    Some(Holder::new(
                        Token::new(&token).map_err(malformed_token)?,
                        remaining(pttl),
                    ))
                };
                out.push((member, holder));
            }
            out.sort_by(|a, b| a.0.cmp(&b.0));
            Ok(out)
        }))
    }
}
