//! The acquire wait loop: one script call per attempt, grants delivered by pub/sub between
//! attempts, and the clean-up of an acquire that ends without handing its outcome to the
//! caller.
//!
//! A waiter registers a ticket with its first failed attempt, then waits for its grant:
//! the release script makes it the holder itself and publishes who and which fence, so the
//! message alone completes the acquire. Retries happen only when the wake-up channel was
//! not yet subscribed when the ticket was registered (once the subscription is confirmed:
//! a grant before it went unheard), after a reconnect of the subscriber, or on the
//! fallback timer (at most [`FALLBACK_CAP`] apart), which also refreshes the ticket and
//! finds a grant whose message was lost (the key is already this waiter's: re-entry).

use std::{sync::Arc, time::Duration};

use tokio::time::Instant;

use super::{
    FALLBACK_CAP, FENCE_MARGIN, Inner,
    commands::{Conn, ScriptCall},
    millis,
    names::Names,
    records::{Fields, stored},
    remaining,
    scripts::{ACQUIRE, ACQUIRE_OR_RECORD, LEAVE, LEAVE_SOURCE, RELEASE, shared},
    shared::share_args,
    wakeup::{Subscription, Woken},
};
use crate::{
    AcquireRequest, BackendError, BackendErrorKind, Fence, Grant, GrantOrRecord, LockError, Mode,
    Token,
};

enum Attempt {
    Granted(Fence),
    /// A stored record, from the first attempt of [`Inner::acquire_or_record`]: nothing
    /// was acquired.
    Record(Fields),
    /// Not granted; `deadline` names the waiter's registered ticket (0: none registered).
    Busy {
        retry_after: Option<Duration>,
        deadline: u64,
    },
    Full(Option<Duration>),
    /// A shared re-entry asking to hold alone (a limit of 1) with a token that holds beside
    /// others (refused; the script removed our ticket).
    NotUpgraded,
    /// Granted, but fewer replicas than required acknowledged it (`replica_ack`).
    Unacknowledged {
        acked: u64,
        wanted: u32,
    },
}

/// An acquire script's reply: `{status, value, deadline}`, or a stored record's fields
/// (`{3, fp, meta, body, at}`, from [`ACQUIRE_OR_RECORD`]).
enum AttemptReply {
    Status(i64, i64, i64),
    Record(Fields),
}

impl redis::FromRedisValue for AttemptReply {
    fn from_redis_value(v: redis::Value) -> Result<Self, redis::ParsingError> {
        let redis::Value::Array(items) = v else {
            return Err("acquire reply is not an array".into());
        };
        if items.first() == Some(&redis::Value::Int(3)) {
            let fields = redis::Value::Array(items.into_iter().skip(1).collect());
            return Ok(Self::Record(Fields::from_redis_value(fields)?));
        }
        let (status, value, deadline) =
            <(i64, i64, i64)>::from_redis_value(redis::Value::Array(items))?;
        Ok(Self::Status(status, value, deadline))
    }
}

/// What an attempt tells the script of the waiter's ticket.
struct TicketState<'a> {
    /// The ticket id (`""`: a plain try).
    id: &'a str,
    /// Its registered member's deadline as last reported (`None`: not registered).
    known: Option<u64>,
    /// The last refresh failed: the member may have been renamed unseen.
    renamed: bool,
}

/// A ticket id: 128 random bits in hex, on the stack (no allocation on the request path).
struct TicketId([u8; 32]);

impl TicketId {
    fn random() -> Self {
        Self(crate::key::random_hex())
    }

    fn as_str(&self) -> &str {
        // Hex digits only.
        std::str::from_utf8(&self.0).expect("hex digits are ASCII")
    }
}

