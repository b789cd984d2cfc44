//! The permits model's state: the three Redis keys of one permit set (`pholders`, `pfence`,
//! `pqueue`), the grant messages in flight, the clients' own view of their lease, and the
//! two clocks (real time, and the server's, as in the lock model: see `crate::state`).

use crate::runner::permutations;
use crate::state::{Grant, Owner, Sizes};

/// What an acquisition asks for.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Mode {
    /// One of the shared permits (`'s'`).
    Shared,
    /// The key alone (`'x'`).
    Exclusive,
}

/// One member of `P:{T}:pholders:K` (its token and its expiry) with its field
/// `t:<token>` = `"<fence> <s|x>"` of `P:{T}:pfence:K`. The hash outlives every member (its
/// TTL is the latest expiry plus the margin), so the model keeps the two together.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Holder {
    /// Server time at which its lease runs out (the member's score).
    pub(crate) expiry: u8,
    /// Whose token.
    pub(crate) owner: Owner,
    /// Its fence.
    pub(crate) fence: u16,
    /// Shared or exclusive.
    pub(crate) mode: Mode,
}

/// The field `fence` of `P:{T}:pfence:K` (the last fence granted: the tombstone once nobody
/// holds) and the hash's expiry.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct FenceField {
    /// The last fence granted.
    pub(crate) fence: u16,
    /// Server time at which the hash expires.
    pub(crate) expiry: u8,
}

/// One member of `P:{T}:pqueue:K`:
/// `"<id>|<deadline>|<ttl>|<claim>|<permits>|<s|x>|<token>"` and its score. (TTL, claim and
/// permits are the same for every client of the model.)
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Ticket {
    /// Whose ticket (id and token).
    pub(crate) owner: Owner,
    /// Server time past which its waiter counts as gone.
    pub(crate) deadline: u8,
    /// Arrival order (`max(now, last + 1)` in fence units).
    pub(crate) score: u16,
    /// What it asks for.
    pub(crate) mode: Mode,
}

/// Where a client is.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Phase {
    /// Between sessions.
    Idle,
    /// Its ticket is queued; it retries on its fallback timer.
    Waiting {
        /// What it asks for.
        mode: Mode,
        /// Real time its wait began.
        since: u8,
        /// Real time its last attempt was sent: a hand-off's local deadline counts from it.
        sent: u8,
        /// The deadline of its registered member as its last reply named it.
        known: Option<u8>,
        /// It retried since the last tick (the fallback timer fires well within a tick).
        retried: bool,
    },
    /// It believes it holds a permit until `deadline` (real time).
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
    /// All its sessions are over.
    Done,
    /// Gone for good: what it left on the server stays until it expires.
    Crashed,
}

/// One state of the whole system.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct State {
    /// Real time (ticks).
    pub(crate) real: u8,
    /// The server clock (ticks); starts above `step_back`, so that it stays above zero.
    pub(crate) server: u8,
    /// How far it has stepped back so far.
    pub(crate) stepped: u8,
    /// The holders, by expiry (then owner). A member whose expiry has passed stays until a
    /// script drops it (`drop_expired`) or the whole key expires: a clock step back
    /// revives it, as it would in Redis.
    pub(crate) holders: Vec<Holder>,
    /// The fence hash's `fence` field, when the hash is present.
    pub(crate) fence: Option<FenceField>,
    /// The queue, in score order.
    pub(crate) queue: Vec<Ticket>,
    /// The queue key's expiry (meaningful while the queue is non-empty).
    pub(crate) queue_expiry: u8,
    /// Grant messages in flight (the lock's message format).
    pub(crate) messages: Vec<Grant>,
    /// Each client's phase and its sessions begun so far.
    pub(crate) clients: Vec<(Phase, u8)>,
    /// The highest fence any script has granted.
    pub(crate) last_fence: u16,
    /// A grant went out with a fence not above `last_fence`.
    pub(crate) fence_regressed: bool,
    /// A grant went to someone while another's live ticket was ahead of it in the queue.
    pub(crate) overtaken: bool,
}

impl State {
    /// The initial state: nothing on the server, every client idle.
    pub(crate) fn initial(sizes: &Sizes) -> Self {
        Self {
            real: 0,
            server: sizes.step_back + 1,
            stepped: 0,
            holders: Vec::new(),
            fence: None,
            queue: Vec::new(),
            queue_expiry: 0,
            messages: Vec::new(),
            clients: vec![(Phase::Idle, 0); usize::from(sizes.clients)],
            last_fence: 0,
            fence_regressed: false,
            overtaken: false,
        }
    }

    /// The server time in fence units (the scripts' `now_us`).
    pub(crate) fn now_us(&self, sizes: &Sizes) -> u16 {
        u16::from(self.server) * sizes.fence_scale
    }

    /// The client's current acquisition.
    pub(crate) fn owner(&self, client: u8) -> Owner {
        Owner {
            client,
            session: self.clients[usize::from(client)].1,
        }
    }

    /// Redis's key expiry (at once, as in the lock model): the holders' zset when its
    /// latest member has run out, the fence hash, the queue.
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
        let new_id = |old: u8| {
            let at = order.iter().position(|&o| o == old).expect("a permutation");
            u8::try_from(at).expect("a handful of clients")
        };
        let owner = |o: Owner| Owner {
            client: new_id(o.client),
            session: o.session,
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
        s
    }

    /// The least of the state's renumberings (clients are interchangeable).
    pub(crate) fn representative(&self) -> Self {
        let n = u8::try_from(self.clients.len()).expect("a handful of clients");
        permutations(n)
            .iter()
            .map(|order| self.renumbered(order))
            .min()
            .expect("at least one order")
    }
}
