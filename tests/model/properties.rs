//! What the checker verifies in every reachable state.
//!
//! - **Mutual exclusion**: no two clients hold the key with a lease still valid by their
//!   own (real-time) deadline. A client whose deadline has passed has been told its lease
//!   is lost, so it may overlap a later holder.
//! - **Fences rise in grant order**: every grant a script makes (a fresh acquire, a
//!   tombstone's, a hand-off) carries a fence above every earlier one.
//! - **Arrival order**: no grant goes to anyone while another waiter's live ticket is ahead
//!   of the grantee's (or, for a newcomer, anywhere in the queue).
//! - **Bounded wait** (under [`Fairness`](crate::model::Fairness) only): a live waiter is
//!   granted within `max_wait` ticks of its first attempt while the others release (or
//!   crash), whatever messages are lost and however the clock steps back. This is progress
//!   as a safety property: stateright's `eventually` is not sound on cyclic graphs, and the
//!   model's bounded time turns "eventually" into "within a bound", which it can check.
//!
//! Two `sometimes` properties make sure the model reaches what it is about: a grant message
//! in flight, and a key held while the clock has stepped back.

use stateright::Property;

use crate::model::HandoffModel;
use crate::state::{Phase, State};

/// Mutual exclusion's name, for tests that look for its counterexample.
pub(crate) const MUTUAL_EXCLUSION: &str = "mutual exclusion among valid leases";
/// Fence monotonicity's name.
pub(crate) const FENCES_RISE: &str = "fences rise in grant order";
/// Arrival order's name.
pub(crate) const ARRIVAL_ORDER: &str = "no grant overtakes a live ticket";
/// The bounded wait's name.
pub(crate) const BOUNDED_WAIT: &str = "a live waiter is granted within max_wait";

/// The properties of `model`.
pub(crate) fn all(model: &HandoffModel) -> Vec<Property<HandoffModel>> {
    let mut all = vec![
        Property::always(MUTUAL_EXCLUSION, |_, s: &State| valid_holders(s) <= 1),
        Property::always(FENCES_RISE, |_, s: &State| !s.fence_regressed),
        Property::always(ARRIVAL_ORDER, |_, s: &State| !s.overtaken),
        Property::sometimes("a hand-off's grant is in flight", |_, s: &State| {
            !s.messages.is_empty()
        }),
        Property::sometimes("a key is held after a clock step back", |_, s: &State| {
            s.stepped > 0 && s.lock.is_some()
        }),
    ];
    if model.fair.is_some() {
        all.push(Property::always(
            BOUNDED_WAIT,
            |m: &HandoffModel, s: &State| {
                let max_wait = m.fair.map_or(u8::MAX, |f| f.max_wait);
                s.clients.iter().all(|(phase, _)| match *phase {
                    Phase::Waiting { since, .. } => s.real - since <= max_wait,
                    _ => true,
                })
            },
        ));
    }
    all
}

/// How many clients hold the key with a lease valid by their own deadline.
fn valid_holders(s: &State) -> usize {
    s.clients
        .iter()
        .filter(|(phase, _)| matches!(*phase, Phase::Holding { deadline, .. } if deadline > s.real))
        .count()
}
