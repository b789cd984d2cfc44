//! Deliberate breaks of the protocol: each must give the checker a counterexample.

use crate::checks::{SIZES, STALE_MODES, STEP_ANY};
use crate::model::{Break, Protocol};
use crate::properties::{ARRIVAL_ORDER, EXCLUSION, FENCES_RISE, WOKEN};
use crate::runner::counterexample;
use crate::state::Sizes;

/// Asserts the broken model violates `property`, and prints the path that shows it.
fn breaks(broken: Break, property: &'static str) {
    let model = Protocol::new(SIZES).broken(broken);
    counterexample(model, property, &format!("{broken:?}"));
}

#[test]
fn a_release_without_its_token_compare_lets_two_valid_leases_overlap() {
    breaks(Break::NoClaimCheck, EXCLUSION);
}

#[test]
fn a_release_that_skips_the_queue_loses_a_wake_up() {
    breaks(Break::ReleaseSkipsQueue, WOKEN);
}

#[test]
fn a_grant_on_arrival_while_someone_waits_overtakes_the_waiter() {
    breaks(Break::ArrivalIgnoresQueue, ARRIVAL_ORDER);
}

#[test]
fn a_pump_that_skips_the_fit_check_grants_an_alone_lease_beside_a_shared_one() {
    breaks(Break::NoFitCheck, EXCLUSION);
}

#[test]
fn a_pump_past_a_waiting_alone_request_lets_shared_ones_overtake_it() {
    breaks(Break::PumpPastBlocked, ARRIVAL_ORDER);
}

#[test]
fn a_waiter_that_takes_a_grant_without_checking_its_nonce_overlaps_the_next_holder() {
    breaks(Break::NonceUnchecked, EXCLUSION);
}

/// The rule the nonce replaced, at the sizes of
/// `checks::no_clock_step_back_of_any_size_lets_a_stale_grant_through`: a waiter that
/// tells a stale grant by its ticket's deadline (server clock) takes one whose claim
/// lapsed while its message was delayed, once the clock has stepped back by the claim
/// period, beside the next holder.
#[test]
fn the_deadline_rule_lets_a_stale_grant_through_after_a_step_back() {
    let model = Protocol::new(STEP_ANY)
        .modes(STALE_MODES)
        .broken(Break::DeadlineRule);
    counterexample(model, EXCLUSION, "DeadlineRule, step back");
}

/// The fences' bound: a step back as long as the margin (here 2 ticks) lets a grant after
/// the last fence expired take a fence not above it.
#[test]
fn a_clock_step_back_past_the_margin_lets_fences_go_backwards() {
    let sizes = Sizes {
        step_back: 2,
        ..SIZES
    };
    counterexample(Protocol::new(sizes), FENCES_RISE, "step back 2");
}
