//! The fence check: fences strictly increase in grant order per key.

use std::collections::BTreeMap;

use super::{
    record::History,
    violation::{Violation, Window},
};

/// Every pair of grants of one key whose fences do not increase in grant order: a grant
/// that completed before another was invoked was certainly granted first, so its fence
/// must be lower; and no two grants of a key share a fence, whatever their order.
pub fn check(history: &History) -> Vec<Violation> {
    let mut violations = Vec::new();
    for (key, grants) in history.grants_by_key() {
        let mut by_fence: BTreeMap<u64, usize> = BTreeMap::new();
        for (i, (a, g)) in grants.iter().enumerate() {
            if let Some(&j) = by_fence.get(&g.fence) {
                let what = format!("two grants of {key} with fence {}", g.fence);
                let window = Window::default().acquisition(grants[j].0).acquisition(a);
                violations.push(window.violation(history, "fences", what));
            }
            by_fence.insert(g.fence, i);
        }
        // Walk the grants by invocation; `done` yields them by completion, so that the
        // highest fence granted before each invocation is known in one pass.
        let mut done: Vec<usize> = (0..grants.len()).collect();
        done.sort_by_key(|&i| grants[i].0.completed);
        let mut invoked: Vec<usize> = (0..grants.len()).collect();
        invoked.sort_by_key(|&i| grants[i].0.invoked);
        let mut highest: Option<usize> = None;
        let mut next = 0;
        for b in invoked {
            let (later, lg) = grants[b];
            while next < done.len() && grants[done[next]].0.completed < later.invoked {
                let i = done[next];
                if highest.is_none_or(|h| grants[h].1.fence < grants[i].1.fence) {
                    highest = Some(i);
                }
                next += 1;
            }
            if let Some(h) = highest.filter(|&h| grants[h].1.fence > lg.fence) {
                let what = format!(
                    "{key}: fence {} granted after fence {} (granted earlier)",
                    lg.fence, grants[h].1.fence
                );
                let window = Window::default()
                    .acquisition(grants[h].0)
                    .acquisition(later);
                violations.push(window.violation(history, "fences", what));
            }
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::super::sample::{history, hold, shared};
    use super::*;

    #[test]
    fn fences_rising_in_grant_order_pass_even_when_concurrent_grants_disagree() {
        let h = history(vec![
            hold(1, "k", 5, 0, 10, 20),
            hold(2, "k", 9, 20, 30, 40),
            // Concurrent acquires of permits: either order may be the grant order.
            shared(hold(3, "p", 12, 0, 10, 50), 2),
            shared(hold(4, "p", 11, 1, 9, 50), 2),
            // Fences are per key.
            hold(5, "other", 1, 50, 60, 70),
        ]);
        assert_eq!(check(&h), vec![]);
    }

    #[test]
    fn a_lower_fence_granted_after_a_higher_one_is_caught() {
        let h = history(vec![
            hold(1, "k", 7, 0, 10, 20),
            hold(2, "k", 8, 20, 30, 40),
            hold(3, "k", 6, 40, 50, 60),
        ]);
        let v = check(&h);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].what.contains("fence 6 granted after fence 8"),
            "{}",
            v[0]
        );
        assert!(v[0].window.iter().all(|l| !l.contains("p0/t1")), "{}", v[0]);
    }

    #[test]
    fn a_fence_given_twice_is_caught() {
        let h = history(vec![hold(1, "k", 7, 0, 10, 20), hold(2, "k", 7, 0, 11, 20)]);
        let v = check(&h);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].what.contains("two grants of k with fence 7"),
            "{}",
            v[0]
        );
    }
}
