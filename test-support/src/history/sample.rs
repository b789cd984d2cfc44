//! Hand-written histories for the checks' unit tests: instants in milliseconds.

use std::time::Duration;

use super::record::{Acquisition, Grant, History, Mode, Revocation, Write};

pub(super) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A granted exclusive hold of `key` by task `task`: invoked at `inv`, granted at `grant`,
/// released at `release`.
pub(super) fn hold(
    task: u32,
    key: &str,
    fence: u64,
    inv: u64,
    grant: u64,
    release: u64,
) -> Acquisition {
    Acquisition {
        process: 0,
        task,
        key: key.to_owned(),
        mode: Mode::Exclusive,
        fifo: false,
        invoked: ms(inv),
        completed: ms(grant),
        grant: Some(Grant {
            token: format!("t{task}"),
            fence,
            granted_until: ms(grant + 1_000),
            lost_at: None,
            released: Some(ms(release)),
        }),
    }
}

pub(super) fn shared(mut a: Acquisition, limit: usize) -> Acquisition {
    a.mode = Mode::Shared { limit };
    a
}

pub(super) fn fifo(mut a: Acquisition) -> Acquisition {
    a.fifo = true;
    a
}

pub(super) fn lost_at(mut a: Acquisition, at: u64) -> Acquisition {
    a.grant.as_mut().unwrap().lost_at = Some(ms(at));
    a
}

pub(super) fn write(task: u32, key: &str, fence: u64, read: u64, at: u64, accepted: bool) -> Write {
    Write {
        process: 0,
        task,
        key: key.to_owned(),
        fence,
        read,
        value: read + 1,
        accepted,
        invoked: ms(at),
        completed: ms(at + 1),
    }
}

pub(super) fn revocation(key: &str, at: u64) -> Revocation {
    Revocation {
        key: key.to_owned(),
        invoked: ms(at),
        completed: ms(at + 1),
    }
}

pub(super) fn history(acquisitions: Vec<Acquisition>) -> History {
    History {
        acquisitions,
        ..History::default()
    }
}
