//! The model's state: one key's holders (each alone or shared), its fence, its one queue
//! for both modes, the grant messages in flight, each client's own view of its lease, and
//! two clocks.
//!
//! Time is discrete: one tick is the unit of every duration in [`Sizes`]. The server's clock
//! (`TIME`, and every key's expiry, which Redis judges by it too) is apart from real time,
//! which the clients' local deadlines follow (a monotonic clock): a server clock step back
//! makes every key live longer, never a client's local deadline.

use crate::runner::permutations;

/// The sizes and durations of one model, in ticks (one tick stands for about a second).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sizes {
    /// How many clients (each one engine with one waiter at a time).
    pub(crate) clients: u8,
    /// How many shared holders at most (a shared request's limit; every client asks the
    /// same).
    pub(crate) limit: u8,
    /// The lease TTL.
    pub(crate) ttl: u8,
    /// The ticket TTL, which is also the claim period of a grant by message.
    pub(crate) claim: u8,
    /// The fence's margin (10 s in the engine): how long the last fence outlives the
    /// latest holder.
    pub(crate) margin: u8,
    /// How far the server clock may step back in a run: one step, of any size up to this.
    pub(crate) step_back: u8,
    /// The last tick of real time (the model is finite; no tick past it).
    pub(crate) horizon: u8,
    /// Fences per tick: the server time in fence units (the engine's microseconds) is
    /// `server * fence_scale`, larger than the grants a run can make.
    pub(crate) fence_scale: u16,
}

/// What an acquisition asks for.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Mode {
    /// Up to `limit` holders at once, none of them alone (`Mode::Shared { limit >= 2 }`).
    Shared,
    /// The key alone (`lock(k)`, `Mode::Exclusive`, or a shared limit of 1).
    Alone,
}

/// A client's acquisition: the client and which of its sessions (the engine's ticket id and
/// token are fresh for each). One session per client: the id is the client.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Owner(pub(crate) u8);

/// A holder of the key, with its lease's expiry (server time) and its fence.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Holder {
    /// Server time at which its lease runs out.
    pub(crate) expiry: u8,
    /// Whose token.
    pub(crate) owner: Owner,
    /// Its fence.
    pub(crate) fence: u16,
    /// Alone or shared.
    pub(crate) mode: Mode,
}

/// The key's last fence (the tombstone once nobody holds) and its expiry.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct FenceField {
    /// The last fence granted.
    pub(crate) fence: u16,
    /// Server time at which it expires.
    pub(crate) expiry: u8,
}

/// One ticket of the key's queue.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Ticket {
    /// Whose ticket (its id).
    pub(crate) owner: Owner,
    /// Server time past which its waiter counts as gone.
    pub(crate) deadline: u8,
    /// Arrival order.
    pub(crate) score: u16,
    /// What it asks for.
    pub(crate) mode: Mode,
    /// Its registration's nonce is the owner's latest. The engine's nonce is random; the
    /// model keeps only this bit of it, as nothing compares two earlier nonces.
    pub(crate) latest: bool,
}

/// A grant published for a ticket, on its way to the waiter's subscriber.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Grant {
    /// The ticket it grants.
    pub(crate) owner: Owner,
    /// It names the owner's latest registration nonce.
    pub(crate) latest: bool,
    /// The granted ticket's deadline (only the old rule, `Break::DeadlineRule`, reads it).
    pub(crate) deadline: u8,
    /// The fence.
    pub(crate) fence: u16,
}

/// Where a client is.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Phase {
    /// Before its session.
    Idle,
    /// Its ticket is queued; it retries on its fallback timer.
    Waiting {
        /// What it asks for.
        mode: Mode,
        /// Real time its wait began.
        since: u8,
        /// Real time its last attempt was sent: a grant's local deadline counts from it.
        sent: u8,
        /// Its ticket's deadline as its last reply named it (only the old rule reads it).
        known: u8,
        /// It retried since the last tick (the fallback timer fires well within a tick).
        retried: bool,
    },
    /// It believes it holds the key until `deadline` (real time).
    Holding {
        /// What it holds.
        mode: Mode,
        /// Its fence.
        fence: u16,
        /// The local validity deadline (real time); past it the lease is lost.
        deadline: u8,
        /// Real time it was granted.
        since: u8,
    },
    /// Its session is over (or it crashed: what it left on the server stays until it
    /// expires, and its re-sent request may still arrive).
    Done,
}

/// The copy of a registration that the connection sends again (the Cluster client
/// re-sends after a dropped connection): one in a run, the first registration's, which
/// arrives at any later point while its waiter still waits, or never.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Resend {
    /// No registration yet.
    Unused,
    /// In flight: whose, in which mode, and whether its nonce is still the latest.
    Pending(Owner, Mode, bool),
    /// Arrived, or its waiter moved on.
    Spent,
}

