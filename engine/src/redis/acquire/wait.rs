//! The states of one acquire between its attempts: what an attempt's answer means (decided,
//! or registered and waiting), the wait for a wake-up or the fallback timer, the claim of a
//! grant a wake-up carries, and giving up at the wait limit.

use std::{sync::Arc, time::Duration};

use tokio::time::Instant;

use super::{
    attempt::{Attempt, TicketId, TicketState},
    cleanup::{Cleanup, Leaving},
};
use crate::redis::{
    FALLBACK_CAP, Inner,
    names::Names,
    records::stored,
    wakeup::{Subscription, Woken},
};
use crate::{
    AcquireRequest, BackendError, BackendErrorKind, Fence, Grant, GrantOrRecord, LockError,
};

/// What an attempt's answer leaves the acquire with.
pub(super) enum Step {
    /// Decided: the acquire's outcome, and whether it was the first attempt's.
    Done(Result<(GrantOrRecord, bool), LockError>),
    /// Registered (or its refresh failed): wait, then try again; the holder's remaining
    /// TTL, if known.
    Waiting(Option<Duration>),
}

/// One acquire's state across its attempts.
pub(super) struct Wait<'a> {
    inner: &'a Arc<Inner>,
    req: &'a AcquireRequest,
    names: Names<'a>,
    ticket: &'a str,
    started: Instant,
    deadline: Option<Instant>,
    /// Whether the acquire may wait at all (a try answers at once).
    waiting: bool,
    first: bool,
    cleanup: Cleanup<'a>,
    /// The wake-up channel's name, made only when the first attempt did not decide.
    channel: Option<String>,
    subscription: Option<Subscription>,
    /// Where the wake-up channel stood before the last attempt went out (see `covered`).
    mark: Option<u64>,
    /// When the last attempt was sent: the TTL cannot have started on the server earlier.
    sent: Instant,
    /// When the attempt that registered (or last refreshed) our ticket was sent: a
    /// hand-off of that ticket happened later, so its claim runs from no earlier.
    last_sent: Instant,
    /// Whether the last wait ended on the fallback timer, not on a wake-up.
    by_timer: bool,
    /// Whether the last wait ended because the wake-up channel's subscription was
    /// confirmed: the next attempt only looks for a grant made before it.
    confirmed: bool,
    /// A registered waiter's failed refresh (a timeout, a server busy or failing over for
    /// a moment) does not end its wait: it is retried on the next fallback period while
    /// the ticket lives (a ticket TTL after the last refresh that got through; after that
    /// its place is gone anyway). The error is kept to answer a wait that ends while the
    /// backend is still failing.
    failed: Option<LockError>,
    last_ok: Instant,
}

impl<'a> Wait<'a> {
    pub(super) fn new(inner: &'a Arc<Inner>, req: &'a AcquireRequest, id: &'a TicketId) -> Self {
        let started = Instant::now();
        let waiting = req.wait != Some(Duration::ZERO);
        let names = inner.names(&req.key);
        let ticket = if waiting { id.as_str() } else { "" };
        Self {
            inner,
            req,
            names,
            ticket,
            started,
            deadline: req.wait.map(|w| started + w),
            waiting,
            first: true,
            cleanup: Cleanup {
                inner,
                names,
                ticket,
                token: &req.token,
                armed: true,
                registered: false,
                known: None,
                in_flight: false,
                pinned: None,
            },
            channel: None,
            subscription: None,
            mark: None,
            sent: started,
            last_sent: started,
            by_timer: false,
            confirmed: false,
            failed: None,
            last_ok: started,
        }
    }

