//! Permits on Redis ([`PermitBackend`]): N shared holders per key, or one exclusive holder
//! alone, with the lock's waiting, fairness and fencing.
//!
//! For a key `K` under prefix `P`, with `T` the key's hash tag (see `names`), a permit set
//! lives in three keys and one channel, all in the key's Cluster slot, apart from the
//! lock's keys of the same `K`:
//!
//! | Redis key / channel    | Type    | Lifetime                                          |
//! |------------------------|---------|---------------------------------------------------|
//! | `P:{T}:pholders:K`     | zset    | holder tokens scored by their lease's expiry (server ms); until the latest expiry |
//! | `P:{T}:pfence:K`       | hash    | `fence`: the last fence granted; `t:<token>`: `"<fence> <s\|x>"` per holder; the latest expiry + 10 s, then 10 s after the last holder leaves (the tombstone) |
//! | `P:{T}:pqueue:K`       | zset    | waiter tickets by arrival, `"<id>\|<deadline>\|<TTL>\|<claim>\|<permits>\|<s\|x>\|<token>"`; while someone waits, one ticket TTL after the last registration |
//! | `P:{T}:pwake:K`        | channel | grants, in the lock's format `"<id>\|<deadline> <fence> <px>"`; on a Cluster the sharded `P:{T}:pswake:K` |
//!
//! The scripts are in [`scripts`](mod@scripts). Acquisition runs the lock's wait loop (`acquire`) with
//! these keys and scripts: a waiter registers a ticket, subscribes to the channel, and is
//! made a holder by whichever script frees room (a release, a leave, any script that finds
//! an expired holder), which publishes the grant; the fallback retry (at most 250 ms
//! apart) both refreshes the ticket and notices a crashed holder's expiry.
//!
//! What a crashed holder costs: its permit until its lease expires (its TTL, unrenewed),
//! then at most one fallback period until a waiter's retry drops it and grants the next.
//! A crashed waiter that was granted a permit by hand-off holds it for its claim period
//! (its ticket TTL), never a lease TTL.

mod scripts;

use std::time::Duration;

pub(super) use scripts::{ACQUIRE, LEAVE, LEAVE_SOURCE, all as scripts};

use super::{
    FENCE_MARGIN, Inner, RENEW_CHUNK, RedisBackend, acquire::Target, commands::ScriptCall,
    malformed_token, millis, names::Names, outcome, scripts::WAITERS,
};
use crate::{
    BackendError, BackendErrorKind, BoxFuture, ExtendMode, Grant, LockError, LockKey,
    PermitBackend, PermitHolder, PermitRequest, Renewal, Token,
};

/// What a permit acquisition asks for besides a lock's: the limit and the mode.
#[derive(Clone, Copy, Debug)]
pub(super) struct Share {
    pub(super) permits: u32,
    pub(super) exclusive: bool,
}

impl Share {
    /// The mode as the scripts spell it.
    pub(super) fn mode(self) -> &'static str {
        if self.exclusive { "x" } else { "s" }
    }
}

impl Inner {
    /// The Redis names of one key's permits (see [`Names::for_permits`]).
    fn permit_names<'a>(&'a self, key: &'a LockKey) -> Names<'a> {
        self.names(key).for_permits()
    }

    /// One [`RENEW`](scripts::RENEW) call for `chunk`: whether each permit was renewed.
    async fn renew_permit_chunk(&self, chunk: &[Renewal]) -> Result<Vec<bool>, LockError> {
        let mut inv = ScriptCall::new(&scripts::RENEW, 2 * chunk.len());
        for lease in chunk {
            let names = self.permit_names(&lease.key);
            inv.key(names.lock()).key(names.fence());
        }
        inv.arg(millis(FENCE_MARGIN));
        for lease in chunk {
            inv.arg(lease.token.as_str()).arg(millis(lease.ttl));
        }
        let results: Vec<i64> = self.call("renew permits", &inv).await?;
        if results.len() != chunk.len() {
            return Err(LockError::Backend(BackendError::new(
                BackendErrorKind::Protocol,
                "permit renew script answered the wrong number of results",
            )));
        }
        Ok(results.into_iter().map(|r| r == 1).collect())
    }
}

