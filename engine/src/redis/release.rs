//! The call of the lock's release script ([`RELEASE`]), which the lease release, the
//! completion with a record and the give-back of an unused grant all make, and what its
//! answer tells the next acquire.

use super::{FENCE_MARGIN, Inner, commands::ScriptCall, millis, names::Names, outcome};
use crate::{LockError, Token};

#[cfg(doc)]
use super::scripts::RELEASE;

/// The keys and arguments of [`RELEASE`], which [`COMPLETE`](super::scripts::COMPLETE)
/// also takes first. (A hand-off lasts the waiter's claim period, which its ticket carries.)
/// `extra_keys`: keys the caller adds after these (before any argument).
pub(super) fn release_call(
    script: &redis::Script,
    names: Names<'_>,
    extra_keys: usize,
) -> ScriptCall {
    let mut inv = ScriptCall::new(script, 5 + extra_keys);
    inv.key(names.lock())
        .key(names.fence())
        .key(names.queue())
        .key(names.tickets())
        .key(names.holders());
    inv
}

/// The arguments of [`RELEASE`], after every key: the last a fresh id of this release, which
/// the tombstone it leaves names, so that the same call sent again answers released.
pub(super) fn release_args(inv: &mut ScriptCall, names: Names<'_>, token: &Token) {
    inv.arg(token.as_str())
        .arg(names.channel())
        .arg(millis(FENCE_MARGIN))
        .arg(nonce());
}

/// 52 random bits, exact in the scripts' Lua numbers, never 0: a registration's nonce, or
/// a release's id.
pub(super) fn nonce() -> u64 {
    let hex = crate::key::random_hex();
    let text = std::str::from_utf8(&hex[..13]).unwrap_or("1");
    u64::from_str_radix(text, 16).unwrap_or(1).max(1)
}

impl Inner {
    /// What a release script answered tells which way the key's next acquire should look
    /// (see [`Contended`](super::contended::Contended)).
    pub(super) fn released(&self, names: Names<'_>, code: i64) {
        match code {
            2 => self.contended.mark(names.tag),
            1 => self.contended.clear(names.tag),
            _ => {}
        }
    }

    /// Release `names`' key if `token` holds it (alone or shared), handing it to the next
    /// waiters.
    pub(super) async fn release_lock(
        &self,
        names: Names<'_>,
        token: &Token,
    ) -> Result<(), LockError> {
        let mut inv = release_call(&super::scripts::RELEASE, names, 0);
        release_args(&mut inv, names, token);
        // By token: a release that ran already finds the key no longer its. (Not so a
        // completion, which sends itself again and then reads the record to tell.)
        inv.repeatable();
        let released = self.call("release", &inv).await?;
        self.released(names, released);
        outcome(released)
    }
}
