//! One attempt of an acquire: the script call (the first try, a ticket's registration, or
//! its refresh) and what it answered.

use std::time::Duration;

use super::super::{
    Inner,
    commands::{Conn, ScriptCall},
    millis,
    names::Names,
    records::Fields,
    release::nonce,
    remaining,
    scripts::{ACQUIRE, ACQUIRE_OR_RECORD},
};
use crate::{AcquireRequest, BackendError, BackendErrorKind, Fence, LockError, Mode};

pub(super) enum Attempt {
    Granted(Fence),
    /// A stored record, from the first attempt of [`Inner::acquire_or_record`]: nothing
    /// was acquired.
    Record(Fields),
    /// Not granted; `nonce` names the waiter's registration (0: none registered, or not
    /// told: a look that left the ticket as it was).
    Busy {
        retry_after: Option<Duration>,
        nonce: u64,
    },
    Full(Option<Duration>),
    /// A shared holder asking to hold alone (refused; the script removed our ticket).
    NotUpgraded,
    /// Granted, but fewer replicas than required acknowledged it (`replica_ack`).
    Unacknowledged {
        acked: u64,
        wanted: u32,
    },
}

/// An acquire script's reply: `{status, value, nonce}`, or a stored record's fields
/// (`{3, fp, meta, body, at}`, from [`ACQUIRE_OR_RECORD`]).
pub(super) enum AttemptReply {
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
pub(super) struct TicketState<'a> {
    /// The ticket id (`""`: a plain try).
    pub(super) id: &'a str,
    /// Whether the ticket may be registered (then the script refreshes it, keeping its
    /// nonce and its place).
    pub(super) registered: bool,
    /// Only look for a grant made before the wake-up channel was subscribed: the ticket
    /// was registered (or refreshed) by the attempt just before, so it is left as it is.
    pub(super) check: bool,
}

/// The limit the scripts take: 0 for the lock, a shared request's own (1: alone).
pub(super) fn limit_of(mode: Mode) -> u32 {
    match mode {
        Mode::Shared { limit } => limit.max(1),
        _ => 0,
    }
}

/// A ticket id: 128 random bits in hex, on the stack (no allocation on the request path).
pub(super) struct TicketId([u8; 32]);

impl TicketId {
    pub(super) fn random() -> Self {
        Self(crate::key::random_hex())
    }

    pub(super) fn as_str(&self) -> &str {
        // Hex digits only.
        std::str::from_utf8(&self.0).expect("hex digits are ASCII")
    }
}

impl Inner {
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn attempt(
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
            registered,
            check,
        } = ticket;
        let mut inv = if with_record {
            ScriptCall::new(&ACQUIRE_OR_RECORD, 6)
        } else {
            ScriptCall::new(&ACQUIRE, 5)
        };
        // By token: a grant that ran already is a re-entry the second time; by ticket id, a
        // registration that ran already is found and kept (its nonce and place).
        inv.repeatable();
        // Flags in one argument (an argument costs an allocation on every attempt).
        // No FIFO flag: every ticket, FIFO or not, is queued in arrival order.
        let mut flags = [0u8; 3];
        let mut n = 0;
        for (set, flag) in [
            (self.contended.seen(names.tag), b'h'),
            (registered, b'w'),
            (check && registered, b'c'),
        ] {
            if set {
                flags[n] = flag;
                n += 1;
            }
        }
        inv.key(names.lock())
            .key(names.fence())
            .key(names.queue())
            .key(names.tickets())
            .key(names.holders());
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
            .arg(self.ticket_ttl_ms)
            .arg(nonce())
            .arg(limit_of(mode))
            .arg(req.label.as_ref().map_or("", |l| l.as_str()));
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
        let (status, value, nonce) = match reply {
            AttemptReply::Status(status, value, nonce) => (status, value, nonce),
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
                self.contended.mark(names.tag);
                Attempt::Busy {
                    retry_after: remaining(value),
                    nonce: u64::try_from(nonce).unwrap_or(0),
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
}
