//! The model itself: which actions each state enables, and the `stateright::Model` glue.

use stateright::{Model, Property};

use crate::actions::Action;
use crate::properties;
use crate::state::{Mode, Phase, Resend, Sizes, State};

/// A deliberate break of the protocol, to show that the checker sees what it would cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Break {
    /// The protocol as the scripts write it.
    None,
    /// `RELEASE` drops its token compare: a late release removes another's lease.
    NoClaimCheck,
    /// `RELEASE` frees the key without granting the waiters that now fit (a lost wake-up:
    /// they wait for their fallback timer).
    ReleaseSkipsQueue,
    /// `ACQUIRE` grants a request that fits on arrival even while someone waits (a
    /// newcomer takes the key ahead of the queue's head).
    ArrivalIgnoresQueue,
    /// `pump` grants the queue's head without asking `fits` (an alone request beside
    /// shared holders, a shared one beyond the limit).
    NoFitCheck,
    /// `pump` does not stop at a head that does not fit but grants later tickets that do
    /// (shared requests overtaking a waiting alone one: writer starvation).
    PumpPastBlocked,
    /// A waiter takes a grant for its ticket without checking the nonce it names.
    NonceUnchecked,
    /// The rule the nonce replaced: a waiter takes a grant whose ticket deadline (server
    /// clock) is at least the one its last reply named.
    DeadlineRule,
}

/// The environment's promises under which a waiter must be granted, and how soon.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fairness {
    /// A holder releases (or crashes) before it has held this long.
    pub(crate) hold: u8,
    /// A live waiter is granted within this many ticks of its first attempt.
    pub(crate) max_wait: u8,
}

/// The hand-off protocol of one key in both modes, for a few clients.
#[derive(Clone, Debug)]
pub(crate) struct Protocol {
    /// Sizes and durations.
    pub(crate) sizes: Sizes,
    /// The break, if any.
    pub(crate) broken: Break,
    /// Fairness: time passes only once every live waiter has retried and every holder has
    /// renewed in time and holds for less than `hold` ticks. Off, every behaviour is explored
    /// (paused holders, waiters that stop refreshing); on, the bounded wait applies.
    pub(crate) fair: Option<Fairness>,
    /// Each client's mode, when fixed (`None`: each chooses; no symmetry reduction when
    /// fixed, as the clients are not interchangeable then).
    pub(crate) modes: Option<[Mode; 3]>,
}

