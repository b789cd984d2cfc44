//! The acquire wait loop: one `acquire` call per attempt, grants delivered by the listener
//! between attempts, and the clean-up of an acquire that ends without handing its outcome
//! to the caller.
//!
//! A waiter enters the listener's table, then sends its attempt; a failed one registers its
//! ticket. The release that grants it makes it the holder itself and notifies the ticket's
//! id, fence and claim, so the notification alone completes the acquire. Between
//! notifications the waiter retries on the fallback timer (at most [`FALLBACK_CAP`] apart),
//! which refreshes its ticket and finds a grant whose notification was lost (re-entry).
//!
//! Every call runs as a task on the engine's runtime (see [`Inner::spawn_call`]): a call
//! whose caller goes away still finishes, and the clean-up waits for it before it leaves, so
//! a grant that lands unseen is always given back.

use std::{sync::Arc, time::Duration};

use sqlx::{Row, postgres::PgRow};
use tokio::{task::JoinHandle, time::Instant};

use super::{FALLBACK_CAP, Inner, backend_error, millis, remaining, resend, sql::Call, timed_out};
use crate::{
    AcquireRequest, BackendError, BackendErrorKind, Fence, Grant, LockError, LockKey, Token,
    releasing::Line, runtime,
};

/// How long a call's task waits for its statement's answer after its caller stopped
/// waiting (see [`Inner::spawn_call`]).
const LANDING_BOUND: Duration = Duration::from_secs(60);

/// A call in flight on the engine's runtime.
pub(super) type InFlight = JoinHandle<Result<Vec<PgRow>, LockError>>;

enum Attempt {
    Granted(Fence),
    Busy(Option<Duration>),
    Full(Option<Duration>),
    /// A shared lease held beside others asked to be re-entered alone.
    NotUpgraded,
}

impl Inner {
    /// Send `sql` from a task on the engine's runtime: it runs to its end even if its
    /// caller goes away or stops waiting for it, and no user runtime owns its connection.
    /// The caller's bound is [`Inner::timeout`] ([`Inner::call`]); the task's own is
    /// [`LANDING_BOUND`], so that a clean-up can wait for what a timed-out statement really
    /// did before it gives a grant back (a statement still queued in the server when its
    /// give-back arrived on another connection would otherwise land after it).
    ///
    /// The pool does not ping a connection before a call (that would double the round
    /// trips), so one that died while idle (a database restart, `idle_session_timeout`,
    /// `pg_terminate_backend`) fails the call it serves: the call is then sent once more,
    /// on a fresh connection of its own, within the same bound, when the rule of
    /// [`resend`](super::resend) allows (any call whose statement never ran; one that may
    /// have run only if its repetition changes nothing).
    pub(super) fn spawn_call(self: &Arc<Self>, what: &'static str, sql: String) -> InFlight {
        self.spawn_call_in_line(what, sql, Line::default())
    }

    /// [`spawn_call`](Self::spawn_call), whose task gives up `line` (an acquire's place
    /// among this node's calls of its key, see `AcquireRequest::leave_line`) as soon as the
    /// statement has answered: the next caller's attempt then goes, even if this call's
    /// caller is not polling (a blocked runtime, a future put aside).
    fn spawn_call_in_line(
        self: &Arc<Self>,
        what: &'static str,
        sql: String,
        line: Line,
    ) -> InFlight {
        let inner = self.clone();
        runtime::handle().spawn(async move {
            let bound = LANDING_BOUND.max(inner.timeout);
            let call = async {
                match resend::send(&inner.pool, &sql).await {
                    Err(failed) if resend::send_again(what, &failed) => {
                        tracing::debug!(error = %failed.error, what, "postgres connection was dead; once more");
                        resend::send_fresh(&inner.pool, &sql).await
                    }
                    other => other.map_err(|failed| failed.error),
                }
            };
            crate::armed::call_with_timeout(bound);
            let answered = tokio::time::timeout(bound, call).await;
            line.leave();
            match answered {
                Ok(result) => result.map_err(|e| backend_error(what, e)),
                Err(_) => Err(timed_out(what, bound)),
            }
        })
    }

