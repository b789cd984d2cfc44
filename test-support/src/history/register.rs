//! The register check: a fenced register (a store that refuses a write whose fence is
//! below the highest it has accepted) ends in a state that a sequential execution of the
//! writes it accepted explains.

use std::collections::BTreeMap;

use super::{
    record::{History, Write},
    violation::{Violation, Window},
};

/// Every point where a key's accepted writes stop forming one sequential execution.
///
/// Since the register refuses lower fences, the order it accepted writes in is the order
/// of their fences (a writer's own writes, with one fence, in the order it sent them).
/// Executed one after another in that order from 0, each write must have read the value
/// the write before it left (no update lost to a holder that raced it), the order must
/// agree with real time (a write answered before another was sent comes first), and the
/// last write's value must be the register's final value.
pub fn check(history: &History) -> Vec<Violation> {
    let mut keys: BTreeMap<&str, Vec<&Write>> = BTreeMap::new();
    for w in history.writes.iter().filter(|w| w.accepted) {
        keys.entry(w.key.as_str()).or_default().push(w);
    }
    for key in history.finals.keys() {
        keys.entry(key.as_str()).or_default();
    }
    let mut violations = Vec::new();
    for (key, mut writes) in keys {
        writes.sort_by_key(|w| (w.fence, w.invoked));
        let mut previous: Option<&Write> = None;
        for &w in &writes {
            let expected = previous.map_or(0, |p| p.value);
            if w.read != expected {
                let what = format!(
                    "{key}: an accepted write read {} where the sequential execution had {expected} (an update lost to a concurrent holder)",
                    w.read
                );
                let window = previous.map_or(Window::default(), |p| Window::default().write(p));
                violations.push(window.write(w).violation(history, "register", what));
            }
            previous = Some(w);
        }
        // Real time: no write later in the order may have been answered before an earlier
        // one was sent. The earliest answer among the writes after each one tells.
        let mut earliest_after: Option<&Write> = None;
        for &w in writes.iter().rev() {
            if let Some(x) = earliest_after.filter(|x| x.completed < w.invoked) {
                let what = format!(
                    "{key}: the write with fence {} was accepted after the write with fence {} had been",
                    w.fence, x.fence
                );
                let window = Window::default().write(x).write(w);
                violations.push(window.violation(history, "register", what));
            }
            if earliest_after.is_none_or(|x| w.completed < x.completed) {
                earliest_after = Some(w);
            }
        }
        let last = previous.map_or(0, |p| p.value);
        if let Some(&end) = history.finals.get(key)
            && end != last
        {
            let what = format!(
                "{key}: the register ended at {end}, its accepted writes in order leave {last}"
            );
            let window = previous.map_or(Window::default(), |p| Window::default().write(p));
            violations.push(window.violation(history, "register", what));
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::super::sample::write;
    use super::*;

    fn register(writes: Vec<Write>, end: u64) -> History {
        History {
            writes,
            finals: [("k".to_owned(), end)].into(),
            ..History::default()
        }
    }

    #[test]
    fn a_chain_of_accepted_writes_with_refused_stale_ones_is_explained() {
        let h = register(
            vec![
                write(1, "k", 5, 0, 0, true),
                // A holder whose lease ran out read 1 and wrote late: refused.
                write(2, "k", 6, 1, 10, false),
                write(3, "k", 7, 1, 20, true),
                write(4, "k", 8, 2, 30, true),
            ],
            3,
        );
        assert_eq!(check(&h), vec![]);
    }

    #[test]
    fn a_lost_update_is_caught_with_the_two_writes_in_the_window() {
        // Two holders with one fence both read 1 and wrote 2.
        let h = register(
            vec![
                write(1, "k", 5, 0, 0, true),
                write(2, "k", 6, 1, 10, true),
                write(3, "k", 6, 1, 12, true),
            ],
            2,
        );
        let v = check(&h);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].what
                .contains("read 1 where the sequential execution had 2"),
            "{}",
            v[0]
        );
        assert_eq!(v[0].window.len(), 4, "{}", v[0]);
    }

    #[test]
    fn a_final_value_no_sequence_of_accepted_writes_leaves_is_caught() {
        let h = register(vec![write(1, "k", 5, 0, 0, true)], 2);
        let v = check(&h);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].what.contains("ended at 2"), "{}", v[0]);
    }

    #[test]
    fn a_lower_fence_accepted_after_a_higher_one_is_caught() {
        let h = register(
            vec![write(1, "k", 9, 0, 0, true), write(2, "k", 5, 0, 10, true)],
            1,
        );
        let v = check(&h);
        assert!(
            v.iter().any(|v| v
                .what
                .contains("fence 5 was accepted after the write with fence 9")),
            "{v:?}"
        );
    }
}
