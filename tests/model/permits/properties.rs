//! What the checker verifies in every reachable state of the permits model.
//!
//! - **The permit bound**: never more clients than the limit hold permits valid by their own
//!   (real-time) deadlines, and a client holding an exclusive one valid holds alone. A
//!   client whose deadline has passed has been told its lease is lost.
//! - **Fences rise in grant order**: every grant a script makes carries a fence above every
//!   earlier one (shared or exclusive).
//! - **Arrival order** (the module docs' "order"): no grant goes to anyone while another
//!   waiter's live ticket is ahead of the grantee's, or, for a request granted on arrival,
//!   anywhere in the queue. So a request is granted on arrival only when nobody waits, and
//!   once an exclusive request waits, later shared ones queue behind it.
//! - **Bounded wait** (under [`Fairness`](crate::model::Fairness) only): a live waiter is
//!   granted within `max_wait` ticks of its first attempt while the others release (or
//!   crash), whatever messages are lost and however the clock steps back: progress as a
//!   safety property, as in the lock model.
//!
//! `sometimes` properties make sure the model reaches what it is about: two shared permits
//! held at once, an exclusive one held, a shared request queued behind an exclusive one, a
//! grant message in flight, and a permit held after a clock step back.

use stateright::Property;

use crate::permits::model::PermitsModel;
use crate::permits::state::{Mode, Phase, State};

/// The permit bound's name.
pub(crate) const PERMIT_BOUND: &str = "at most `permits` valid holders, an exclusive one alone";
/// Fence monotonicity's name.
pub(crate) const FENCES_RISE: &str = "permit fences rise in grant order";
/// Arrival order's name.
pub(crate) const ARRIVAL_ORDER: &str = "no permit grant overtakes a live ticket";
/// The bounded wait's name.
pub(crate) const BOUNDED_WAIT: &str = "a live permit waiter is granted within max_wait";

/// The properties of `model`.
pub(crate) fn all(model: &PermitsModel) -> Vec<Property<PermitsModel>> {
    let mut all = vec![
        Property::always(PERMIT_BOUND, |m: &PermitsModel, s: &State| {
            let valid = valid_holders(s);
            valid.len() <= usize::from(m.permits)
                && (valid.len() <= 1 || !valid.contains(&Mode::Exclusive))
        }),
        Property::always(FENCES_RISE, |_, s: &State| !s.fence_regressed),
        Property::always(ARRIVAL_ORDER, |_, s: &State| !s.overtaken),
        Property::sometimes("two shared permits are held at once", |_, s: &State| {
            valid_holders(s) == [Mode::Shared, Mode::Shared]
        }),
        Property::sometimes("an exclusive permit is held", |_, s: &State| {
            valid_holders(s) == [Mode::Exclusive]
        }),
        Property::sometimes(
            "a shared request waits behind an exclusive one",
            |_, s: &State| {
                let first_x = s.queue.iter().position(|t| t.mode == Mode::Exclusive);
                first_x.is_some_and(|x| s.queue[x..].iter().any(|t| t.mode == Mode::Shared))
            },
        ),
        Property::sometimes("a permit's grant is in flight", |_, s: &State| {
            !s.messages.is_empty()
        }),
        Property::sometimes(
            "a permit is held after a clock step back",
            |_, s: &State| s.stepped > 0 && !s.holders.is_empty(),
        ),
    ];
    if model.fair.is_some() {
        all.push(Property::always(
            BOUNDED_WAIT,
            |m: &PermitsModel, s: &State| {
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

/// The modes of the permits clients hold valid by their own deadlines.
fn valid_holders(s: &State) -> Vec<Mode> {
    let mut modes: Vec<Mode> = s
        .clients
        .iter()
        .filter_map(|(phase, _)| match *phase {
            Phase::Holding { mode, deadline, .. } if deadline > s.real => Some(mode),
            _ => None,
        })
        .collect();
    modes.sort();
    modes
}
