//! The exhaustive checks of the protocol as the scripts write it.

use stateright::Checker;

use crate::model::{Fairness, Protocol};
use crate::properties::{EXCLUSION, STALE_GRANT};
use crate::runner::check;
use crate::state::{Mode, Sizes, State};

/// Three clients, one acquisition each (alone or shared, as each chooses), a shared limit
/// of 2; a lease TTL of 3 ticks, a ticket TTL (and claim period) of 2, a fence margin of
/// 2; the server clock may step back one tick, less than the margin (the fences' bound);
/// four ticks of time.
pub(crate) const SIZES: Sizes = Sizes {
    clients: 3,
    limit: 2,
    ttl: 3,
    claim: 2,
    margin: 2,
    step_back: 1,
    horizon: 4,
    fence_scale: 8,
};

#[test]
fn every_interleaving_keeps_exclusion_fences_arrival_order_and_wake_ups() {
    check(Protocol::new(SIZES), State::representative, "safety").assert_properties();
}

/// Progress: a lease TTL of 2 keeps the state space small enough for a horizon of 10
/// ticks, longer than any wait (so the horizon never hides one).
#[test]
fn a_live_waiter_is_granted_within_a_bound_while_others_release() {
    let fair = Fairness {
        hold: 2,
        // The least bound that holds for these sizes (6 has a counterexample).
        max_wait: 7,
    };
    let sizes = Sizes {
        ttl: 2,
        horizon: 10,
        ..SIZES
    };
    check(
        Protocol::new(sizes).fair(fair),
        State::representative,
        "progress",
    )
    .assert_properties();
}

/// The nonce, not a clock, tells a stale grant: with the server clock stepping back once,
/// by any number of ticks up to 4, at any point, no grant reaches a waiter beside another
/// holder. A step of 4 in three ticks of time already takes the server clock back before
/// every key the run can have made, so nothing made before it can expire after it: every
/// larger step runs the same. Fences may go backwards (their bound is the margin,
/// `broken::a_clock_step_back_past_the_margin_lets_fences_go_backwards`); under the old rule
/// these sizes let a stale grant through
/// (`broken::the_deadline_rule_lets_a_stale_grant_through_after_a_step_back`).
#[test]
fn no_clock_step_back_of_any_size_lets_a_stale_grant_through() {
    let model = Protocol::new(STEP_ANY).modes(STALE_MODES);
    let checker = check(model, State::representative_ends, "any step back");
    checker.assert_no_discovery(EXCLUSION);
    // Not vacuous: a grant naming an earlier nonce does reach its waiter's subscriber.
    checker.assert_any_discovery(STALE_GRANT);
}

/// A step back of up to 4 ticks, longer than the lease, the claim and the margin, in three
/// ticks of time.
pub(crate) const STEP_ANY: Sizes = Sizes {
    step_back: 4,
    horizon: 3,
    ..SIZES
};

/// Each client's mode fixed, a shared request between two alone ones, for the checks with
/// a long step back (every mix of modes costs four times as long).
pub(crate) const STALE_MODES: [Mode; 3] = [Mode::Alone, Mode::Shared, Mode::Alone];
