//! The acquire wait loop: one script call per attempt, pub/sub wake-ups between attempts,
//! and the clean-up of an acquire that ends without handing its outcome to the caller.

use std::{sync::Arc, time::Duration};

use redis::{ScriptInvocation, aio::MultiplexedConnection};
use tokio::time::Instant;

use super::{
    FALLBACK_CAP, FENCE_MARGIN, Inner, millis,
    names::Names,
    remaining,
    scripts::{ACQUIRE, LEAVE, LEAVE_SOURCE},
};
use crate::{
    engine::{AcquireRequest, Fence, Grant, LockError, Token},
    error::{BackendError, BackendErrorKind},
};

enum Attempt {
    Granted(Grant),
    Busy(Option<Duration>),
    Full(Option<Duration>),
}

/// Cleans up after an acquire that ends without handing its outcome to the caller: removes
/// its ticket and, if a call was in flight (its grant may have landed unseen), releases by
/// token. Runs as a spawned task, so dropping the acquire future never blocks.
struct Cleanup {
    inner: Arc<Inner>,
    names: Arc<Names>,
    ticket: String,
    token: Token,
    armed: bool,
    in_flight: bool,
    /// The connection the last attempt went out on: the release must follow it there.
    pinned: Option<MultiplexedConnection>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if !self.armed || (self.ticket.is_empty() && !self.in_flight) {
            return;
        }
        let inner = self.inner.clone();
        let names = self.names.clone();
        let ticket = std::mem::take(&mut self.ticket);
        let token = self.token.clone();
        let release = self.in_flight;
        let pinned = if release { self.pinned.take() } else { None };
        // On the engine's runtime: the clean-up must not depend on the caller's.
        crate::engine::background::handle().spawn(async move {
            if let Err(error) = inner.leave(&names, &ticket, &token, release, pinned).await {
                tracing::debug!(%error, "lock waiter cleanup failed; its ticket will expire");
            }
        });
    }
}

impl Inner {
    pub(super) async fn call<T: redis::FromRedisValue>(
        &self,
        what: &'static str,
        inv: &ScriptInvocation<'_>,
    ) -> Result<T, LockError> {
        self.pool
            .invoke(what, inv)
            .await
            .map_err(LockError::Backend)
    }

    async fn attempt(
        &self,
        names: &Names,
        req: &AcquireRequest,
        ticket: &str,
        registered: bool,
        pin: &mut Option<MultiplexedConnection>,
    ) -> Result<Attempt, LockError> {
        let mut inv = ACQUIRE.prepare_invoke();
        inv.key(&names.lock)
            .key(&names.fence)
            .key(&names.queue)
            .key(&names.wait)
            .arg(req.token.as_str())
            .arg(millis(req.ttl))
            .arg(ticket)
            .arg(if req.fifo { "1" } else { "0" })
            .arg(
                req.max_waiters
                    .map_or(-1, |m| i64::try_from(m).unwrap_or(i64::MAX)),
            )
            .arg(self.ticket_ttl_ms)
            .arg(millis(FENCE_MARGIN))
            .arg(if registered { "1" } else { "0" });
        // Taken before sending: the TTL cannot have started on the server any earlier.
        let sent = Instant::now();
        let (status, value): (i64, i64) = self
            .pool
            .invoke_pinned("acquire", &inv, pin)
            .await
            .map_err(LockError::Backend)?;
        Ok(match status {
            1 => Attempt::Granted(Grant::new(
                Fence::new(u64::try_from(value).unwrap_or(0)),
                sent,
            )),
            0 => Attempt::Busy(remaining(value)),
            2 => Attempt::Full(remaining(value)),
            other => {
                return Err(LockError::Backend(BackendError::new(
                    BackendErrorKind::Protocol,
                    format!("acquire script answered status {other}"),
                )));
            }
        })
    }

