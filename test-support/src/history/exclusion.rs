//! The exclusion check: no two holders of one key at once in real time (for permits, never
//! more than N, never an exclusive holder beside anyone), except where the earlier holder
//! had been told its lease was lost (or the key was force-released) before the overlap
//! began.

use std::time::Duration;

use super::{
    record::{Acquisition, Grant, History, Mode},
    violation::{Violation, Window, at},
};

/// Every overlap of holders that breaks the key's mode.
///
/// A holder holds from the completion of its acquire (before it, the grant may not have
/// happened yet) until the earliest of: its release was invoked, it was told its lease was
/// lost, the key was force-released. Only holds that certainly overlap are reported.
pub fn check(history: &History) -> Vec<Violation> {
    let mut violations = Vec::new();
    let history_end = history.end();
    for (key, grants) in history.grants_by_key() {
        // (instant, is a start, index): at one instant ends come first, so a hand-off
        // within the same microsecond is no overlap.
        let mut events: Vec<(Duration, bool, usize)> = Vec::new();
        for (i, (a, g)) in grants.iter().enumerate() {
            let end = history.hold_end(a, g, history_end);
            if end > a.completed {
                events.push((a.completed, true, i));
                events.push((end, false, i));
            }
        }
        events.sort_by_key(|&(t, start, i)| (t, start, i));
        let mut active: Vec<usize> = Vec::new();
        for (t, start, i) in events {
            if !start {
                active.retain(|&j| j != i);
                continue;
            }
            if let Some(what) = conflict(&grants, &active, i) {
                let (newcomer, others) = what;
                let mut window = Window::default().acquisition(grants[newcomer].0);
                for &o in &others {
                    window = window.acquisition(grants[o].0);
                }
                let what = format!(
                    "{} holders of {key} at once from {} ({}), none told its lease was lost before",
                    others.len() + 1,
                    at(t),
                    describe(grants[newcomer].0.mode),
                );
                violations.push(window.violation(history, "exclusion", what));
            }
            active.push(i);
        }
    }
    violations
}

/// Whether `newcomer` may not hold beside `active`: the newcomer and the holders it
/// conflicts with.
fn conflict(
    grants: &[(&Acquisition, &Grant)],
    active: &[usize],
    newcomer: usize,
) -> Option<(usize, Vec<usize>)> {
    let mode = grants[newcomer].0.mode;
    let exclusive = active
        .iter()
        .copied()
        .find(|&j| grants[j].0.mode == Mode::Exclusive);
    match (mode, exclusive) {
        // Anyone beside an exclusive holder: the two of them.
        (_, Some(j)) => Some((newcomer, vec![j])),
        // An exclusive holder beside anyone: it and the earliest granted of the others.
        (Mode::Exclusive, None) => {
            let first = active
                .iter()
                .copied()
                .min_by_key(|&j| grants[j].0.completed)?;
            Some((newcomer, vec![first]))
        }
        // One shared holder too many: all of them.
        (Mode::Shared { limit }, None) => {
            let limit = active
                .iter()
                .filter_map(|&j| match grants[j].0.mode {
                    Mode::Shared { limit } => Some(limit),
                    Mode::Exclusive => None,
                })
                .chain([limit])
                .min()
                .unwrap_or(limit);
            (active.len() + 1 > limit).then(|| (newcomer, active.to_vec()))
        }
    }
}

fn describe(mode: Mode) -> String {
    match mode {
        Mode::Exclusive => "an exclusive holder beside another".to_owned(),
        Mode::Shared { limit } => format!("shared, at most {limit}"),
    }
}

#[cfg(test)]
mod tests {
    use super::super::sample::{history, hold, lost_at, revocation, shared};
    use super::*;

    #[test]
    fn two_exclusive_holders_overlapping_are_caught_with_both_in_the_window() {
        let h = history(vec![
            hold(1, "k", 1, 0, 10, 50),
            hold(2, "k", 2, 20, 30, 60),
        ]);
        let v = check(&h);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].check, "exclusion");
        assert!(
            v[0].what.contains("2 holders of k at once from +0.030000s"),
            "{}",
            v[0]
        );
        // The window: both holds, every event of each, nothing else.
        assert_eq!(v[0].window.len(), 6, "{}", v[0]);
        assert!(v[0].window[0].starts_with("+0.000000s p0/t1 k exclusive: acquire invoked"));
    }

    #[test]
    fn a_hand_off_and_holders_of_other_keys_are_no_overlap() {
        let h = history(vec![
            hold(1, "k", 1, 0, 10, 30),
            hold(2, "k", 2, 5, 30, 60),
            hold(3, "other", 3, 0, 12, 40),
        ]);
        assert_eq!(check(&h), vec![]);
    }

    #[test]
    fn an_overlap_after_the_earlier_holder_was_told_it_lost_its_lease_is_allowed() {
        let h = history(vec![
            lost_at(hold(1, "k", 1, 0, 10, 80), 25),
            hold(2, "k", 2, 20, 30, 60),
        ]);
        assert_eq!(check(&h), vec![]);
    }

    #[test]
    fn an_overlap_that_began_before_the_holder_was_told_is_caught() {
        let h = history(vec![
            lost_at(hold(1, "k", 1, 0, 10, 80), 35),
            hold(2, "k", 2, 20, 30, 60),
        ]);
        assert_eq!(check(&h).len(), 1);
    }

    #[test]
    fn a_force_release_ends_the_earlier_hold() {
        let mut h = history(vec![
            hold(1, "k", 1, 0, 10, 80),
            hold(2, "k", 2, 20, 30, 60),
        ]);
        h.revocations.push(revocation("k", 25));
        assert_eq!(check(&h), vec![]);
    }

    #[test]
    fn a_grant_in_flight_across_a_force_release_may_have_been_cut_by_it() {
        // Task 1 was granted (fence 1) before the force release, its acquire returning
        // only after task 2 was granted the freed key.
        let mut h = history(vec![hold(1, "k", 1, 0, 32, 40), hold(2, "k", 2, 5, 30, 60)]);
        h.revocations.push(revocation("k", 25));
        assert_eq!(check(&h), vec![]);
    }

    #[test]
    fn a_hold_never_released_lasts_to_the_end_of_the_history() {
        let mut h = history(vec![hold(1, "k", 1, 0, 10, 0), hold(2, "k", 2, 20, 30, 60)]);
        h.acquisitions[0].grant.as_mut().unwrap().released = None;
        assert_eq!(check(&h).len(), 1);
    }

    #[test]
    fn permits_admit_n_and_catch_the_one_more() {
        let two = |task, inv| shared(hold(task, "k", task.into(), inv, inv + 1, 100), 2);
        assert_eq!(check(&history(vec![two(1, 0), two(2, 10)])), vec![]);
        let v = check(&history(vec![two(1, 0), two(2, 10), two(3, 20)]));
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].what.starts_with("3 holders of k"), "{}", v[0]);
        assert_eq!(v[0].window.len(), 9, "{}", v[0]);
    }

    #[test]
    fn an_exclusive_permit_beside_a_shared_one_is_caught_either_way_round() {
        let reader = shared(hold(1, "k", 1, 0, 10, 50), 3);
        let writer = hold(2, "k", 2, 20, 30, 60);
        assert_eq!(check(&history(vec![reader, writer])).len(), 1);
        let writer = hold(3, "k", 3, 0, 5, 50);
        let reader = shared(hold(4, "k", 4, 20, 30, 60), 3);
        assert_eq!(check(&history(vec![writer, reader])).len(), 1);
    }
}
