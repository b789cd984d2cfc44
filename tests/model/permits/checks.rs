//! The exhaustive checks of the permit scripts as written.

use stateright::Checker;

use crate::model::Fairness;
use crate::permits::model::PermitsModel;
use crate::permits::state::State;
use crate::runner::check;
use crate::state::Sizes;

/// Two permits.
pub(crate) const PERMITS: u8 = 2;

/// Three clients, one acquisition each (shared or exclusive, as each chooses); a lease TTL
/// of 3 ticks, a ticket TTL (and claim period) of 2, a fence margin of 2; the server clock
/// may step back one tick, less than the claim period; four ticks of time (704,058 states
/// after symmetry: five ticks make 1.7 million and take three times as long, too long for
/// the suite).
pub(crate) const SIZES: Sizes = Sizes {
    clients: 3,
    sessions: 1,
    ttl: 3,
    claim: 2,
    margin: 2,
    step_back: 1,
    horizon: 4,
    fence_scale: 8,
};

#[test]
fn every_permit_interleaving_keeps_the_bound_fences_and_arrival_order() {
    check(
        PermitsModel::new(SIZES, PERMITS),
        State::representative,
        "permits safety",
    )
    .assert_properties();
}

/// Progress, as in the lock model: a lease TTL of 2 keeps the state space small enough
/// (773,359 states) for a horizon of 10 ticks.
#[test]
fn a_live_permit_waiter_is_granted_within_a_bound_while_others_release() {
    let fair = Fairness {
        hold: 2,
        // The least bound that holds (6 has a counterexample): an exclusive waiter behind a
        // shared holder and another exclusive waiter, each crashing with a lease just
        // renewed, and the clock steps back.
        max_wait: 7,
    };
    let sizes = Sizes {
        ttl: 2,
        horizon: 10,
        ..SIZES
    };
    check(
        PermitsModel::new(sizes, PERMITS).fair(fair),
        State::representative,
        "permits progress",
    )
    .assert_properties();
}
