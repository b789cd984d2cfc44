//! Shared leases on Redis ([`Mode::Shared`]): up to N holders per key, or one alone (a
//! limit of 1), with the lock's waiting, fairness and fencing.
//!
//! For a key `K` under prefix `P`, with `T` the key's hash tag (see `names`), the shared leases
//! live in three keys and one channel, all in the key's Cluster slot, apart from the
//! lock's keys of the same `K`:
//!
//! | Redis key / channel    | Type    | Lifetime                                          |
//! |------------------------|---------|---------------------------------------------------|
//! | `P:{T}:pholders:K`     | zset    | holder tokens scored by their lease's expiry (server ms); until the latest expiry |
//! | `P:{T}:pfence:K`       | hash    | `fence`: the last fence granted; `t:<token>`: `"<fence> <s\|x>"` per holder; the latest expiry + 10 s, then 10 s after the last holder leaves (the tombstone) |
//! | `P:{T}:pqueue:K`       | zset    | waiter tickets by arrival, `"<id>\|<deadline>\|<TTL>\|<claim>\|<permits>\|<s\|x>\|<token>"`; while someone waits, one ticket TTL after the last registration |
//! | `P:{T}:pwake:K`        | channel | grants, in the lock's format `"<id>\|<deadline> <fence> <px>"`; on a Cluster the sharded `P:{T}:pswake:K` |
//!
//! The scripts are in [`scripts::shared`](mod@scripts). Acquisition runs the lock's wait loop (`acquire`) with
//! these keys and scripts: a waiter registers a ticket, subscribes to the channel, and is
//! made a holder by whichever script frees room (a release, a leave, any script that finds
//! an expired holder), which publishes the grant; the fallback retry (at most 250 ms
//! apart) both refreshes the ticket and notices a crashed holder's expiry.
//!
//! What a crashed holder costs: its place until its lease expires (its TTL, unrenewed),
//! then at most one fallback period until a waiter's retry drops it and grants the next.
//! A crashed waiter that was granted a shared lease by hand-off holds it for its claim period
//! (its ticket TTL), never a lease TTL.

use std::time::Duration;

use super::{
    FENCE_MARGIN, Inner, commands::ScriptCall, malformed_token, millis, names::Names, outcome,
    scripts::WAITERS, scripts::shared as scripts,
};
use crate::{
    BackendError, BackendErrorKind, ExtendMode, Holder, LockError, LockKey, Mode, Renewal, Token,
};

/// The limit and the mode word of a shared request as the scripts take them: `"x"` for a
/// limit of 1 (alone among the shared holders), `"s"` otherwise.
pub(super) fn share_args(mode: Mode) -> (u32, &'static str) {
    match mode {
        Mode::Shared { limit } if limit != 1 => (limit, "s"),
        _ => (1, "x"),
    }
}

impl Inner {
    /// The Redis names of one key's shared leases (see [`Names::for_shared`]).
    pub(super) fn shared_names<'a>(&'a self, key: &'a LockKey) -> Names<'a> {
        self.names(key).for_shared()
    }

    /// The names of `key` in the space `mode` names.
    pub(super) fn names_in<'a>(&'a self, key: &'a LockKey, mode: Mode) -> Names<'a> {
        if mode.is_shared() {
            self.shared_names(key)
        } else {
            self.names(key)
        }
    }

    /// One [`RENEW`](scripts::RENEW) call for `chunk`: whether each shared lease was
    /// renewed.
    pub(super) async fn renew_shared_chunk(
        &self,
        chunk: &[&Renewal],
    ) -> Result<Vec<bool>, LockError> {
        let mut inv = ScriptCall::new(&scripts::RENEW, 2 * chunk.len());
        inv.repeatable();
        for lease in chunk {
            let names = self.shared_names(&lease.key);
            inv.key(names.lock()).key(names.fence());
        }
        inv.arg(millis(FENCE_MARGIN));
        for lease in chunk {
            inv.arg(lease.token.as_str()).arg(millis(lease.ttl));
        }
        let results: Vec<i64> = self.call("renew shared", &inv).await?;
        if results.len() != chunk.len() {
            return Err(LockError::Backend(BackendError::new(
                BackendErrorKind::Protocol,
                "shared renew script answered the wrong number of results",
            )));
        }
        Ok(results.into_iter().map(|r| r == 1).collect())
    }

