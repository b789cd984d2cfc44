//! [`Holds`]: the requests of one layer that hold their key on this node now, so that the
//! holding gauge, the oldest-hold gauge and the long-hold log line follow the leases
//! themselves rather than the requests' ends.
//!
//! A request's lease can be lost while its request still runs (an operator's forced
//! release, a backend reset, a renewal that found the key gone): from then on the request
//! holds nothing, whatever its handler does, so it must leave `requests_holding` at once,
//! not when its handler finally returns (a hung handler never does). Nothing polls a hung
//! request, so one watch task per layer, on the engine's own runtime, looks at the layer's
//! holds every [`TICK`] while any is registered (and stops when none is): it takes the lost
//! ones out of the gauge and counts them lost, sets the oldest-hold gauge, and logs a hold
//! that outlasted the layer's threshold while it is still held. A snapshot looks at them
//! too, so what a snapshot reads is exact at its instant.

use std::{
    sync::{Mutex, Weak},
    time::Duration,
};

use tokio::time::Instant;

use crate::engine::{LostSignal, runtime};

/// How often the watch task looks at a layer's holds while it has any: the resolution of
/// the oldest-hold gauge, and at most how late a lost lease leaves the holding gauge
/// exported through the `metrics` facade (a scrape every 15 s or so never sees the lag).
pub(crate) const TICK: Duration = Duration::from_secs(1);

/// Where a hold is in its layer's [`Holds`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HoldId(usize);

/// What the log lines of a hold name: its key (in `lost`), fence and holder label, and the
/// request's span, entered to log a long hold from the watch task.
pub(crate) struct HoldFacts {
    pub(crate) lost: LostSignal,
    pub(crate) fence: u64,
    pub(crate) label: Option<tower_lock_engine::HolderLabel>,
    /// The request's span where the grant was logged, and the subscriber it was logged
    /// to, for the lines logged away from the request (`None`: kept only when `debug` is
    /// on or the layer has a long-hold threshold).
    pub(crate) span: Option<(tracing::Span, tracing::Dispatch)>,
}

/// One current hold.
struct Entry {
    facts: HoldFacts,
    granted: Instant,
    /// Its lease was found lost: no longer in the holding gauge, counted lost once.
    lost: bool,
    /// Logged as held past the threshold.
    long_logged: bool,
}

/// A hold taken out at its request's end: whether the watch task already took it out of
/// the holding gauge (its lease was lost) and its facts, for the release log line.
pub(crate) struct Ended {
    pub(crate) already_lost: bool,
    pub(crate) facts: HoldFacts,
}

/// What one look at the holds found.
#[derive(Default)]
pub(super) struct Look {
    /// Holds whose lease was found lost at this look (each is found once).
    pub(super) newly_lost: u32,
    /// How long the oldest hold whose lease is not lost has lasted.
    pub(super) oldest: Option<Duration>,
    /// Holds whose lease is not lost, now.
    pub(super) holding: u64,
}

#[derive(Default)]
struct Slots {
    entries: Vec<Option<Entry>>,
    free: Vec<usize>,
    len: usize,
    /// A watch task is running for these holds (set and cleared under the lock, so that a
    /// hold registered while the task decides to stop starts a new one).
    watched: bool,
}

/// The current holds of one layer on this node.
#[derive(Default)]
pub(super) struct Holds {
    slots: Mutex<Slots>,
}

impl Holds {
    /// Register a hold granted at `granted`; `true` if no watch task runs for the holds
    /// (the caller starts one: [`watch`]).
    pub(super) fn begin(&self, facts: HoldFacts, granted: Instant) -> (HoldId, bool) {
        let entry = Entry {
            facts,
            granted,
            lost: false,
            long_logged: false,
        };
        let mut s = self.slots.lock().unwrap();
        let at = match s.free.pop() {
            Some(at) => {
                s.entries[at] = Some(entry);
                at
            }
            None => {
                s.entries.push(Some(entry));
                s.entries.len() - 1
            }
        };
        s.len += 1;
        let start = !std::mem::replace(&mut s.watched, true);
        (HoldId(at), start)
    }

    /// Take out the hold `id` (its request ended).
    pub(super) fn end(&self, id: HoldId) -> Option<Ended> {
        let mut s = self.slots.lock().unwrap();
        let entry = s.entries.get_mut(id.0)?.take()?;
        s.free.push(id.0);
        s.len -= 1;
        Some(Ended {
            already_lost: entry.lost,
            facts: entry.facts,
        })
    }

    /// Look at every hold now: mark the newly lost ones (logged lost here, within their
    /// request's span when kept), log once each hold past `long` (when set), and measure the
    /// oldest one. With `stop_if_empty` (the watch task), no holds clear `watched` and the
    /// answer is `None`: the task stops.
    pub(super) fn look(&self, long: Option<Duration>, stop_if_empty: bool) -> Option<Look> {
        let now = Instant::now();
        let mut s = self.slots.lock().unwrap();
        if stop_if_empty && s.len == 0 {
            s.watched = false;
            return None;
        }
        let mut look = Look::default();
        for entry in s.entries.iter_mut().flatten() {
            if entry.lost {
                continue;
            }
            let held = now.saturating_duration_since(entry.granted);
            if entry.facts.lost.is_lost_at(now) {
                entry.lost = true;
                look.newly_lost += 1;
                crate::integration::hold_log::lost_while_held(&entry.facts, held);
                continue;
            }
            look.holding += 1;
            look.oldest = look.oldest.max(Some(held));
            if let Some(long) = long
                && held >= long
                && !entry.long_logged
            {
                entry.long_logged = true;
                crate::integration::hold_log::still_held(&entry.facts, held);
            }
        }
        Some(look)
    }
}

/// Start the watch task of the holds behind `metrics` on the engine's runtime: a look every
/// [`TICK`] until the layer is gone or holds nothing at a look.
pub(super) fn watch(metrics: Weak<super::Inner>) {
    runtime::handle().spawn(async move {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is at once: the hold that started the task is new.
        tick.tick().await;
        loop {
            tick.tick().await;
            let Some(inner) = metrics.upgrade() else {
                return;
            };
            if (super::LockMetrics { inner }).look(true).is_none() {
                return;
            }
        }
    });
}
