//! The clean-up of an acquire that ends without handing its outcome to the caller (its
//! ticket left behind, a grant it may have received unseen), and the leave script that
//! does it.

use std::{sync::Arc, time::Duration};

use tokio::time::Instant;

use super::super::{
    FALLBACK_CAP, FENCE_MARGIN, Inner,
    commands::{Conn, ScriptCall},
    millis,
    names::Names,
    remaining,
    scripts::{LEAVE, LEAVE_SOURCE},
};
use crate::{BackendErrorKind, LockError, Token};

/// Cleans up after an acquire that ends without handing its outcome to the caller: removes
/// its ticket and gives back a grant it may have received unseen (one that landed while a
/// call was in flight, or a hand-off nobody waited for any more). Runs as a spawned task,
/// so dropping the acquire future never blocks.
pub(super) struct Cleanup<'a> {
    pub(super) inner: &'a Arc<Inner>,
    pub(super) names: Names<'a>,
    pub(super) ticket: &'a str,
    pub(super) token: &'a Token,
    pub(super) armed: bool,
    /// Whether a ticket may be registered (then a hand-off may have made us the holder).
    pub(super) registered: bool,
    /// Our registration's nonce as last reported (`None`: not registered yet).
    pub(super) known: Option<u64>,
    pub(super) in_flight: bool,
    /// The connection the last attempt went out on: the release must follow it there.
    pub(super) pinned: Option<Conn>,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        if !self.armed || !(self.registered || self.in_flight) {
            return;
        }
        let inner = self.inner.clone();
        let key = self.names.key().clone();
        let leaving = Leaving {
            ticket: self.ticket.to_owned(),
            token: self.token.clone(),
        };
        let pinned = if self.in_flight {
            self.pinned.take()
        } else {
            None
        };
        // On the engine's runtime: the clean-up must not depend on the caller's. A clean-up
        // the server refused (busy, loading, no connection) is retried every fallback
        // period until the ticket would have lapsed anyway: left in the queue, it could be
        // handed the key and hold it for a claim period. (Leaving twice is harmless: the
        // second finds nothing of ours.) One that timed out is not: it was sent and lands
        // when the server answers again, and sending more meanwhile would only churn the
        // pool, whose retired connections take their unanswered commands with them.
        crate::runtime::handle().spawn(async move {
            let give_up = Instant::now() + Duration::from_millis(inner.ticket_ttl_ms);
            let mut pinned = pinned;
            let names = inner.names(&key);
            loop {
                let Err(error) = inner.leave(names, &leaving, pinned.take()).await else {
                    return;
                };
                let sent = matches!(&error, LockError::Backend(e) if e.kind() == BackendErrorKind::Timeout);
                if sent || Instant::now() + FALLBACK_CAP >= give_up {
                    tracing::debug!(%error, "lock waiter cleanup failed; its ticket will expire");
                    return;
                }
                tracing::debug!(%error, "lock waiter cleanup refused; retrying");
                tokio::time::sleep(FALLBACK_CAP).await;
            }
        });
    }
}

/// What a leaving waiter tells the leave script.
pub(super) struct Leaving {
    pub(super) ticket: String,
    pub(super) token: Token,
}

impl Inner {
    pub(super) async fn leave(
        &self,
        names: Names<'_>,
        leaving: &Leaving,
        pinned: Option<Conn>,
    ) -> Result<Option<Duration>, LockError> {
        // The keys and arguments, after `numkeys`.
        let keys_and_args = |cmd: &mut redis::Cmd| {
            cmd.arg(names.lock())
                .arg(names.fence())
                .arg(names.queue())
                .arg(names.tickets())
                .arg(names.holders())
                .arg(leaving.ticket.as_str())
                .arg(leaving.token.as_str())
                .arg("1")
                .arg(names.channel())
                .arg(millis(FENCE_MARGIN));
        };
        if let Some(mut conn) = pinned {
            // Behind the unseen acquire on its own connection, so it cannot overtake it.
            let mut eval = redis::cmd("EVAL");
            eval.arg(LEAVE_SOURCE.as_str()).arg(5);
            keys_and_args(&mut eval);
            match self
                .commands
                .query_on::<i64>("leave", &eval, &mut conn)
                .await
            {
                Ok(pttl) => return Ok(remaining(pttl)),
                // That connection is gone, and with it anything still unsent on it.
                Err(e) if e.kind() == BackendErrorKind::Unavailable => {}
                Err(e) => return Err(LockError::Backend(e)),
            }
        }
        let mut inv = ScriptCall::new(&LEAVE, 5);
        inv.repeatable();
        keys_and_args(inv.keys_and_args());
        let pttl: i64 = self.call("leave", &inv).await?;
        Ok(remaining(pttl))
    }
}