    pub(super) async fn leave(
        &self,
        names: &Names,
        ticket: &str,
        token: &Token,
        release: bool,
        pinned: Option<MultiplexedConnection>,
    ) -> Result<Option<Duration>, LockError> {
        let keys = [&names.lock, &names.fence, &names.queue, &names.wait];
        let release = if release { "1" } else { "0" };
        let fence_margin = millis(FENCE_MARGIN).to_string();
        let args = [
            ticket,
            token.as_str(),
            release,
            &names.channel,
            &fence_margin,
        ];
        if let Some(mut conn) = pinned {
            // Behind the unseen acquire on its own connection, so it cannot overtake it.
            let mut eval = redis::cmd("EVAL");
            eval.arg(LEAVE_SOURCE.as_str())
                .arg(keys.len())
                .arg(&keys)
                .arg(&args);
            match self.pool.query_on::<i64>("leave", &eval, &mut conn).await {
                Ok(pttl) => return Ok(remaining(pttl)),
                // That connection is gone, and with it anything still unsent on it.
                Err(e) if e.kind() == BackendErrorKind::Unavailable => {}
                Err(e) => return Err(LockError::Backend(e)),
            }
        }
        let mut inv = LEAVE.prepare_invoke();
        inv.key(&keys).arg(&args);
        let pttl: i64 = self.call("leave", &inv).await?;
        Ok(remaining(pttl))
    }

    pub(super) async fn acquire(self: Arc<Self>, req: AcquireRequest) -> Result<Grant, LockError> {
        let started = Instant::now();
        let deadline = req.wait.map(|w| started + w);
        let waiting = req.wait != Some(Duration::ZERO);
        let names = Arc::new(Names::new(&self.prefix, &req.key));
        let ticket = if waiting {
            format!("{:032x}", rand::random::<u128>())
        } else {
            String::new()
        };
        let mut cleanup = Cleanup {
            inner: self.clone(),
            names: names.clone(),
            ticket: ticket.clone(),
            token: req.token.clone(),
            armed: true,
            in_flight: false,
            pinned: None,
        };
        let mut subscription = None;
        // Whether an earlier attempt may have registered the ticket.
        let mut registered = false;
        loop {
            // Where the wake-up channel stands before this attempt goes out (see `covered`).
            let mark = match &subscription {
                None if waiting => self.wakeup.mark(&names.channel),
                _ => None,
            };
            cleanup.in_flight = true;
            // On error the cleanup stays armed with `in_flight`: the grant may have landed.
            let outcome = self
                .attempt(&names, &req, &ticket, registered, &mut cleanup.pinned)
                .await?;
            cleanup.in_flight = false;
            cleanup.pinned = None;
            let retry_after = match outcome {
                Attempt::Granted(grant) => {
                    cleanup.armed = false;
                    return Ok(grant);
                }
                Attempt::Full(retry_after) => {
                    // Nothing was registered by this call; an earlier registration expired.
                    cleanup.armed = false;
                    return Err(LockError::QueueFull { retry_after });
                }
                Attempt::Busy(retry_after) if !waiting => {
                    cleanup.armed = false;
                    return Err(LockError::Busy { retry_after });
                }
                Attempt::Busy(retry_after) => {
                    registered = true;
                    retry_after
                }
            };
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                let left = self.leave(&names, &ticket, &req.token, false, None).await;
                let retry_after = match left {
                    Ok(left) => {
                        cleanup.armed = false;
                        left.or(retry_after)
                    }
                    Err(_) => retry_after,
                };
                return Err(LockError::TimedOut {
                    waited: started.elapsed(),
                    retry_after,
                });
            }
            let fallback = retry_after
                .map_or(FALLBACK_CAP, |r| r.min(FALLBACK_CAP))
                .max(Duration::from_millis(1));
            let wake_at = deadline.map_or(now + fallback, |d| d.min(now + fallback));
            match &subscription {
                None => {
                    let sub = self.wakeup.subscribe(
                        &names.channel,
                        req.fifo.then_some(ticket.as_str()),
                        mark,
                    );
                    if sub.covered() {
                        // Subscribed since before the attempt and nothing heard since: no
                        // release went unheard, so wait for one like any later turn.
                        tokio::select! {
                            _ = sub.woken() => {}
                            _ = tokio::time::sleep_until(wake_at) => {}
                        }
                    } else {
                        // Retry once the subscription is confirmed: a release before it
                        // was unheard, one after it will be heard.
                        tokio::select! {
                            _ = sub.confirmed() => {}
                            _ = tokio::time::sleep_until(wake_at) => {}
                        }
                    }
                    subscription = Some(sub);
                }
                Some(sub) => {
                    tokio::select! {
                        _ = sub.woken() => {}
                        _ = tokio::time::sleep_until(wake_at) => {}
                    }
                }
            }
        }
    }
}
