//! One attempt of an acquire: the script call (the first try, a ticket's registration, or
//! its refresh) and what it answered.

use std::time::Duration;

use super::super::{
    FENCE_MARGIN, Inner,
    commands::{Conn, ScriptCall},
    millis,
    names::Names,
    records::Fields,
    remaining,
    scripts::{ACQUIRE, ACQUIRE_OR_RECORD, shared},
    shared::share_args,
};
use crate::{AcquireRequest, BackendError, BackendErrorKind, Fence, LockError, Mode};

pub(super) enum Attempt {
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
    /// Its registered member's deadline as last reported (`None`: not registered).
    pub(super) known: Option<u64>,
    /// The last refresh failed: the member may have been renamed unseen.
    pub(super) renamed: bool,
    /// Only look for a grant made before the wake-up channel was subscribed: the ticket
    /// was registered (or refreshed) by the attempt just before, so it is left as it is.
    pub(super) check: bool,
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
            known,
            renamed,
            check,
        } = ticket;
        let mut inv = match mode {
            Mode::Exclusive if with_record => ScriptCall::new(&ACQUIRE_OR_RECORD, 4),
            Mode::Exclusive => ScriptCall::new(&ACQUIRE, 3),
            _ => ScriptCall::new(&shared::ACQUIRE, 3),
        };
        // By token: a grant that ran already is a re-entry the second time. (A first
        // registration run twice queues a second copy of the ticket, which lapses.)
        inv.repeatable();
        // Flags in one argument (an argument costs an allocation on every attempt).
        // No FIFO flag: every ticket, FIFO or not, is queued in arrival order.
        let mut flags = [0u8; 3];
        let mut n = 0;
        for (set, flag) in [
            (self.contended.seen(names.tag), b'h'),
            // Only after a failed refresh.
            (renamed, b'r'),
            // The lock's script only.
            (check && !mode.is_shared(), b'c'),
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
}
