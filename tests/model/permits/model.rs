//! The permits model itself: which actions each state enables, and the `stateright::Model`
//! glue.

use stateright::{Model, Property};

use crate::model::Fairness;
use crate::permits::actions::Action;
use crate::permits::properties;
use crate::permits::state::{Mode, Phase, State};
use crate::state::Sizes;

/// A deliberate break of the permit scripts, to show that the checker sees what it costs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Break {
    /// The scripts as written.
    None,
    /// `pump` grants the queue's head without asking `fits` (an exclusive request beside
    /// shared holders, a third shared one).
    NoFitCheck,
    /// `ACQUIRE` grants a request that fits on arrival even while someone waits.
    ArrivalIgnoresQueue,
    /// `pump` does not stop at a head that does not fit but grants later tickets that do
    /// (shared requests overtaking a waiting exclusive one: writer starvation).
    PumpPastBlocked,
    /// `RELEASE` drops its token compare: a late release removes another's permit.
    NoClaimCheck,
    /// A waiter takes a grant naming an earlier registration of its ticket than its
    /// latest.
    StaleGrantTaken,
}

/// The Redis permit protocol of one key, for a few clients.
#[derive(Clone, Debug)]
pub(crate) struct PermitsModel {
    /// Sizes and durations (the lock model's).
    pub(crate) sizes: Sizes,
    /// How many shared holders at most.
    pub(crate) permits: u8,
    /// The break, if any.
    pub(crate) broken: Break,
    /// Fairness, as in the lock model: time passes only once every live waiter has retried
    /// and every holder has renewed in time and held for less than `hold` ticks.
    pub(crate) fair: Option<Fairness>,
    /// Each client's mode, when fixed (`None`: each acquisition chooses).
    pub(crate) modes: Option<[Mode; 3]>,
}

impl PermitsModel {
    /// The scripts as written, every behaviour explored.
    pub(crate) fn new(sizes: Sizes, permits: u8) -> Self {
        Self {
            sizes,
            permits,
            broken: Break::None,
            fair: None,
            modes: None,
        }
    }

    /// The same, with a break.
    pub(crate) fn broken(mut self, broken: Break) -> Self {
        self.broken = broken;
        self
    }

    /// The same with each client's mode fixed (three clients): a smaller state space, for a
    /// search that must go deep.
    pub(crate) fn modes(mut self, modes: [Mode; 3]) -> Self {
        self.modes = Some(modes);
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

    /// Forgets what no step or property reads, so that states differing only in it are
    /// one: a grant for a waiter that has moved on; the fences holders, clients and
    /// messages carry (monotonicity is checked where a script grants, against the fence
    /// hash); tickets' scores beyond their order (a new one always goes to the tail);
    /// without fairness, the instants only fairness looks at; once the clock can step back
    /// no more, expired holders (every script drops them first, nothing can revive them);
    /// the expiry of an empty queue; and whether a client that does nothing more crashed
    /// or finished (what it left on the server is the same).
    fn normalize(&self, s: &mut State) {
        if s.queue.is_empty() {
            s.queue_expiry = 0;
        }
        for (phase, _) in &mut s.clients {
            if *phase == Phase::Crashed {
                *phase = Phase::Done;
            }
        }
        for h in &mut s.holders {
            h.fence = 0;
        }
        for m in &mut s.messages {
            m.fence = 0;
        }
        for (phase, _) in &mut s.clients {
            if let Phase::Holding { fence, .. } = phase {
                *fence = 0;
            }
        }
        for (rank, t) in (0..).zip(&mut s.queue) {
            t.score = rank;
        }
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
        if s.stepped >= self.sizes.step_back {
            let now = s.server;
            s.holders.retain(|h| h.expiry > now);
        }
    }
}

impl Model for PermitsModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State::initial(&self.sizes)]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for (c, (phase, begun)) in (0..).zip(&s.clients) {
            match *phase {
                Phase::Idle if *begun < self.sizes.sessions => match self.modes {
                    Some(modes) => actions.push(Action::Acquire(c, modes[usize::from(c)])),
                    None => {
                        actions.push(Action::Acquire(c, Mode::Shared));
                        actions.push(Action::Acquire(c, Mode::Exclusive));
                    }
                },
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
            Action::Acquire(c, mode) => {
                s.clients[usize::from(c)].1 += 1;
                self.acquire(&mut s, c, Some(mode));
            }
            Action::AcquireRetry(c) => self.acquire(&mut s, c, None),
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
