//! What the checker verifies in every reachable state.
//!
//! - **Exclusion across modes**: a client holding alone with a lease valid by its own
//!   (real-time) deadline holds beside nobody else's valid lease, and never more than the
//!   limit hold shared ones. A client whose deadline has passed has been told its lease is
//!   lost, so it may overlap a later holder.
//! - **Fences rise in grant order**: every grant a script makes, alone or shared, carries a
//!   fence above every earlier one.
//! - **Arrival order**: no grant goes to anyone while another waiter's live ticket is ahead
//!   of the grantee's, or, for a request granted on arrival, anywhere in the queue. So a
//!   request is granted on arrival only when nobody waits, and once an alone request
//!   waits, later shared ones queue behind it.
//! - **No lost wake-up**: no script that grants ends with a live ticket at the queue's head
//!   that fits.
//! - **Bounded wait** (under [`Fairness`](crate::model::Fairness) only): a live waiter is
//!   granted within `max_wait` ticks of its first attempt while the others release (or
//!   crash), whatever messages are lost or re-sent and however the clock steps back. This
//!   is progress as a safety property: stateright's `eventually` is not sound on cyclic
//!   graphs, and the model's bounded time turns "eventually" into "within a bound".
//!
//! `sometimes` properties make sure the model reaches what it is about.

use stateright::Property;

use crate::model::Protocol;
use crate::state::{Mode, Phase, State};

/// Exclusion's name, for tests that look for its counterexample.
pub(crate) const EXCLUSION: &str = "an alone holder beside nobody, at most `limit` shared";
/// Fence monotonicity's name.
pub(crate) const FENCES_RISE: &str = "fences rise in grant order across both modes";
/// Arrival order's name.
pub(crate) const ARRIVAL_ORDER: &str = "no grant overtakes a live ticket";
/// No lost wake-up's name.
pub(crate) const WOKEN: &str = "no script leaves a fitting live head ungranted";
/// The name of a stale grant in flight (what the nonce is for).
pub(crate) const STALE_GRANT: &str = "a grant naming an earlier nonce is in flight";
/// The bounded wait's name.
pub(crate) const BOUNDED_WAIT: &str = "a live waiter is granted within max_wait";

/// The properties of `model`.
pub(crate) fn all(model: &Protocol) -> Vec<Property<Protocol>> {
    let mut all = vec![
        Property::always(EXCLUSION, |m: &Protocol, s: &State| {
            let valid = valid_holders(s);
            valid.len() <= usize::from(m.sizes.limit)
                && (valid.len() <= 1 || !valid.contains(&Mode::Alone))
        }),
        Property::always(FENCES_RISE, |_, s: &State| !s.fence_regressed),
        Property::always(ARRIVAL_ORDER, |_, s: &State| !s.overtaken),
        Property::always(WOKEN, |_, s: &State| !s.stalled),
        Property::sometimes("two shared leases are held at once", |_, s: &State| {
            valid_holders(s) == [Mode::Shared, Mode::Shared]
        }),
        Property::sometimes("a lease alone is held", |_, s: &State| {
            valid_holders(s) == [Mode::Alone]
        }),
        Property::sometimes(
            "a shared request waits behind an alone one",
            |_, s: &State| {
                let first = s.queue.iter().position(|t| t.mode == Mode::Alone);
                first.is_some_and(|x| s.queue[x..].iter().any(|t| t.mode == Mode::Shared))
            },
        ),
        Property::sometimes("a lease is held after a clock step back", |_, s: &State| {
            s.stepped > 0 && !s.holders.is_empty()
        }),
    ];
    if model.fair.is_none() {
        all.push(Property::sometimes(STALE_GRANT, |_, s: &State| {
            s.messages.iter().any(|m| !m.latest)
        }));
    } else {
        all.push(Property::always(BOUNDED_WAIT, |m: &Protocol, s: &State| {
            let max_wait = m.fair.map_or(u8::MAX, |f| f.max_wait);
            s.clients.iter().all(|c| match *c {
                Phase::Waiting { since, .. } => s.real - since <= max_wait,
                _ => true,
            })
        }));
    }
    all
}

/// The modes of the leases clients hold valid by their own deadlines.
fn valid_holders(s: &State) -> Vec<Mode> {
    let mut modes: Vec<Mode> = (s.clients.iter())
        .filter_map(|c| match *c {
            Phase::Holding { mode, deadline, .. } if deadline > s.real => Some(mode),
            _ => None,
        })
        .collect();
    modes.sort();
    modes
}