impl PermitBackend for RedisBackend {
    fn acquire_permit(&self, req: PermitRequest) -> BoxFuture<'_, Result<Grant, LockError>> {
        let share = Share {
            permits: req.permits,
            exclusive: req.exclusive,
        };
        Box::pin(
            self.inner
                .clone()
                .acquire(req.acquire, Target::Permit(share)),
        )
    }

    fn release_permit<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(async move {
            let names = self.inner.permit_names(key);
            let mut inv = ScriptCall::new(&scripts::RELEASE, 3);
            inv.key(names.lock())
                .key(names.fence())
                .key(names.queue())
                .arg(token.as_str())
                .arg(names.channel())
                .arg(millis(FENCE_MARGIN));
            outcome(self.inner.call("release permit", &inv).await?)
        })
    }

    fn extend_permit<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        ttl: Duration,
        mode: ExtendMode,
    ) -> BoxFuture<'a, Result<Duration, LockError>> {
        Box::pin(async move {
            let names = self.inner.permit_names(key);
            let mut inv = ScriptCall::new(&scripts::EXTEND, 2);
            inv.key(names.lock())
                .key(names.fence())
                .arg(token.as_str())
                .arg(millis(ttl))
                .arg(match mode {
                    ExtendMode::Add => "add",
                    ExtendMode::Replace => "replace",
                })
                .arg(millis(FENCE_MARGIN));
            let left: i64 = self.inner.call("extend permit", &inv).await?;
            outcome(left)?;
            Ok(Duration::from_millis(u64::try_from(left).unwrap_or(1)))
        })
    }

    fn renew_permits<'a>(
        &'a self,
        leases: &'a [Renewal],
    ) -> BoxFuture<'a, Result<Vec<bool>, LockError>> {
        Box::pin(async move {
            let mut renewed = Vec::with_capacity(leases.len());
            if self.inner.cluster {
                // One slot per key: one call per permit, all at once (as the lock's).
                let calls = leases
                    .iter()
                    .map(|lease| self.inner.renew_permit_chunk(std::slice::from_ref(lease)));
                for one in futures_util::future::join_all(calls).await {
                    renewed.extend(one?);
                }
                return Ok(renewed);
            }
            for chunk in leases.chunks(RENEW_CHUNK) {
                renewed.extend(self.inner.renew_permit_chunk(chunk).await?);
            }
            Ok(renewed)
        })
    }

    fn permit_holders<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Vec<PermitHolder>, LockError>> {
        Box::pin(async move {
            let names = self.inner.permit_names(key);
            let mut inv = ScriptCall::new(&scripts::HOLDERS, 2);
            inv.key(names.lock()).key(names.fence());
            let flat: Vec<(String, i64, String)> = self.inner.call("permit holders", &inv).await?;
            flat.into_iter()
                .map(|(token, pttl, mode)| {
                    let token = Token::new(&token).map_err(malformed_token)?;
                    let ttl = Duration::from_millis(u64::try_from(pttl).unwrap_or(0));
                    Ok(PermitHolder::new(token, Some(ttl), mode == "x"))
                })
                .collect()
        })
    }

    fn permit_waiters<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<usize, LockError>> {
        Box::pin(async move {
            // The lock's script: the tickets carry their deadline in the same place.
            let mut inv = ScriptCall::new(&WAITERS, 1);
            inv.key(self.inner.permit_names(key).queue());
            let n: i64 = self.inner.call("permit waiters", &inv).await?;
            Ok(usize::try_from(n).unwrap_or(0))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text between the first `{` and the next `}`: what Redis Cluster hashes.
    fn tag(name: &str) -> &str {
        let open = name.find('{').unwrap();
        &name[open..=open + name[open..].find('}').unwrap()]
    }

    #[test]
    fn permit_keys_share_the_locks_hash_tag_and_never_its_names() {
        let key = LockKey::new("}{tenant:7}").unwrap();
        for sharded in [false, true] {
            let lock = Names::new("app", &key, sharded);
            let permits = lock.for_permits();
            let text = |names: Names<'_>| {
                [names.lock(), names.fence(), names.queue(), names.channel()].map(|n| n.to_string())
            };
            let (lock, permits) = (text(lock), text(permits));
            for name in &permits {
                assert_eq!(tag(name), tag(&lock[0]), "{name}");
                for other in &lock {
                    assert_ne!(name, other);
                }
            }
            // The scripts publish with SPUBLISH on a Cluster, told by the kind word.
            assert_eq!(permits[3].contains("}:pswake:"), sharded);
        }
    }
}
