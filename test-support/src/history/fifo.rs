//! The FIFO check: grants of first-come-first-served acquisitions follow arrival order,
//! for arrivals more than a stated slack apart.

use std::time::Duration;

use super::{
    record::{Acquisition, History},
    violation::{Violation, Window, at},
};

/// Every pair of FIFO acquisitions of one key where the later arrival was granted first.
///
/// Arrival is the invocation of `acquire`. The grant order is the order of the fences
/// (which the [`fences`](super::fences) check holds to the grant order): exact where the
/// completion instants are not, for a grant cut by a force release before its caller saw
/// it, or two permits granted in one step and returned in either order. An acquisition
/// invoked more than `slack` after another must hold a higher fence: the slack covers the
/// stretch between calling `acquire` and taking a ticket, where two callers' order is not
/// yet decided. Acquisitions that were not granted (timed out, dropped) have no place in
/// the order and are left out, as are non-FIFO ones and those that waited through an
/// [`Outage`](super::Outage) (the queue they had joined was lost with the backend's state).
pub fn check(history: &History, slack: Duration) -> Vec<Violation> {
    let mut violations = Vec::new();
    let through_outage = |a: &Acquisition| {
        history
            .outages
            .iter()
            .any(|o| a.invoked < o.ended && o.began < a.completed)
    };
    for (key, grants) in history.grants_by_key() {
        let mut fifo: Vec<_> = grants
            .into_iter()
            .filter(|(a, _)| a.fifo && !through_outage(a))
            .collect();
        fifo.sort_by_key(|(a, _)| a.invoked);
        // The last-granted (highest fence) of the acquisitions that arrived more than
        // `slack` before each one.
        let mut latest: Option<usize> = None;
        let mut next = 0;
        for b in 0..fifo.len() {
            let (later, lg) = fifo[b];
            while next < b && fifo[next].0.invoked + slack < later.invoked {
                if latest.is_none_or(|l| fifo[l].1.fence < fifo[next].1.fence) {
                    latest = Some(next);
                }
                next += 1;
            }
            if let Some(l) = latest.filter(|&l| lg.fence < fifo[l].1.fence) {
                let (earlier, eg) = fifo[l];
                let what = format!(
                    "{key}: arrived at {} (more than {slack:?} after an arrival at {}) and was granted first (fence {} < {})",
                    at(later.invoked),
                    at(earlier.invoked),
                    lg.fence,
                    eg.fence
                );
                let window = Window::default().acquisition(earlier).acquisition(later);
                violations.push(window.violation(history, "fifo", what));
            }
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::super::sample::{fifo, history, hold, ms};
    use super::*;

    #[test]
    fn grants_in_arrival_order_pass_and_arrivals_within_the_slack_may_swap() {
        let h = history(vec![
            fifo(hold(1, "k", 1, 0, 1, 10)),
            fifo(hold(2, "k", 2, 2, 10, 20)),
            fifo(hold(3, "k", 4, 8, 30, 40)),
            // Within the slack of task 3.
            fifo(hold(4, "k", 3, 9, 20, 30)),
        ]);
        assert_eq!(check(&h, ms(5)), vec![]);
    }

    #[test]
    fn a_later_arrival_granted_first_is_caught() {
        let h = history(vec![
            fifo(hold(1, "k", 1, 0, 1, 10)),
            fifo(hold(2, "k", 3, 2, 30, 40)),
            fifo(hold(3, "k", 2, 20, 21, 30)),
        ]);
        let v = check(&h, ms(5));
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].what.contains("arrived at +0.020000s"), "{}", v[0]);
        assert!(v[0].window.iter().all(|l| !l.contains("p0/t1")), "{}", v[0]);
    }

    #[test]
    fn a_queue_lost_in_an_outage_leaves_its_waiters_out_of_the_order() {
        let mut h = history(vec![
            fifo(hold(1, "k", 2, 0, 40, 50)),
            fifo(hold(2, "k", 1, 20, 21, 30)),
        ]);
        assert_eq!(check(&h, ms(5)).len(), 1);
        h.outages.push(crate::history::Outage {
            began: ms(10),
            ended: ms(15),
        });
        assert_eq!(check(&h, ms(5)), vec![]);
    }

    #[test]
    fn a_grant_cut_by_a_force_release_before_its_caller_saw_it_still_came_first() {
        // Task 1 was granted fence 1, force-released, and task 2 granted fence 2, all
        // before task 1's acquire returned.
        let h = history(vec![
            fifo(hold(1, "k", 1, 0, 32, 33)),
            fifo(hold(2, "k", 2, 20, 30, 40)),
        ]);
        assert_eq!(check(&h, ms(5)), vec![]);
    }

    #[test]
    fn non_fifo_and_ungranted_acquisitions_are_left_out() {
        let mut gave_up = fifo(hold(1, "k", 1, 0, 50, 60));
        gave_up.grant = None;
        let h = history(vec![
            gave_up,
            hold(2, "k", 2, 2, 40, 45),
            fifo(hold(3, "k", 3, 20, 21, 30)),
        ]);
        assert_eq!(check(&h, ms(5)), vec![]);
    }
}
