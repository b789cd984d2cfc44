//! Deliberate breaks of the permit scripts: each must give the checker a counterexample.

use crate::permits::checks::{PERMITS, SIZES};
use crate::permits::model::{Break, PermitsModel};
use crate::permits::properties::{ARRIVAL_ORDER, PERMIT_BOUND};
use crate::runner::counterexample;

/// Asserts the broken model violates `property`, and prints the path that shows it.
fn breaks(broken: Break, property: &'static str) {
    let model = PermitsModel::new(SIZES, PERMITS).broken(broken);
    counterexample(model, property, &format!("permits {broken:?}"));
}

#[test]
fn a_pump_that_skips_the_fit_check_grants_an_exclusive_permit_beside_a_shared_one() {
    breaks(Break::NoFitCheck, PERMIT_BOUND);
}

#[test]
fn a_grant_on_arrival_while_someone_waits_overtakes_the_waiter() {
    breaks(Break::ArrivalIgnoresQueue, ARRIVAL_ORDER);
}

#[test]
fn a_pump_past_a_waiting_exclusive_request_lets_shared_ones_overtake_it() {
    breaks(Break::PumpPastBlocked, ARRIVAL_ORDER);
}

#[test]
fn a_permit_release_without_its_token_compare_breaks_the_bound() {
    breaks(Break::NoClaimCheck, PERMIT_BOUND);
}

#[test]
fn a_permit_waiter_that_takes_a_stale_grant_breaks_the_bound() {
    breaks(Break::StaleGrantTaken, PERMIT_BOUND);
}
