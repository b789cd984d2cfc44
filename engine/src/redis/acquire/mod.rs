//! The acquire wait loop: one script call per attempt, grants delivered by pub/sub between
//! attempts, and the clean-up of an acquire that ends without handing its outcome to the
//! caller; the same loop for both modes (the lock's keys and scripts, or the shared
//! leases').
//!
//! A waiter registers a ticket with its first failed attempt, then waits for its grant:
//! the release script makes it the holder itself and publishes who and which fence, so the
//! message alone completes the acquire. Retries happen only when the wake-up channel was
//! not yet subscribed when the ticket was registered (once the subscription is confirmed:
//! a grant before it went unheard), after a reconnect of the subscriber, or on the
//! fallback timer (at most [`FALLBACK_CAP`](super::FALLBACK_CAP) apart), which also
//! refreshes the ticket and finds a grant whose message was lost (the key is already this
//! waiter's: re-entry).
//!
//! The states, one file each: an attempt (`attempt`: the first try, the registration of a
//! ticket, its refresh), the wait between attempts and the claim of a grant (`wait`), the
//! clean-up of an acquire that ends unseen (`cleanup`), and the record read around an
//! acquire (`record`).

mod attempt;
mod cleanup;
mod record;
mod wait;

use std::sync::Arc;

use super::{Inner, commands::ScriptCall};
use crate::{AcquireRequest, BackendError, BackendErrorKind, Grant, GrantOrRecord, LockError};

impl Inner {
    pub(super) async fn call<T: redis::FromRedisValue>(
        &self,
        what: &'static str,
        inv: &ScriptCall,
    ) -> Result<T, LockError> {
        self.commands
            .invoke(what, inv)
            .await
            .map_err(LockError::Backend)
    }

    /// [`Backend::acquire`](crate::Backend::acquire), in either mode.
    pub(super) async fn acquire(self: Arc<Self>, req: AcquireRequest) -> Result<Grant, LockError> {
        match self.acquire_inner(req, false).await?.0 {
            GrantOrRecord::Grant(grant) => Ok(grant),
            GrantOrRecord::Record(_) => Err(LockError::Backend(BackendError::new(
                BackendErrorKind::Protocol,
                "acquire script answered a record",
            ))),
        }
    }

    /// The acquire loop. With `with_record`, the first attempt also reads the record
    /// ([`ACQUIRE_OR_RECORD`](super::scripts::ACQUIRE_OR_RECORD)). Also says whether the
    /// first attempt decided.
    async fn acquire_inner(
        self: Arc<Self>,
        req: AcquireRequest,
        with_record: bool,
    ) -> Result<(GrantOrRecord, bool), LockError> {
        let id = attempt::TicketId::random();
        let mut wait = wait::Wait::new(&self, &req, &id);
        loop {
            let outcome = wait.attempt(with_record).await?;
            let retry_after = match wait.settle(outcome).await {
                wait::Step::Done(decided) => return decided,
                wait::Step::Waiting(retry_after) => retry_after,
            };
            if wait.is_over() {
                return Err(wait.give_up(retry_after).await);
            }
            if let Some(grant) = wait.sleep(retry_after).await {
                return Ok((GrantOrRecord::Grant(grant), false));
            }
        }
    }
}
