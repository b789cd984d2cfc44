//! The checker runs: an exhaustive run, a search for one property's counterexample, what
//! they visited, and the client renumberings of symmetry reduction.

use std::fmt::Debug;
use std::hash::Hash;
use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model};

/// Runs the checker to the end with symmetry reduction (`representative` maps a state to
/// the one state of its class the checker visits) and reports what it visited.
pub(crate) fn check<M>(
    model: M,
    representative: fn(&M::State) -> M::State,
    what: &str,
) -> impl Checker<M> + use<M>
where
    M: Model + Send + Sync + 'static,
    M::State: Hash + Send + Sync + Clone + PartialEq + 'static,
    M::Action: Clone + PartialEq,
{
    let started = Instant::now();
    let checker = model
        .checker()
        .symmetry_fn(representative)
        .threads(2)
        .spawn_bfs()
        .join();
    report(&checker, what, started);
    checker
}

/// Runs the checker until `property` has a counterexample: breadth first and without
/// symmetry reduction, so that the path is the shortest and replays as printed.
pub(crate) fn find<M>(model: M, property: &'static str, what: &str) -> impl Checker<M> + use<M>
where
    M: Model + Send + Sync + 'static,
    M::State: Hash + Send + Sync + Clone + PartialEq + 'static,
    M::Action: Clone + PartialEq,
{
    let started = Instant::now();
    let checker = model
        .checker()
        .finish_when(HasDiscoveries::AnyOf([property].into()))
        .threads(2)
        .spawn_bfs()
        .join();
    report(&checker, what, started);
    checker
}

/// Asserts `model` violates `property`, and prints the shortest path that shows it.
pub(crate) fn counterexample<M>(model: M, property: &'static str, what: &str)
where
    M: Model + Send + Sync + 'static,
    M::State: Hash + Send + Sync + Clone + PartialEq + 'static,
    M::Action: Clone + PartialEq + Debug,
{
    let checker = find(model, property, what);
    let path = checker.discovery(property);
    let path = path.unwrap_or_else(|| panic!("{what}: no counterexample to {property:?}"));
    let steps: Vec<String> = path
        .into_actions()
        .iter()
        .map(|a| format!("{a:?}"))
        .collect();
    eprintln!("{what} breaks {property:?}: {}", steps.join(", "));
}

/// Prints how much the checker visited, and how long it took.
pub(crate) fn report<M: Model>(checker: &impl Checker<M>, what: &str, started: Instant) {
    eprintln!(
        "{what}: {} states ({} unique), depth {}, in {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
}

/// Every order of `n` clients (`order[new] = old`), for a symmetry reduction that takes
/// the least renumbering of a state: six for three clients.
pub(crate) fn permutations(n: u8) -> Vec<Vec<u8>> {
    if n == 0 {
        return vec![Vec::new()];
    }
    let mut all = Vec::new();
    for shorter in permutations(n - 1) {
        for at in 0..=shorter.len() {
            let mut order = shorter.clone();
            order.insert(at, n - 1);
            all.push(order);
        }
    }
    all
}
