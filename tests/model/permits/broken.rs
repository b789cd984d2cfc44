//! Deliberate breaks of the permit scripts: each must give the checker a counterexample.

use crate::permits::checks::{PERMITS, SIZES};
use crate::permits::model::{Break, PermitsModel};
use crate::permits::properties::{ARRIVAL_ORDER, FENCES_RISE, PERMIT_BOUND};
use crate::permits::state::Mode;
use crate::runner::counterexample;
use crate::state::Sizes;

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

/// The fences' bound, as the lock's: a step back as long as the fence hash's margin (here
/// 2 ticks) lets a grant after the tombstone expired take a fence not above the last one.
/// (The hash outlives every holder by the margin, released or not, so for permits the bound
/// is the margin alone, never shorter than the lock's `min(ttl, margin)`.)
#[test]
fn a_permit_clock_step_back_as_long_as_the_margin_lets_fences_go_backwards() {
    let sizes = Sizes {
        step_back: 2,
        ..SIZES
    };
    counterexample(
        PermitsModel::new(sizes, PERMITS),
        FENCES_RISE,
        "permits, step back 2",
    );
}

/// The gap the lock model found holds for permits too (the same waiter code tells a stale
/// grant by its ticket's deadline, on the server clock): a step back as long as the claim
/// period, though shorter than the fences' bound (margin 3 here), lets a waiter whose grant
/// message was delayed take the stale grant beside the next holder.
#[test]
fn a_permit_step_back_as_long_as_the_claim_period_lets_a_stale_grant_through() {
    let sizes = Sizes {
        step_back: 2,
        margin: 3,
        ..SIZES
    };
    // Each client's mode fixed (a shared holder between two exclusive requests): the
    // counterexample is 10 steps deep, a search through every mix of modes costs twice as
    // long.
    let modes = [Mode::Exclusive, Mode::Shared, Mode::Exclusive];
    counterexample(
        PermitsModel::new(sizes, PERMITS).modes(modes),
        PERMIT_BOUND,
        "permits, step back 2, claim 2",
    );
}
