//! The figures derived from the per-key grant logs: hand-off and wait percentiles,
//! overtakes, the longest run of one worker, fence regressions.

use std::time::{Duration, Instant};

use crate::support::{Percentiles, micros, percentiles, round};
use crate::turns::Cycle;

/// The figures derived from the per-key grant logs.
pub(crate) struct Analysis {
    pub(crate) cycles: usize,
    pub(crate) handoffs: Vec<f64>,
    pub(crate) waits: Vec<f64>,
    pub(crate) overtakes: u64,
    pub(crate) overtakes_strict: u64,
    /// Overtakes counted from the calls' starts alone: also counts a call whose thread
    /// stalled (was preempted) between reading the clock and taking its place in line.
    pub(crate) overtakes_by_call_start: u64,
    /// Per cycle, from the acquire's call to the end of its first poll (µs).
    pub(crate) entries: Vec<f64>,
    pub(crate) longest_run: usize,
    pub(crate) fence_regressions: u64,
    /// Where overtaking grants sit in their key's grant order (the first 20): at the start
    /// of a run they are start-up races; later they are the engine's.
    pub(crate) overtake_positions: Vec<usize>,
}

pub(crate) fn analyse(logs: &[Vec<Cycle>], slack: Duration) -> Analysis {
    let mut a = Analysis {
        cycles: 0,
        handoffs: Vec::new(),
        waits: Vec::new(),
        overtakes: 0,
        overtakes_strict: 0,
        overtakes_by_call_start: 0,
        entries: Vec::new(),
        longest_run: 0,
        fence_regressions: 0,
        overtake_positions: Vec::new(),
    };
    for log in logs {
        a.cycles += log.len();
        a.waits
            .extend(log.iter().map(|c| micros(c.granted - c.arrival)));
        a.entries
            .extend(log.iter().map(|c| micros(c.entered - c.arrival)));
        let mut run = 0;
        for (i, c) in log.iter().enumerate() {
            match i.checked_sub(1).map(|j| &log[j]) {
                Some(prev) if prev.worker == c.worker => run += 1,
                Some(prev) => {
                    run = 1;
                    // Clamped at 0: the next holder's clock read may land a hair before
                    // the previous holder's on another core, never meaningfully so.
                    a.handoffs.push(micros(
                        c.granted.saturating_duration_since(prev.release_call),
                    ));
                }
                None => run = 1,
            }
            if let Some(prev) = i.checked_sub(1).map(|j| &log[j])
                && let (Some(fence), Some(before)) = (c.fence, prev.fence)
                && fence <= before
            {
                a.fence_regressions += 1;
            }
            a.longest_run = a.longest_run.max(run);
        }
        // A grant overtakes if some cycle granted after it was already in line (its
        // acquire's first poll had returned) before this one's acquire was called: calls
        // whose intervals overlap have no order to keep. The earliest entry among the
        // later grants (a suffix minimum) answers that for every grant in one pass.
        let mut earliest_later: Option<(Instant, Instant)> = None;
        let mut positions = Vec::new();
        for (i, c) in log.iter().enumerate().rev() {
            if let Some((entered, arrived)) = earliest_later {
                if entered < c.arrival {
                    a.overtakes_strict += 1;
                }
                if entered + slack < c.arrival {
                    a.overtakes += 1;
                    positions.push(i);
                }
                if arrived + slack < c.arrival {
                    a.overtakes_by_call_start += 1;
                }
            }
            earliest_later = Some(match earliest_later {
                None => (c.entered, c.arrival),
                Some((e, a)) => (e.min(c.entered), a.min(c.arrival)),
            });
        }
        positions.reverse();
        a.overtake_positions.extend(positions);
    }
    a.overtake_positions.truncate(20);
    a
}

pub(crate) fn p(sample: &[f64], pick: impl Fn(&Percentiles) -> f64) -> Option<f64> {
    percentiles(&mut sample.to_vec()).map(|ps| round(pick(&ps), 1))
}
