//! The history checker: a soak records every acquisition (process and task, key, mode,
//! token, fence, invocation and completion instants on one monotonic clock, the validity
//! the engine reported) and every write to a fenced register, and independent checks
//! verify the [`History`]:
//!
//! | check | what it verifies |
//! | --- | --- |
//! | [`exclusion`] | no two holders of one key at once where the modes forbid it (a holder alone beside nobody, in either mode; a shared holder granted beside fewer than its own limit), unless the earlier was told its lease was lost (or the key force-released) before the overlap began |
//! | [`fences`] | fences strictly increase in grant order per key, across both modes |
//! | [`register`] | the fenced register ends in a state a sequential execution of its accepted writes explains |
//! | [`fifo`] | FIFO grants follow arrival order for arrivals more than a slack apart |
//!
//! A failed check is a [`Violation`] that prints the minimal window of the history that
//! shows it: the events of the operations involved, nothing else.
//!
//! ```ignore
//! let recorder = Recorder::new();
//! let acquiring = recorder.acquiring(node, task, key, Mode::Exclusive, fifo);
//! let lease = lock.acquire().await?;        // an error: `acquiring` dropped, not granted
//! let holding = acquiring.granted(&lease);
//! // ... the critical section, writes recorded with `recorder.write(..)`
//! holding.releasing(&lease);
//! lease.release().await?;
//! // at the end
//! recorder.history().assert_valid(Some(Duration::from_millis(20)));
//! ```

pub mod exclusion;
pub mod fences;
pub mod fifo;
mod record;
mod recorder;
pub mod register;
#[cfg(test)]
mod sample;
mod violation;

use std::time::Duration;

pub use record::{Acquisition, Grant, History, Mode, Outage, Revocation, Write};
pub use recorder::{Acquiring, Holding, Recorder};
pub use violation::Violation;

impl History {
    /// Every violation of every check; the FIFO check runs with `fifo_slack` when given.
    pub fn violations(&self, fifo_slack: Option<Duration>) -> Vec<Violation> {
        let mut all = exclusion::check(self);
        all.extend(fences::check(self));
        all.extend(register::check(self));
        if let Some(slack) = fifo_slack {
            all.extend(fifo::check(self, slack));
        }
        all
    }

    /// Panics, printing the windows of the first three violations of each check that
    /// failed, unless every check passes.
    pub fn assert_valid(&self, fifo_slack: Option<Duration>) {
        let violations = self.violations(fifo_slack);
        if violations.is_empty() {
            return;
        }
        let mut counts: Vec<(&str, usize)> = Vec::new();
        let mut shown = String::new();
        for v in &violations {
            match counts.iter_mut().find(|(check, _)| *check == v.check) {
                Some((_, n)) => *n += 1,
                None => counts.push((v.check, 1)),
            }
            if counts.iter().any(|&(check, n)| check == v.check && n <= 3) {
                shown.push_str(&v.to_string());
            }
        }
        let counts: Vec<String> = counts.iter().map(|(c, n)| format!("{c}: {n}")).collect();
        panic!(
            "the history of {} acquisitions and {} writes breaks its checks ({}):\n{shown}",
            self.acquisitions.len(),
            self.writes.len(),
            counts.join(", ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::sample::{history, hold, write};
    use super::*;

    #[test]
    fn a_valid_history_passes_every_check() {
        let mut h = history(vec![hold(1, "k", 1, 0, 10, 20), hold(2, "k", 2, 5, 20, 30)]);
        h.writes = vec![write(1, "k", 1, 0, 12, true), write(2, "k", 2, 1, 22, true)];
        h.finals.insert("k".to_owned(), 2);
        assert_eq!(h.violations(Some(Duration::from_millis(1))), vec![]);
        h.assert_valid(None);
    }

    #[test]
    #[should_panic(expected = "exclusion violated: 2 holders of k at once")]
    fn a_history_with_two_holders_at_once_does_not_pass() {
        history(vec![
            hold(1, "k", 1, 0, 10, 50),
            hold(2, "k", 2, 20, 30, 60),
        ])
        .assert_valid(None);
    }
}
