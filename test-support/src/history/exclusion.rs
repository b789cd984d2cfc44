//! The exclusion check: no two holders of one key at once in real time where the promise
//! of the two modes on one key forbids it, except where the earlier holder had been told
//! its lease was lost (or the key was force-released) before the overlap began.
//!
//! The promise, per grant: a holder alone ([`Mode::Exclusive`]: the key's lock, or a
//! shared lease with a limit of 1) is granted only when nobody holds the key, in either
//! mode; a shared holder with limit `n` only when nobody holds alone and fewer than `n`
//! hold (each request brings its own limit, so a holder with a lower limit may later see
//! more beside it, granted to requests with higher ones). Holders that hold at one
//! instant were each granted while all those with lower fences held (the
//! [`fences`](super::fences) check holds fences to the grant order), which is how each
//! grant's company is known without knowing its exact instant.

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
                let (broken, others) = what;
                let mut window = Window::default().acquisition(grants[broken].0);
                for &o in &others {
                    window = window.acquisition(grants[o].0);
                }
                let what = format!(
                    "{} holders of {key} at once from {} ({}), none told its lease was lost before",
                    others.len() + 1,
                    at(t),
                    describe(grants[broken].0.mode),
                );
                violations.push(window.violation(history, "exclusion", what));
            }
            active.push(i);
        }
    }
    violations
}

/// Whether `newcomer`, holding beside `active` (all of them at one instant), shows a
/// grant that broke the promise: that grant, and the holders that held when it was made.
///
/// Ordered by fence, each of them was granted while every one before it held. A grant
/// breaks the promise when a holder alone was among those before it, when it holds alone
/// itself and any was, or when it is shared with a limit of at most their number. Only
/// grants whose company includes the newcomer are judged (the others were, when the last
/// of their company began to hold).
fn conflict(
    grants: &[(&Acquisition, &Grant)],
    active: &[usize],
    newcomer: usize,
) -> Option<(usize, Vec<usize>)> {
    let mut all: Vec<usize> = active.iter().copied().chain([newcomer]).collect();
    all.sort_by_key(|&j| grants[j].1.fence);
    let joined = all.iter().position(|&j| j == newcomer)?;
    (joined..all.len()).find_map(|rank| {
        let (before, m) = (&all[..rank], all[rank]);
        let alone_before = before.iter().any(|&j| {
            matches!(
                grants[j].0.mode,
                Mode::Exclusive | Mode::Shared { limit: 1 }
            )
        });
        let broken = alone_before
            || match grants[m].0.mode {
                Mode::Exclusive => rank > 0,
                Mode::Shared { limit } => rank >= limit,
            };
        broken.then(|| (m, before.to_vec()))
    })
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
    fn each_grant_is_judged_by_its_own_limit_and_the_holders_before_it() {
        let at = |task, fence, limit, done| shared(hold(task, "k", fence, 0, done, 100), limit);
        // Two, then two more that allow four: each request brings its own limit.
        let h = history(vec![at(1, 1, 2, 10), at(2, 2, 4, 20), at(3, 3, 4, 30)]);
        assert_eq!(check(&h), vec![]);
        // The first granted returning last: judged by its fence, not its return.
        let h = history(vec![at(1, 1, 2, 50), at(2, 2, 4, 20), at(3, 3, 4, 30)]);
        assert_eq!(check(&h), vec![]);
        // A limit of 2 granted beside two: caught, with the two before it.
        let h = history(vec![at(1, 1, 4, 10), at(2, 2, 4, 20), at(3, 3, 2, 30)]);
        let v = check(&h);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].what.contains("(shared, at most 2)"), "{}", v[0]);
        assert_eq!(v[0].window.len(), 9, "{}", v[0]);
        // The same, its acquire returning first: still the grant that broke it.
        let h = history(vec![at(1, 1, 4, 10), at(2, 2, 4, 40), at(3, 3, 2, 30)]);
        assert_eq!(check(&h).len(), 1);
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