impl Protocol {
    /// The protocol as written, every behaviour explored.
    pub(crate) fn new(sizes: Sizes) -> Self {
        Self {
            sizes,
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

    /// The same, under fairness.
    pub(crate) fn fair(mut self, fairness: Fairness) -> Self {
        self.fair = Some(fairness);
        self
    }

    /// The same with each client's mode fixed (three clients): a smaller state space.
    pub(crate) fn modes(mut self, modes: [Mode; 3]) -> Self {
        self.modes = Some(modes);
        self
    }

    /// The `PX` of a grant by message: the claim period, or the TTL when shorter.
    pub(crate) fn px(&self) -> u8 {
        self.sizes.ttl.min(self.sizes.claim)
    }

    /// How far the server clock may still step back: one step in a run, of any size up
    /// to `step_back`.
    fn steps_left(&self, s: &State) -> u8 {
        if s.stepped > 0 {
            0
        } else {
            self.sizes.step_back
        }
    }

    /// Whether time may pass: within the horizon, and under fairness only once everyone
    /// has done what fairness promises for this tick.
    fn may_tick(&self, s: &State) -> bool {
        if s.real >= self.sizes.horizon {
            return false;
        }
        let Some(fair) = self.fair else { return true };
        s.clients.iter().all(|c| match *c {
            Phase::Waiting { retried, .. } => retried,
            Phase::Holding {
                deadline, since, ..
            } => deadline > s.real + 1 && s.real + 1 - since < fair.hold,
            Phase::Idle | Phase::Done => true,
        })
    }

    /// Forgets what no step or property reads, so that states differing only in it are
    /// one: a grant for a waiter that has moved on; the fences holders, clients and
    /// messages carry (monotonicity is checked where a script grants, against the last
    /// fence), and the last fence once every later grant's is above it anyway; tickets'
    /// scores beyond their order (a new one always goes to the tail); the deadlines only
    /// the old rule reads; without fairness, the instants only fairness looks at; a local
    /// deadline that has passed, and the sending time of an attempt whose grant would come
    /// too late to be valid; once the clock can step back no more, expired holders (every
    /// script drops them first, nothing can revive them) and dead tickets' deadlines; the
    /// expiry of an empty queue.
    fn normalize(&self, s: &mut State) {
        if s.queue.is_empty() {
            s.queue_expiry = 0;
        }
        for (rank, t) in (0..).zip(&mut s.queue) {
            t.score = rank;
        }
        let clients = s.clients.clone();
        s.messages
            .retain(|m| matches!(clients[usize::from(m.owner.0)], Phase::Waiting { .. }));
        let old_rule = self.broken == Break::DeadlineRule;
        for m in &mut s.messages {
            m.fence = 0;
            m.deadline = if old_rule { m.deadline } else { 0 };
        }
        for h in &mut s.holders {
            h.fence = 0;
        }
        let (real, px) = (s.real, self.px());
        for c in &mut s.clients {
            match c {
                Phase::Holding {
                    fence,
                    since,
                    deadline,
                    ..
                } => {
                    *fence = 0;
                    *since = if self.fair.is_some() { *since } else { 0 };
                    *deadline = if *deadline > real { *deadline } else { 0 };
                }
                Phase::Waiting {
                    known, since, sent, ..
                } => {
                    *known = if old_rule { *known } else { 0 };
                    *since = if self.fair.is_some() { *since } else { 0 };
                    *sent = if *sent + px > real { *sent } else { 0 };
                }
                Phase::Idle | Phase::Done => {}
            }
        }
        if let Resend::Pending(owner, ..) = s.resend
            && !matches!(s.clients[usize::from(owner.0)], Phase::Waiting { .. })
        {
            s.resend = Resend::Spent;
        }
        // No later grant's fence can be at or below a fence under the earliest time the
        // clock can still step back to: forgotten (0) too.
        let floor = u16::from(s.server - self.steps_left(s)) * self.sizes.fence_scale;
        if s.last_fence < floor {
            s.last_fence = 0;
            if let Some(f) = &mut s.fence {
                f.fence = 0;
            }
        }
        if self.steps_left(s) == 0 {
            let now = s.server;
            s.holders.retain(|h| h.expiry > now);
            for t in s.queue.iter_mut().filter(|t| t.deadline <= now) {
                t.deadline = 0;
            }
        }
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State::initial(&self.sizes)]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for (c, client) in (0..).zip(&s.clients) {
            match *client {
                Phase::Idle => match self.modes {
                    Some(modes) => actions.push(Action::Acquire(c, modes[usize::from(c)])),
                    None => {
                        actions.push(Action::Acquire(c, Mode::Shared));
                        actions.push(Action::Acquire(c, Mode::Alone));
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
                Phase::Done => {}
            }
            // Without fairness a crash is a client that does nothing more, which every run
            // already includes.
            if self.fair.is_some()
                && matches!(*client, Phase::Waiting { .. } | Phase::Holding { .. })
            {
                actions.push(Action::Crash(c));
            }
        }
        if matches!(s.resend, Resend::Pending(..)) {
            actions.push(Action::Resent);
        }
        for i in 0..s.messages.len() {
            let i = u8::try_from(i).expect("a handful of messages");
            actions.push(Action::GrantDelivered(i));
        }
        if self.may_tick(s) {
            actions.push(Action::Tick);
        }
        for by in 1..=self.steps_left(s) {
            actions.push(Action::ClockStepBack(by));
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Acquire(c, mode) => self.acquire(&mut s, c, Some(mode)),
            Action::AcquireRetry(c) => self.acquire(&mut s, c, None),
            Action::Resent => self.resent(&mut s),
            Action::GrantDelivered(i) => self.deliver(&mut s, usize::from(i)),
            Action::Renew(c) => self.renew(&mut s, c),
            Action::Release(c) => self.release(&mut s, c),
            Action::Crash(c) => s.clients[usize::from(c)] = Phase::Done,
            Action::Tick => {
                s.real += 1;
                s.server += 1;
                for c in &mut s.clients {
                    if let Phase::Waiting { retried, .. } = c {
                        *retried = self.fair.is_none();
                    }
                }
                s.expire();
            }
            Action::ClockStepBack(by) => {
                s.server -= by;
                s.stepped = by;
            }
        }
        self.normalize(&mut s);
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties::all(self)
    }
}