    /// Wait for `call` at most the call timeout; on a timeout it goes on running.
    async fn bounded(
        &self,
        what: &'static str,
        call: &mut InFlight,
    ) -> Result<Vec<PgRow>, LockError> {
        // The timeout wakes no parked worker of this runtime.
        crate::armed::call_with_timeout(self.timeout);
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => joined(result),
            Err(_) => Err(timed_out(what, self.timeout)),
        }
    }

    /// One call, awaited within the call timeout: the row it answered, if any.
    pub(super) async fn call(
        self: &Arc<Self>,
        what: &'static str,
        sql: String,
    ) -> Result<Vec<PgRow>, LockError> {
        self.bounded(what, &mut self.spawn_call(what, sql)).await
    }

    /// A waiter leaves: its ticket deleted, a grant it received unseen (either mode) given
    /// back. Returns the (first) holder's remaining TTL.
    pub(super) async fn leave(
        self: &Arc<Self>,
        key: &LockKey,
        ticket: &str,
        token: &Token,
    ) -> Result<Option<Duration>, LockError> {
        let sql = Call::function(self.names.leave())
            .text(key.as_str())
            .text(ticket)
            .text(token.as_str())
            .finish();
        let row = self.call("leave", sql).await?;
        Ok(remaining(int(row.first(), 0)?))
    }

    /// The acquire was granted `fence` while earlier refreshes that timed out are still on
    /// their way. One that lands while the lease is held is a re-entry (the same fence),
    /// harmless; one that lands after the lease was released would take the key anew for
    /// a caller that is gone (a new fence) or register the ticket again (busy), and is
    /// undone by a leave once it has landed.
    fn undo_late(self: &Arc<Self>, cleanup: &mut Cleanup, fence: Fence) {
        if cleanup.in_flight.is_empty() {
            return;
        }
        let in_flight = std::mem::take(&mut cleanup.in_flight);
        let (inner, key, ticket) = (self.clone(), cleanup.key.clone(), cleanup.ticket.clone());
        let token = cleanup.token.clone();
        runtime::handle().spawn(async move {
            for call in in_flight {
                let Ok(Ok(rows)) = call.await else {
                    continue;
                };
                let late = match parse_attempt(rows.first()) {
                    Ok(Attempt::Granted(granted)) => granted != fence,
                    Ok(Attempt::Busy(_)) => true,
                    _ => false,
                };
                if late && let Err(error) = inner.leave(&key, &ticket, &token).await {
                    tracing::debug!(%error, "undoing a late refresh failed; its claim runs out");
                }
            }
        });
    }

    /// An attempt, its ticket `ticket` (if any) registered with `nonce`.
    fn attempt_sql(&self, req: &AcquireRequest, ticket: &str, nonce: &str) -> String {
        Call::function(self.names.acquire())
            .text(req.key.as_str())
            .text(req.token.as_str())
            .int(millis(req.ttl))
            .text(ticket)
            .int(i64::try_from(self.ticket_ttl_ms).unwrap_or(i64::MAX))
            .int(
                req.max_waiters
                    .map_or(-1, |m| i64::try_from(m).unwrap_or(i64::MAX)),
            )
            .int(super::backend::lim(req.mode))
            .text(nonce)
            .text(req.label.as_ref().map_or("", |l| l.as_str()))
            .finish()
    }

    /// The acquire loop.
    pub(super) async fn acquire(self: Arc<Self>, req: AcquireRequest) -> Result<Grant, LockError> {
        let started = Instant::now();
        // `None`: no limit (a wait too long to add to the clock is one).
        let deadline = req.wait.and_then(|w| started.checked_add(w));
        let waiting = req.wait != Some(Duration::ZERO);
        let random = || String::from_utf8_lossy(&crate::key::random_hex()).into_owned();
        // Entered before the first attempt: a grant right after it is heard.
        let mut waiting_entry = waiting.then(|| self.listener.wait());
        let id = waiting_entry
            .as_ref()
            .map_or_else(String::new, |entry| entry.id().to_owned());
        let mut cleanup = Cleanup {
            inner: self.clone(),
            key: req.key.clone(),
            ticket: id.clone(),
            token: req.token.clone(),
            armed: true,
            registered: false,
            unsure: false,
            in_flight: Vec::new(),
        };
        let mut place = req.line.clone();
        // When the attempt that last registered or refreshed our ticket was sent: a hand-off
        // of it came later, so its claim runs from no earlier.
        let mut last_sent = started;
        // A registered waiter's failed refresh does not end its wait while its ticket lives;
        // the error answers a wait that ends while the database is still failing.
        let mut failed: Option<LockError>;
        let mut last_ok = started;
        let ticket_ttl = Duration::from_millis(self.ticket_ttl_ms);
        loop {
            let sent = Instant::now();
            // Calls that timed out earlier and have ended since need no more waiting for.
            cleanup.in_flight.retain(|call| !call.is_finished());
            // In the clean-up's hands while it runs: if this future is dropped mid-call (a
            // caller that stops polling), the call still lands (it may register our ticket,
            // and a release may then hand us the key), and the clean-up waits for it before
            // it leaves.
            // The first attempt carries the acquire's place in line; its task gives it up.
            let line = std::mem::take(&mut place);
            // Whether a grant notified after this attempt is heard: if not, the waiter tries
            // again as soon as the node listens (see `listener`).
            let heard = waiting_entry
                .as_ref()
                .is_some_and(super::listener::Waiting::heard);
            // Each attempt registers anew (a fresh nonce): a grant of an earlier
            // registration is refused from now on (see `listener`).
            let nonce = waiting_entry.as_ref().map_or_else(String::new, |entry| {
                let nonce = random();
                entry.register(&nonce);
                nonce
            });
            let sql = self.attempt_sql(&req, &id, &nonce);
            cleanup
                .in_flight
                .push(self.spawn_call_in_line("acquire", sql, line));
            let reply = {
                let call = cleanup.in_flight.last_mut().expect("pushed just above");
                self.bounded("acquire", call).await
            };
            // Answered or given up (a timed-out attempt still running): the next acquire of
            // the key from this node may go (its ticket queues behind ours; see
            // `AcquireRequest::leave_line`).
            req.leave_line();
            if cleanup.in_flight.last().is_some_and(InFlight::is_finished) {
                // Answered (its outcome is read below): nothing left to wait for. A call that
                // timed out stays, still running, for the clean-up.
                cleanup.in_flight.pop();
            }
            let outcome = match reply.and_then(|row| parse_attempt(row.first())) {
                Ok(outcome) => {
                    cleanup.unsure = false;
                    failed = None;
                    last_ok = sent;
                    Some(outcome)
                }
                Err(e) if cleanup.registered && last_ok.elapsed() < ticket_ttl => {
                    tracing::debug!(error = %e, "postgres waiter's refresh failed; retrying");
                    // It may have landed: the clean-up looks.
                    cleanup.unsure = true;
                    failed = Some(e);
                    None
                }
                Err(e) => {
                    cleanup.unsure = true;
                    return Err(e);
                }
            };
            let retry_after = match outcome {
                None => None,
                Some(Attempt::Granted(fence)) => {
                    cleanup.armed = false;
                    self.undo_late(&mut cleanup, fence);
                    return Ok(Grant::new(fence, sent));
                }
                Some(Attempt::Full(retry_after)) => {
                    // An earlier refresh still on its way (see below) is the clean-up's.
                    cleanup.armed = !cleanup.in_flight.is_empty();
                    return Err(LockError::QueueFull { retry_after });
                }
                Some(Attempt::NotUpgraded) => {
                    // The call removed our ticket; we hold what we held.
                    cleanup.armed = false;
                    return Err(LockError::InvalidValue(
                        "a shared lease held beside others cannot be re-entered alone",
                    ));
                }
                Some(Attempt::Busy(retry_after)) if !waiting => {
                    cleanup.armed = false;
                    return Err(LockError::Busy { retry_after });
                }
                Some(Attempt::Busy(retry_after)) => {
                    cleanup.registered = true;
                    if let Some(entry) = waiting_entry.as_mut() {
                        // The node listens from its first queued waiter on.
                        entry.queued();
                    }
                    last_sent = sent;
                    retry_after
                }
            };
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                let retry_after = match self.leave(&req.key, &id, &req.token).await {
                    Ok(left) => {
                        // A refresh that timed out is still on its way: landing after this
                        // leave, it would register the ticket again (and a release would
                        // hand it the key) or take a key freed meanwhile. The clean-up
                        // waits for it, then leaves once more.
                        cleanup.armed = !cleanup.in_flight.is_empty();
                        left.or(retry_after)
                    }
                    // The clean-up tries again (see `Cleanup`).
                    Err(_) => retry_after,
                };
                if let Some(e) = failed {
                    return Err(e);
                }
                return Err(LockError::TimedOut {
                    waited: started.elapsed(),
                    retry_after,
                });
            }
            let fallback = retry_after
                .map_or(FALLBACK_CAP, |r| r.min(FALLBACK_CAP))
                .max(Duration::from_millis(1));
            let wake_at = deadline.map_or(now + fallback, |d| d.min(now + fallback));
            let Some(entry) = waiting_entry.as_mut() else {
                tokio::time::sleep_until(wake_at).await;
                continue;
            };
            let listens = entry.until_heard_handle();
            tokio::select! {
                handed = entry.granted() => {
                    cleanup.armed = false;
                    self.undo_late(&mut cleanup, Fence::new(handed.fence));
                    // The expiry the release set (the claim our ticket carries), counted from
                    // before the attempt that last registered our ticket: never later than
                    // the database's.
                    return Ok(Grant::new(Fence::new(handed.fence), last_sent).valid_for(handed.claim));
                }
                () = tokio::time::sleep_until(wake_at) => {}
                // Sent before the node listened: a grant notified meanwhile went unheard,
                // and the next attempt finds it (a re-entry).
                () = super::listener::until_heard(listens), if !heard => {}
            }
        }
    }
}