/// Cleans up after an acquire that ends without handing its outcome to the caller: removes
/// its ticket and gives back a grant it may have received unseen (one that landed while a
/// call was in flight, or a hand-off nobody waited for any more). Runs as a spawned task,
/// so dropping the acquire future never blocks.
struct Cleanup<'a> {
    inner: &'a Arc<Inner>,
    names: Names<'a>,
    ticket: &'a str,
    token: &'a Token,
    ttl_ms: u64,
    mode: Mode,
    armed: bool,
    /// Whether a ticket may be registered (then a hand-off may have made us the holder).
    registered: bool,
    /// Our ticket's deadline as last reported (`None`: unknown, search for it).
    known: Option<u64>,
    in_flight: bool,
    /// The connection the last attempt went out on: the release must follow it there.
    pinned: Option<Conn>,
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
            // A refresh in flight may have renamed the ticket.
            known: if self.in_flight { None } else { self.known },
            token: self.token.clone(),
            ttl_ms: self.ttl_ms,
            mode: self.mode,
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
            let names = inner.names_in(&key, leaving.mode);
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
    ticket: String,
    known: Option<u64>,
    token: Token,
    ttl_ms: u64,
    mode: Mode,
}

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

    // One argument more than clippy's limit since the loop runs both modes (`mode`).
    #[allow(clippy::too_many_arguments)]
    async fn attempt(
        &self,
        names: Names<'_>,
        req: &AcquireRequest,
        ticket: TicketState<'_>,
        with_record: bool,
        mode: Mode,
        pin: &mut Option<Conn>,
    ) -> Result<Attempt, LockError> {
        let TicketState {
            id: ticket,
            known,
            renamed,
        } = ticket;
        let mut inv = match mode {
            Mode::Exclusive if with_record => ScriptCall::new(&ACQUIRE_OR_RECORD, 4),
            Mode::Exclusive => ScriptCall::new(&ACQUIRE, 3),
            _ => ScriptCall::new(&shared::ACQUIRE, 3),
        };
        // Flags in one argument (an argument costs an allocation on every attempt).
        // No FIFO flag: every ticket, FIFO or not, is queued in arrival order.
        let mut flags = [0u8; 2];
        let mut n = 0;
        for (set, flag) in [
            (self.contended.seen(names.tag), b'h'),
            // Only after a failed refresh.
            (renamed, b'r'),
        ] {
            if set {
                flags[n] = flag;
                n += 1;
            }
        }
        inv.key(names.lock()).key(names.fence()).key(names.queue());
        if with_record {
            inv.key(names.record());
        }
        inv.arg(req.token.as_str())
            .arg(millis(req.ttl))
            .arg(ticket)
            .arg(&flags[..n])
            .arg(
                req.max_waiters
                    .map_or(-1, |m| i64::try_from(m).unwrap_or(i64::MAX)),
            )
            .arg(self.ticket_ttl_ms);
        match known {
            Some(d) => inv.arg(d),
            None => inv.arg(""),
        };
        if mode.is_shared() {
            let (limit, word) = share_args(mode);
            inv.arg(millis(FENCE_MARGIN))
                .arg(limit)
                .arg(word)
                .arg(names.channel());
        }
        let (reply, acked): (AttemptReply, Option<u64>) = match self.replica_ack {
            None => {
                let reply = self.commands.invoke_pinned("acquire", &inv, pin).await;
                (reply.map_err(LockError::Backend)?, None)
            }
            Some(ack) => {
                let reply = self.commands.invoke_acked("acquire", &inv, ack, pin).await;
                let (reply, acked) = reply.map_err(LockError::Backend)?;
                (reply, Some(acked))
            }
        };
        let (status, value, deadline) = match reply {
            AttemptReply::Status(status, value, deadline) => (status, value, deadline),
            AttemptReply::Record(fields) => return Ok(Attempt::Record(fields)),
        };
        Ok(match status {
            1 => match (acked, self.replica_ack) {
                (Some(acked), Some(ack)) if acked < u64::from(ack.replicas) => {
                    Attempt::Unacknowledged {
                        acked,
                        wanted: ack.replicas,
                    }
                }
                _ => Attempt::Granted(Fence::new(u64::try_from(value).unwrap_or(0))),
            },
            0 => {
                // Its next acquire looks at the lock first (see `Contended`).
                if !mode.is_shared() {
                    self.contended.mark(names.tag);
                }
                Attempt::Busy {
                    retry_after: remaining(value),
                    deadline: u64::try_from(deadline).unwrap_or(0),
                }
            }
            2 => Attempt::Full(remaining(value)),
            4 => Attempt::NotUpgraded,
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
        names: Names<'_>,
        leaving: &Leaving,
        pinned: Option<Conn>,
    ) -> Result<Option<Duration>, LockError> {
        let known = leaving.known.map(|d| d.to_string()).unwrap_or_default();
        // The keys and arguments, after `numkeys`.
        let keys_and_args = |cmd: &mut redis::Cmd| {
            cmd.arg(names.lock())
                .arg(names.fence())
                .arg(names.queue())
                .arg(leaving.ticket.as_str())
                .arg(known.as_str())
                .arg(leaving.token.as_str())
                .arg(leaving.ttl_ms)
                .arg("1")
                .arg(names.channel())
                .arg(millis(FENCE_MARGIN))
                .arg(self.ticket_ttl_ms);
            if leaving.mode.is_shared() {
                let (limit, word) = share_args(leaving.mode);
                cmd.arg(limit).arg(word);
            }
        };
        if let Some(mut conn) = pinned {
            // Behind the unseen acquire on its own connection, so it cannot overtake it.
            let mut eval = redis::cmd("EVAL");
            let source = match leaving.mode {
                Mode::Exclusive => LEAVE_SOURCE.as_str(),
                _ => shared::LEAVE_SOURCE.as_str(),
            };
            eval.arg(source).arg(3);
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
        let mut inv = match leaving.mode {
            Mode::Exclusive => ScriptCall::new(&LEAVE, 3),
            _ => ScriptCall::new(&shared::LEAVE, 3),
        };
        keys_and_args(inv.keys_and_args());
        let pttl: i64 = self.call("leave", &inv).await?;
        Ok(remaining(pttl))
    }

    pub(super) async fn acquire(self: Arc<Self>, req: AcquireRequest) -> Result<Grant, LockError> {
        match self.acquire_inner(req, false).await?.0 {
            GrantOrRecord::Grant(grant) => Ok(grant),
            GrantOrRecord::Record(_) => Err(LockError::Backend(BackendError::new(
                BackendErrorKind::Protocol,
                "acquire script answered a record",
            ))),
        }
    }

    /// [`RecordBackend::acquire_or_record`](crate::RecordBackend::acquire_or_record): the
    /// first attempt reads the record in the same script; a grant after a wait reads it
    /// again (the holder before may have completed), and gives the key back if it is there.
    pub(super) async fn acquire_or_record(
        self: Arc<Self>,
        req: AcquireRequest,
    ) -> Result<GrantOrRecord, LockError> {
        let (key, token) = (req.key.clone(), req.token.clone());
        if req.mode.is_shared() {
            // Records live beside the key's lock.
            return Err(LockError::Unsupported("records of shared leases"));
        }
        let (found, at_once) = self.clone().acquire_inner(req, true).await?;
        let grant = match found {
            GrantOrRecord::Grant(grant) if !at_once => grant,
            decided => return Ok(decided),
        };
        let names = self.names(&key);
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(names.record())
            .arg("fp")
            .arg("meta")
            .arg("body")
            .arg("at");
        let read = self.commands.query::<Fields>("record", &cmd).await;
        let fields = match read {
            Ok(fields) => fields,
            Err(e) => {
                self.give_back(names, &token).await;
                return Err(LockError::Backend(e));
            }
        };
        match stored(fields.0, fields.1, fields.2, fields.3) {
            Ok(None) => Ok(GrantOrRecord::Grant(grant)),
            Ok(Some(record)) => {
                self.give_back(names, &token).await;
                Ok(GrantOrRecord::Record(record))
            }
            Err(e) => {
                self.give_back(names, &token).await;
                Err(e)
            }
        }
    }

    /// Release a grant nobody will use (best effort: the lease's TTL frees it otherwise).
    async fn give_back(&self, names: Names<'_>, token: &Token) {
        let mut inv = super::release::release_call(&RELEASE, names, 0);
        super::release::release_args(&mut inv, names, token);
        match self.call::<i64>("release", &inv).await {
            Ok(code) => self.released(names, code),
            Err(error) => tracing::debug!(%error, "giving back a grant failed; its TTL frees it"),
        }
    }

    /// The acquire loop. With `with_record`, the first attempt also reads the record
    /// ([`ACQUIRE_OR_RECORD`]). Also says whether the first attempt decided.
    async fn acquire_inner(
        self: Arc<Self>,
        req: AcquireRequest,
        with_record: bool,
    ) -> Result<(GrantOrRecord, bool), LockError> {
        let mode = req.mode;
        let started = Instant::now();
        let mut first = true;
        let deadline = req.wait.map(|w| started + w);
        let waiting = req.wait != Some(Duration::ZERO);
        let names = self.names_in(&req.key, mode);
        // The wake-up channel's name, made only when the first attempt did not decide.
        let mut channel: Option<String> = None;
        let id = TicketId::random();
        let ticket = if waiting { id.as_str() } else { "" };
        let ttl_ms = millis(req.ttl);
        let mut cleanup = Cleanup {
            inner: &self,
            names,
            ticket,
            token: &req.token,
            ttl_ms,
            mode,
            armed: true,
            registered: false,
            known: None,
            in_flight: false,
            pinned: None,
        };
        let mut subscription: Option<Subscription> = None;
        // When the attempt that registered (or last refreshed) our ticket was sent: a
        // hand-off of that ticket happened later, so its claim runs from no earlier.
        let mut last_sent = started;
        // Whether the last wait ended on the fallback timer, not on a wake-up.
        let mut by_timer = false;
        // A registered waiter's failed refresh (a timeout, a server busy or failing over for
        // a moment) does not end its wait: it is retried on the next fallback period while
        // the ticket lives (a ticket TTL after the last refresh that got through; after
        // that its place is gone anyway). The error is kept to answer a wait that ends
        // while the backend is still failing.
        let mut failed: Option<LockError> = None;
        let mut last_ok = started;
        loop {
            // Where the wake-up channel stands before this attempt goes out (see `covered`).
            let mark = match &subscription {
                None if waiting => names.channel().with_str(|c| self.wakeup.mark(c)),
                _ => None,
            };
            cleanup.in_flight = true;
            // Taken before sending: the TTL cannot have started on the server any earlier.
            let sent = Instant::now();
            // On error the cleanup stays armed with `in_flight`: the grant may have landed,
            // or a refresh renamed our ticket (the script finds it again by its id).
            let outcome = match self
                .attempt(
                    names,
                    &req,
                    TicketState {
                        id: ticket,
                        known: cleanup.known,
                        renamed: failed.is_some(),
                    },
                    with_record && first,
                    mode,
                    &mut cleanup.pinned,
                )
                .await
            {
                Ok(outcome) => Some(outcome),
                Err(e)
                    if cleanup.registered
                        && last_ok.elapsed() < Duration::from_millis(self.ticket_ttl_ms) =>
                {
                    tracing::debug!(
                        channel = %names.channel(),
                        error = %e,
                        "lock waiter's refresh failed; retrying within its wait"
                    );
                    failed = Some(e);
                    None
                }
                Err(e) => return Err(e),
            };
            if outcome.is_some() {
                cleanup.in_flight = false;
                failed = None;
                last_ok = sent;
            }
            // Kept for the clean-up while the call it went out with is unresolved.
            let pinned = if cleanup.in_flight {
                None
            } else {
                cleanup.pinned.take()
            };
            let retry_after = match outcome {
                // The refresh failed: wait for a wake-up or the fallback period, then retry.
                None => None,
                Some(Attempt::Record(fields)) => {
                    cleanup.armed = false;
                    return match stored(fields.0, fields.1, fields.2, fields.3)? {
                        Some(record) => Ok((GrantOrRecord::Record(record), true)),
                        None => Err(LockError::Backend(BackendError::new(
                            BackendErrorKind::Protocol,
                            "acquire script answered an empty record",
                        ))),
                    };
                }
                Some(Attempt::Granted(fence)) => {
                    cleanup.armed = false;
                    if by_timer && !subscription.as_ref().is_some_and(Subscription::granted) {
                        // A hand-off whose message has not come (lost, or just late), or a
                        // lease that ran out: found at the cost of up to FALLBACK_CAP.
                        tracing::debug!(
                            channel = %names.channel(),
                            "lock granted on the fallback timer's retry, not by a wake-up"
                        );
                    }
                    return Ok((GrantOrRecord::Grant(Grant::new(fence, sent)), first));
                }
                Some(Attempt::Unacknowledged { acked, wanted }) => {
                    // Give the grant back (and drop our ticket) behind the script, on its
                    // connection; if that fails, the cleanup retries it in the background.
                    let leaving = Leaving {
                        ticket: ticket.to_owned(),
                        known: None,
                        token: req.token.clone(),
                        ttl_ms,
                        mode,
                    };
                    cleanup.in_flight = true;
                    if self.leave(names, &leaving, pinned).await.is_ok() {
                        cleanup.armed = false;
                    }
                    return Err(LockError::Backend(BackendError::new(
                        BackendErrorKind::NotReplicated,
                        format!(
                            "{acked} of {wanted} replicas acknowledged the grant in time; released"
                        ),
                    )));
                }
                Some(Attempt::Full(retry_after)) => {
                    // Nothing was registered by this call; an earlier registration expired.
                    cleanup.armed = false;
                    return Err(LockError::QueueFull { retry_after });
                }
                Some(Attempt::NotUpgraded) => {
                    cleanup.armed = false;
                    return Err(LockError::InvalidValue(
                        "a shared lease held beside others cannot be re-entered alone",
                    ));
                }
                Some(Attempt::Busy { retry_after, .. }) if !waiting => {
                    cleanup.armed = false;
                    return Err(LockError::Busy { retry_after });
                }
                Some(Attempt::Busy {
                    retry_after,
                    deadline,
                }) => {
                    cleanup.registered = true;
                    cleanup.known = Some(deadline);
                    last_sent = sent;
                    retry_after
                }
            };
            first = false;
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                let leaving = Leaving {
                    ticket: ticket.to_owned(),
                    // After a failed refresh our ticket may have been renamed: search.
                    known: if cleanup.in_flight {
                        None
                    } else {
                        cleanup.known
                    },
                    token: req.token.clone(),
                    ttl_ms,
                    mode,
                };
                // Behind a failed refresh on its connection, so it cannot overtake it.
                let behind = cleanup.in_flight.then(|| cleanup.pinned.take()).flatten();
                let left = self.leave(names, &leaving, behind).await;
                let retry_after = match left {
                    Ok(left) => {
                        cleanup.armed = false;
                        left.or(retry_after)
                    }
                    // The clean-up retries it in the background (see `Cleanup`).
                    Err(_) => retry_after,
                };
                // A wait that ended while the backend was failing says so.
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
            let woken = match subscription.as_ref() {
                Some(sub) => woken_by(sub, wake_at).await,
                None => {
                    let channel = channel.get_or_insert_with(|| names.channel().to_string());
                    let sub = self.wakeup.subscribe(channel, ticket, mark);
                    let woken = if sub.covered() {
                        // Subscribed since before the attempt: a grant after it is heard.
                        woken_by(&sub, wake_at).await
                    } else {
                        // Retry once the subscription is confirmed: a grant before it was
                        // unheard (the retry finds it: re-entry), one after it is heard.
                        tokio::select! {
                            woken = sub.woken() => Some(woken),
                            _ = sub.confirmed() => None,
                            _ = tokio::time::sleep_until(wake_at) => None,
                        }
                    };
                    subscription = Some(sub);
                    woken
                }
            };
            by_timer = woken.is_none() && Instant::now() >= wake_at;
            // A grant of the ticket as we registered it last, or as a later refresh whose
            // reply we never saw renamed it (its deadline is later still): either way the
            // hand-off came after the attempt sent at `last_sent`. (One naming an older
            // registration is stale: its claim may be over.)
            if let Some(Woken::Granted {
                deadline,
                fence,
                px,
            }) = woken
                && cleanup.known.is_some_and(|known| deadline >= known)
            {
                if self.replica_ack.is_some() {
                    // Handed over by a release, which waited for no replica: confirm it
                    // with one more attempt (re-entry, the full lease) and its WAIT.
                    continue;
                }
                cleanup.armed = false;
                // The expiry the releasing script set (the claim period our ticket carries),
                // counted from before the attempt that registered the ticket it granted: never
                // later than the server's. Not our own settings: the server decided.
                let valid = Duration::from_millis(px);
                let grant = Grant::new(Fence::new(fence), last_sent).valid_for(valid);
                return Ok((GrantOrRecord::Grant(grant), false));
            }
        }
    }
}

/// The next wake-up of `sub`, or `None` when `at` comes first.
async fn woken_by(sub: &Subscription, at: Instant) -> Option<Woken> {
    tokio::select! {
        woken = sub.woken() => Some(woken),
        _ = tokio::time::sleep_until(at) => None,
    }
}
