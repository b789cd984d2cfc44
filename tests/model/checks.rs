//! The exhaustive checks of the protocol as the scripts write it.

use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model};

use crate::model::{Fairness, HandoffModel};
use crate::state::{Sizes, State};

/// Three clients, one session each; a lease TTL of 3 ticks, a ticket TTL (and claim period)
/// of 2, a fence margin of 2; the server clock may step back one tick, less than
/// `min(ttl, margin)` as the engine's README documents.
pub(crate) const SIZES: Sizes = Sizes {
    clients: 3,
    sessions: 1,
    ttl: 3,
    claim: 2,
    margin: 2,
    step_back: 1,
    horizon: 5,
    fence_scale: 8,
};

/// Runs the checker to the end (with symmetry reduction: clients are interchangeable)
/// and reports what it visited.
pub(crate) fn check(model: HandoffModel, what: &str) -> impl Checker<HandoffModel> + use<> {
    let started = Instant::now();
    let checker = model
        .checker()
        .symmetry_fn(State::representative)
        .threads(2)
        .spawn_bfs()
        .join();
    report(&checker, what, started);
    checker
}

/// Runs the checker until `property` has a counterexample: breadth first and without
/// symmetry reduction, so that the path is the shortest and replays as printed.
pub(crate) fn find(
    model: HandoffModel,
    property: &'static str,
    what: &str,
) -> impl Checker<HandoffModel> + use<> {
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

/// Prints how much the checker visited, and how long it took.
fn report(checker: &impl Checker<HandoffModel>, what: &str, started: Instant) {
    eprintln!(
        "{what}: {} states ({} unique), depth {}, in {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
}

#[test]
fn every_interleaving_keeps_exclusion_fences_and_arrival_order() {
    check(HandoffModel::new(SIZES), "safety").assert_properties();
}

/// Progress: a lease TTL of 2 keeps the state space small enough for a horizon of 10
/// ticks, longer than any wait (so the horizon never hides one).
#[test]
fn a_live_waiter_is_granted_within_a_bound_while_others_release() {
    let fair = Fairness {
        hold: 2,
        // The least bound that holds for these sizes (6 has a counterexample): two waiters
        // ahead, each may crash holding a lease just renewed, and the clock steps back.
        max_wait: 7,
    };
    let sizes = Sizes {
        ttl: 2,
        horizon: 10,
        ..SIZES
    };
    check(HandoffModel::new(sizes).fair(fair), "progress").assert_properties();
}