    /// Release `token`'s shared lease of `key`, granting the waiters that now fit.
    pub(super) async fn release_shared(
        &self,
        key: &LockKey,
        token: &Token,
    ) -> Result<(), LockError> {
        let names = self.shared_names(key);
        let mut inv = ScriptCall::new(&scripts::RELEASE, 3);
        inv.repeatable();
        inv.key(names.lock())
            .key(names.fence())
            .key(names.queue())
            .arg(token.as_str())
            .arg(names.channel())
            .arg(millis(FENCE_MARGIN));
        outcome(self.call("release shared", &inv).await?)
    }

    /// Change the remaining TTL of `token`'s shared lease of `key`.
    pub(super) async fn extend_shared(
        &self,
        key: &LockKey,
        token: &Token,
        ttl: Duration,
        how: ExtendMode,
    ) -> Result<Duration, LockError> {
        let names = self.shared_names(key);
        let mut inv = ScriptCall::new(&scripts::EXTEND, 2);
        inv.key(names.lock())
            .key(names.fence())
            .arg(token.as_str())
            .arg(millis(ttl))
            .arg(match how {
                ExtendMode::Add => "add",
                ExtendMode::Replace => "replace",
            })
            .arg(millis(FENCE_MARGIN));
        let left: i64 = self.call("extend shared", &inv).await?;
        outcome(left)?;
        Ok(Duration::from_millis(u64::try_from(left).unwrap_or(1)))
    }

    /// Who holds shared leases of `key` now.
    pub(super) async fn shared_holders(&self, key: &LockKey) -> Result<Vec<Holder>, LockError> {
        let names = self.shared_names(key);
        let mut inv = ScriptCall::new(&scripts::HOLDERS, 2);
        inv.repeatable();
        inv.key(names.lock()).key(names.fence());
        let flat: Vec<(String, i64, String)> = self.call("shared holders", &inv).await?;
        flat.into_iter()
            .map(|(token, pttl, mode)| {
                let token = Token::new(&token).map_err(malformed_token)?;
                let ttl = Duration::from_millis(u64::try_from(pttl).unwrap_or(0));
                Ok(Holder::shared(token, Some(ttl), mode == "x"))
            })
            .collect()
    }

    /// How many wait in `names`' queue (the lock's script: the shared tickets carry their
    /// deadline in the same place; the lock's queue is a list, the shared one a zset).
    pub(super) async fn waiting(&self, names: Names<'_>) -> Result<usize, LockError> {
        let mut inv = ScriptCall::new(&WAITERS, 1);
        inv.repeatable();
        inv.key(names.queue())
            .arg(if names.is_shared() { "zset" } else { "list" });
        let n: i64 = self.call("waiters", &inv).await?;
        Ok(usize::try_from(n).unwrap_or(0))
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
    fn shared_keys_share_the_locks_hash_tag_and_never_its_names() {
        let key = LockKey::new("}{tenant:7}").unwrap();
        for sharded in [false, true] {
            let lock = Names::new("app", &key, sharded);
            let shared = lock.for_shared();
            let text = |names: Names<'_>| {
                [names.lock(), names.fence(), names.queue(), names.channel()].map(|n| n.to_string())
            };
            let (lock, shared) = (text(lock), text(shared));
            for name in &shared {
                assert_eq!(tag(name), tag(&lock[0]), "{name}");
                for other in &lock {
                    assert_ne!(name, other);
                }
            }
            // The scripts publish with SPUBLISH on a Cluster, told by the kind word.
            assert_eq!(shared[3].contains("}:pswake:"), sharded);
        }
    }
}