/// A joined call: a task that panicked or was cancelled is a failure of the backend.
fn joined(
    result: Result<Result<Vec<PgRow>, LockError>, tokio::task::JoinError>,
) -> Result<Vec<PgRow>, LockError> {
    result.unwrap_or_else(|e| {
        Err(LockError::Backend(BackendError::new(
            BackendErrorKind::Unavailable,
            format!("postgres call did not finish: {e}"),
        )))
    })
}

/// Column `i` of `row` as a number.
pub(super) fn int(row: Option<&PgRow>, i: usize) -> Result<i64, LockError> {
    let row = row.ok_or_else(|| protocol("a function answered no row"))?;
    row.try_get::<i64, _>(i)
        .or_else(|_| row.try_get::<i32, _>(i).map(i64::from))
        .map_err(|e| backend_error("decode", e))
}

pub(super) fn protocol(what: &str) -> LockError {
    LockError::Backend(BackendError::new(
        BackendErrorKind::Protocol,
        what.to_owned(),
    ))
}

fn parse_attempt(row: Option<&PgRow>) -> Result<Attempt, LockError> {
    let status = int(row, 0)?;
    let value = int(row, 1)?;
    Ok(match status {
        1 => Attempt::Granted(Fence::new(
            u64::try_from(value).map_err(|_| protocol("acquire answered a negative fence"))?,
        )),
        0 => Attempt::Busy(remaining(value)),
        2 => Attempt::Full(remaining(value)),
        4 => Attempt::NotUpgraded,
        _ => return Err(protocol("acquire answered an unknown status")),
    })
}

