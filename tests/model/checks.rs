//! The exhaustive checks of the protocol as the scripts write it.

use stateright::Checker;

use crate::model::{Fairness, HandoffModel};
use crate::runner::check;
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

#[test]
fn every_interleaving_keeps_exclusion_fences_and_arrival_order() {
    check(HandoffModel::new(SIZES), State::representative, "safety").assert_properties();
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
    check(
        HandoffModel::new(sizes).fair(fair),
        State::representative,
        "progress",
    )
    .assert_properties();
}