    /// One attempt: the first try, the registration of our ticket, or its refresh. `None`
    /// when a registered waiter's refresh failed within its ticket's life (retried later).
    pub(super) async fn attempt(
        &mut self,
        with_record: bool,
    ) -> Result<Option<Attempt>, LockError> {
        let inner = self.inner;
        self.mark = match &self.subscription {
            None if self.waiting => self.names.channel().with_str(|c| inner.wakeup.mark(c)),
            _ => None,
        };
        self.cleanup.in_flight = true;
        // Taken before sending: the TTL cannot have started on the server any earlier.
        self.sent = Instant::now();
        // On error the cleanup stays armed with `in_flight`: the grant may have landed, or
        // a refresh renamed our ticket (the script finds it again by its id).
        let ticket = TicketState {
            id: self.ticket,
            registered: self.cleanup.registered,
            check: std::mem::take(&mut self.confirmed)
                && self.cleanup.known.is_some()
                && self.failed.is_none(),
        };
        let with_record = with_record && self.first;
        let (req, first) = (self.req, self.first);
        let attempt = inner.attempt(
            self.names,
            req,
            ticket,
            with_record,
            req.mode,
            &mut self.cleanup.pinned,
        );
        let mut attempt = std::pin::pin!(attempt);
        let mut in_line = first;
        // The first attempt gives up the acquire's place in line (see
        // `AcquireRequest::leave_line`) once polled: its command is then queued on its
        // connection, ahead of any the next caller sends on it. Not at its answer: that is
        // read by this task, and a waiter put aside after one poll would hold the line.
        let reply = std::future::poll_fn(|cx| {
            let polled = attempt.as_mut().poll(cx);
            if std::mem::take(&mut in_line) {
                req.leave_line();
            }
            polled
        })
        .await;
        match reply {
            Ok(outcome) => {
                self.cleanup.in_flight = false;
                self.failed = None;
                self.last_ok = self.sent;
                Ok(Some(outcome))
            }
            Err(e)
                if self.cleanup.registered
                    && self.last_ok.elapsed() < Duration::from_millis(inner.ticket_ttl_ms) =>
            {
                tracing::debug!(
                    channel = %self.names.channel(),
                    error = %e,
                    "lock waiter's refresh failed; retrying within its wait"
                );
                self.failed = Some(e);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// What the attempt's answer means: decided, or registered and waiting.
    pub(super) async fn settle(&mut self, outcome: Option<Attempt>) -> Step {
        // Kept for the clean-up while the call it went out with is unresolved.
        let pinned = if self.cleanup.in_flight {
            None
        } else {
            self.cleanup.pinned.take()
        };
        let first = std::mem::replace(&mut self.first, false);
        let decided = match outcome {
            // The refresh failed: wait for a wake-up or the fallback period, then retry.
            None => return Step::Waiting(None),
            Some(Attempt::Busy { retry_after, nonce }) if self.waiting => {
                self.cleanup.registered = true;
                if nonce != 0 {
                    // The registration the ticket now carries (a new one if it was gone).
                    self.cleanup.known = Some(nonce);
                }
                self.last_sent = self.sent;
                return Step::Waiting(retry_after);
            }
            Some(Attempt::Busy { retry_after, .. }) => Err(LockError::Busy { retry_after }),
            Some(Attempt::Record(fields)) => match stored(fields.0, fields.1, fields.2, fields.3) {
                Ok(Some(record)) => Ok((GrantOrRecord::Record(record), true)),
                Ok(None) => Err(LockError::Backend(BackendError::new(
                    BackendErrorKind::Protocol,
                    "acquire script answered an empty record",
                ))),
                Err(e) => Err(e),
            },
            Some(Attempt::Granted(fence)) => {
                if self.by_timer
                    && !self
                        .subscription
                        .as_ref()
                        .is_some_and(Subscription::granted)
                {
                    // A hand-off whose message has not come (lost, or just late), or a
                    // lease that ran out: found at the cost of up to FALLBACK_CAP.
                    tracing::debug!(
                        channel = %self.names.channel(),
                        "lock granted on the fallback timer's retry, not by a wake-up"
                    );
                }
                Ok((GrantOrRecord::Grant(Grant::new(fence, self.sent)), first))
            }
            Some(Attempt::Unacknowledged { acked, wanted }) => {
                // Give the grant back (and drop our ticket) behind the script, on its
                // connection; if that fails, the cleanup retries it in the background.
                let leaving = self.leaving();
                self.cleanup.in_flight = true;
                if self.inner.leave(self.names, &leaving, pinned).await.is_ok() {
                    self.cleanup.armed = false;
                }
                return Step::Done(Err(LockError::Backend(BackendError::new(
                    BackendErrorKind::NotReplicated,
                    format!(
                        "{acked} of {wanted} replicas acknowledged the grant in time; released"
                    ),
                ))));
            }
            // Nothing was registered by this call; an earlier registration expired.
            Some(Attempt::Full(retry_after)) => Err(LockError::QueueFull { retry_after }),
            Some(Attempt::NotUpgraded) => Err(LockError::InvalidValue(
                "a shared lease cannot be re-entered alone",
            )),
        };
        self.cleanup.armed = false;
        Step::Done(decided)
    }

    /// What our ticket tells the leave script.
    fn leaving(&self) -> Leaving {
        Leaving {
            ticket: self.ticket.to_owned(),
            token: self.req.token.clone(),
        }
    }

    /// Whether the wait limit has passed.
    pub(super) fn is_over(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// The wait limit passed: leave the queue, and answer why the wait ended.
    pub(super) async fn give_up(mut self, retry_after: Option<Duration>) -> LockError {
        let leaving = self.leaving();
        // Behind a failed refresh on its connection, so it cannot overtake it.
        let behind = self
            .cleanup
            .in_flight
            .then(|| self.cleanup.pinned.take())
            .flatten();
        let retry_after = match self.inner.leave(self.names, &leaving, behind).await {
            Ok(left) => {
                self.cleanup.armed = false;
                left.or(retry_after)
            }
            // The clean-up retries it in the background (see `Cleanup`).
            Err(_) => retry_after,
        };
        // A wait that ended while the backend was failing says so.
        if let Some(e) = self.failed.take() {
            return e;
        }
        LockError::TimedOut {
            waited: self.started.elapsed(),
            retry_after,
        }
    }

    /// Wait for a wake-up, the fallback period (capped by the holder's remaining TTL) or
    /// the wait limit; a grant the wake-up carries for our ticket is claimed.
    pub(super) async fn sleep(&mut self, retry_after: Option<Duration>) -> Option<Grant> {
        let now = Instant::now();
        let fallback = retry_after
            .map_or(FALLBACK_CAP, |r| r.min(FALLBACK_CAP))
            .max(Duration::from_millis(1));
        let wake_at = self
            .deadline
            .map_or(now + fallback, |d| d.min(now + fallback));
        let woken = match self.subscription.as_ref() {
            Some(sub) => woken_by(sub, wake_at).await,
            None => {
                let (names, inner) = (self.names, self.inner);
                let channel = self
                    .channel
                    .get_or_insert_with(|| names.channel().to_string());
                let sub = inner.wakeup.subscribe(channel, self.ticket, self.mark);
                let woken = if sub.covered() {
                    // Subscribed since before the attempt: a grant after it is heard.
                    woken_by(&sub, wake_at).await
                } else {
                    // Retry once the subscription is confirmed: a grant before it was
                    // unheard (the retry finds it: re-entry), one after it is heard.
                    tokio::select! {
                        woken = sub.woken() => Some(woken),
                        _ = sub.confirmed() => {
                            self.confirmed = true;
                            None
                        }
                        _ = tokio::time::sleep_until(wake_at) => None,
                    }
                };
                self.subscription = Some(sub);
                woken
            }
        };
        self.by_timer = woken.is_none() && Instant::now() >= wake_at;
        self.claim(woken?)
    }

    /// A grant naming our current registration's nonce: the hand-off came after the
    /// attempt sent at `last_sent`, which saw that registration waiting. One naming another
    /// nonce (an older registration of our ticket, granted and lapsed before we registered
    /// again) is stale, whatever the clocks say: its claim may be over. (A refresh keeps
    /// the nonce; only a registration made anew, its ticket gone, takes a fresh one.)
    fn claim(&mut self, woken: Woken) -> Option<Grant> {
        let Woken::Granted { nonce, fence, px } = woken else {
            return None;
        };
        if self.cleanup.known != Some(nonce) {
            return None;
        }
        if self.inner.replica_ack.is_some() {
            // Handed over by a release, which waited for no replica: confirm it with one
            // more attempt (re-entry, the full lease) and its WAIT.
            return None;
        }
        self.cleanup.armed = false;
        // The expiry the releasing script set (the claim period our ticket carries),
        // counted from before the attempt that registered the ticket it granted: never
        // later than the server's. Not our own settings: the server decided.
        let valid = Duration::from_millis(px);
        Some(Grant::new(Fence::new(fence), self.last_sent).valid_for(valid))
    }
}

/// The next wake-up of `sub`, or `None` when `at` comes first.
async fn woken_by(sub: &Subscription, at: Instant) -> Option<Woken> {
    tokio::select! {
        // A wake-up that is there is taken, even if the timer has also run out (a poll
        // that comes late finds both ready): the grant it may carry is ours now, where
        // the timer's refresh would cost a round trip to find it again.
        biased;
        woken = sub.woken() => Some(woken),
        _ = tokio::time::sleep_until(at) => None,
    }
}