/// One state of the whole system.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct State {
    /// Real time (ticks).
    pub(crate) real: u8,
    /// The server clock (ticks); starts above `step_back`, so that it stays above zero.
    pub(crate) server: u8,
    /// How far it has stepped back (once in a run).
    pub(crate) stepped: u8,
    /// The holders, by expiry (then owner). A holder whose expiry has passed stays until a
    /// script drops it or the whole key expires: a clock step back revives it, as in Redis.
    pub(crate) holders: Vec<Holder>,
    /// The last fence, when present.
    pub(crate) fence: Option<FenceField>,
    /// The queue, in score order: one for both modes.
    pub(crate) queue: Vec<Ticket>,
    /// The queue key's expiry (meaningful while the queue is non-empty).
    pub(crate) queue_expiry: u8,
    /// Grant messages in flight.
    pub(crate) messages: Vec<Grant>,
    /// Each client's phase.
    pub(crate) clients: Vec<Phase>,
    /// The copy of a registration.
    pub(crate) resend: Resend,
    /// The highest fence any script has granted (fence monotonicity is checked against it).
    pub(crate) last_fence: u16,
    /// A grant went out with a fence not above `last_fence`.
    pub(crate) fence_regressed: bool,
    /// A grant went to someone while another's live ticket was ahead of it in the queue.
    pub(crate) overtaken: bool,
    /// A script ended with a live ticket at the queue's head that fits, ungranted.
    pub(crate) stalled: bool,
}

impl State {
    /// The initial state: nothing on the server, every client idle.
    pub(crate) fn initial(sizes: &Sizes) -> Self {
        Self {
            real: 0,
            // Above the step back: a fence is never 0, which stands for "none yet".
            server: sizes.step_back + 1,
            stepped: 0,
            holders: Vec::new(),
            fence: None,
            queue: Vec::new(),
            queue_expiry: 0,
            messages: Vec::new(),
            clients: vec![Phase::Idle; usize::from(sizes.clients)],
            resend: Resend::Unused,
            last_fence: 0,
            fence_regressed: false,
            overtaken: false,
            stalled: false,
        }
    }

    /// The server time in fence units (the scripts' `now_us`).
    pub(crate) fn now_us(&self, sizes: &Sizes) -> u16 {
        u16::from(self.server) * sizes.fence_scale
    }

    /// Redis's key expiry, at once (a key Redis has not yet swept would revive on a clock
    /// step back, which the model does not show): the holders when the latest has run
    /// out, the fence, the queue.
    pub(crate) fn expire(&mut self) {
        let now = self.server;
        if self.holders.iter().all(|h| h.expiry <= now) {
            self.holders.clear();
        }
        if self.fence.is_some_and(|f| f.expiry <= now) {
            self.fence = None;
        }
        if !self.queue.is_empty() && self.queue_expiry <= now {
            self.queue.clear();
        }
    }

    /// Records a grant by a script: fence monotonicity, and arrival order (no live ticket
    /// of another waiter in `ahead`).
    pub(crate) fn granted(&mut self, to: Owner, fence: u16, ahead: &[Ticket]) {
        if fence <= self.last_fence {
            self.fence_regressed = true;
        }
        self.last_fence = self.last_fence.max(fence);
        let now = self.server;
        if ahead.iter().any(|t| t.owner != to && t.deadline > now) {
            self.overtaken = true;
        }
    }

    /// The same state with the clients renumbered by `order` (`order[new] = old`).
    fn renumbered(&self, order: &[u8]) -> Self {
        let owner = |o: Owner| {
            let at = order
                .iter()
                .position(|&old| old == o.0)
                .expect("a permutation");
            Owner(u8::try_from(at).expect("a handful of clients"))
        };
        let mut s = self.clone();
        s.clients = order
            .iter()
            .map(|&o| self.clients[usize::from(o)])
            .collect();
        for h in &mut s.holders {
            h.owner = owner(h.owner);
        }
        s.holders.sort();
        for t in &mut s.queue {
            t.owner = owner(t.owner);
        }
        for m in &mut s.messages {
            m.owner = owner(m.owner);
        }
        s.messages.sort();
        if let Resend::Pending(o, mode, latest) = s.resend {
            s.resend = Resend::Pending(owner(o), mode, latest);
        }
        s
    }

    /// The least of the state's renumberings: clients are interchangeable, so the checker
    /// visits one state of each class (stateright's symmetry reduction).
    pub(crate) fn representative(&self) -> Self {
        let n = u8::try_from(self.clients.len()).expect("a handful of clients");
        let orders = permutations(n);
        orders
            .iter()
            .map(|o| self.renumbered(o))
            .min()
            .expect("an order")
    }

    /// The same when the clients' modes are fixed, the first and the last alike: only
    /// those two are interchangeable.
    pub(crate) fn representative_ends(&self) -> Self {
        self.clone().min(self.renumbered(&[2, 1, 0]))
    }
}
