//! The model itself: which actions each state enables, and the `stateright::Model` glue.

use stateright::{Model, Property};

use crate::actions::Action;
use crate::properties;
use crate::state::{Phase, Sizes, State};

/// A deliberate break of the protocol, to show that the checker sees what it would cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Break {
    /// The protocol as the scripts write it.
    None,
    /// `RELEASE` drops its claim check: it frees the key whoever holds it (a late release
    /// by a holder whose lease ran out deletes the next holder's lease).
    NoClaimCheck,
    /// `RELEASE` ignores the mark and leaves the tombstone, skipping the queue.
    ReleaseSkipsQueue,
    /// `ACQUIRE` lets anyone take a free key, not only the queue's head.
    NoHeadCheck,
    /// A waiter takes a grant that names an earlier registration of its ticket than its
    /// latest (a claim that lapsed while it was away, then went to someone else).
    StaleGrantTaken,
}

/// The Redis hand-off protocol of one lock key, for a few clients.
#[derive(Clone, Debug)]
pub(crate) struct HandoffModel {
    /// Sizes and durations.
    pub(crate) sizes: Sizes,
    /// The break, if any.
    pub(crate) broken: Break,
    /// Fairness: time passes only once every live waiter has retried and every holder has
    /// renewed in time and holds for less than `hold` ticks. Off, every behaviour is explored
    /// (paused holders, waiters that stop refreshing); on, the bounded-wait property applies.
    pub(crate) fair: Option<Fairness>,
}

/// The environment's promises under which a waiter must be granted, and how soon.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fairness {
    /// A holder releases (or crashes) before it has held this long.
    pub(crate) hold: u8,
    /// A live waiter is granted within this many ticks of its first attempt.
    pub(crate) max_wait: u8,
}

impl HandoffModel {
    /// The protocol as written, every behaviour explored.
    pub(crate) fn new(sizes: Sizes) -> Self {
        Self {
            sizes,
            broken: Break::None,
            fair: None,
        }
    }

    /// The same, with a break.
    pub(crate) fn broken(mut self, broken: Break) -> Self {
        self.broken = broken;
        self
    }

    /// The same, under fairness.
    pub(crate) fn fair(mut self, fairness: Fairness) -> Self {
        self.fair = Some(fairness);
        self
    }

    /// Whether time may pass: within the horizon, and under fairness only once everyone
    /// has done what fairness promises for this tick.
    fn may_tick(&self, s: &State) -> bool {
        if s.real >= self.sizes.horizon {
            return false;
        }
        let Some(fair) = self.fair else { return true };
        s.clients.iter().all(|(phase, _)| match *phase {
            Phase::Waiting { retried, .. } => retried,
            Phase::Holding {
                deadline, since, ..
            } => deadline > s.real + 1 && s.real + 1 - since < fair.hold,
            Phase::Idle | Phase::Done | Phase::Crashed => true,
        })
    }
}

impl HandoffModel {
    /// Forgets what no step or property of this model reads, so that states differing
    /// only in it are one: a grant for a waiter that has moved on, and without fairness
    /// the instants that only fairness and the bounded wait look at.
    fn normalize(&self, s: &mut State) {
        let clients = s.clients.clone();
        s.messages.retain(|m| {
            let (phase, session) = clients[usize::from(m.owner.client)];
            session == m.owner.session && matches!(phase, Phase::Waiting { .. })
        });
        if self.fair.is_none() {
            for (phase, _) in &mut s.clients {
                match phase {
                    Phase::Waiting { since, .. } | Phase::Holding { since, .. } => *since = 0,
                    _ => {}
                }
            }
        }
    }
}

impl Model for HandoffModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State::initial(&self.sizes)]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for (c, (phase, begun)) in (0..).zip(&s.clients) {
            match *phase {
                Phase::Idle if *begun < self.sizes.sessions => actions.push(Action::Acquire(c)),
                Phase::Waiting { .. } => actions.push(Action::AcquireRetry(c)),
                Phase::Holding { deadline, .. } => {
                    // The watchdog renews only a lease it still vouches for.
                    if deadline > s.real {
                        actions.push(Action::Renew(c));
                    }
                    actions.push(Action::Release(c));
                }
                _ => {}
            }
            if matches!(phase, Phase::Waiting { .. } | Phase::Holding { .. }) {
                actions.push(Action::Crash(c));
            }
        }
        for i in 0..s.messages.len() {
            let i = u8::try_from(i).expect("a handful of messages");
            actions.push(Action::GrantDelivered(i));
            actions.push(Action::GrantLost(i));
        }
        if self.may_tick(s) {
            actions.push(Action::Tick);
        }
        if s.stepped < self.sizes.step_back {
            actions.push(Action::ClockStepBack);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Acquire(c) => {
                s.clients[usize::from(c)].1 += 1;
                self.acquire(&mut s, c, false);
            }
            Action::AcquireRetry(c) => self.acquire(&mut s, c, true),
            Action::GrantDelivered(i) => self.deliver(&mut s, usize::from(i)),
            Action::GrantLost(i) => {
                s.messages.remove(usize::from(i));
            }
            Action::Renew(c) => self.renew(&mut s, c),
            Action::Release(c) => self.release(&mut s, c),
            Action::Crash(c) => s.clients[usize::from(c)].0 = Phase::Crashed,
            Action::Tick => {
                s.real += 1;
                s.server += 1;
                if self.fair.is_some() {
                    for (phase, _) in &mut s.clients {
                        if let Phase::Waiting { retried, .. } = phase {
                            *retried = false;
                        }
                    }
                }
                s.expire();
            }
            Action::ClockStepBack => {
                s.server -= 1;
                s.stepped += 1;
            }
        }
        self.normalize(&mut s);
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties::all(self)
    }
}