/// Cleans up after an acquire that ends without handing its outcome to the caller: waits
/// for a call still in flight, then removes the ticket and gives back a grant received
/// unseen. Runs as a task on the engine's runtime, so dropping the acquire never blocks.
struct Cleanup {
    inner: Arc<Inner>,
    key: LockKey,
    ticket: String,
    token: Token,
    armed: bool,
    /// A ticket may be registered (and then a hand-off may have made us the holder).
    registered: bool,
    /// A call failed after it may have landed: we may hold the key unseen.
    unsure: bool,
    /// Calls that timed out and may still land.
    in_flight: Vec<InFlight>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if !self.armed || !(self.registered || self.unsure || !self.in_flight.is_empty()) {
            return;
        }
        let inner = self.inner.clone();
        let key = self.key.clone();
        let ticket = std::mem::take(&mut self.ticket);
        let token = self.token.clone();
        let in_flight = std::mem::take(&mut self.in_flight);
        runtime::handle().spawn(async move {
            for call in in_flight {
                let _ = call.await;
            }
            // A clean-up the database refused is tried again until the ticket would have
            // lapsed anyway; one that timed out was sent and lands when the database
            // answers.
            let give_up = Instant::now() + Duration::from_millis(inner.ticket_ttl_ms);
            loop {
                let Err(error) = inner.leave(&key, &ticket, &token).await else {
                    return;
                };
                let sent = matches!(&error, LockError::Backend(e) if e.kind() == BackendErrorKind::Timeout);
                if sent || Instant::now() + FALLBACK_CAP >= give_up {
                    tracing::debug!(%error, "postgres waiter cleanup failed; its ticket will lapse");
                    return;
                }
                tokio::time::sleep(FALLBACK_CAP).await;
            }
        });
    }
}
