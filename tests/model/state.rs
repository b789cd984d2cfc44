//! The model's state: the Redis keys of one lock (`lock`, `fence`, `queue`), the grant
//! messages in flight, the clients' own view of their lease, and two clocks.
//!
//! Time is discrete: one tick is the unit of every duration in [`Sizes`]. The server's clock
//! (`TIME`, and every key's expiry, which Redis judges by it too) is apart from real time,
//! which the clients' local deadlines follow (a monotonic clock): a server clock step back
//! makes every key live longer, never a client's local deadline.

/// The sizes and durations of one model, in ticks (one tick stands for about a second).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sizes {
    /// How many clients (each one engine with one waiter at a time).
    pub(crate) clients: u8,
    /// How many acquisitions each client makes in a run.
    pub(crate) sessions: u8,
    /// The lease TTL.
    pub(crate) ttl: u8,
    /// The ticket TTL, which is also the claim period of a hand-off (it travels in the ticket).
    pub(crate) claim: u8,
    /// The fence key's margin (10 s in the engine): how long a tombstone, and a hand-off's
    /// fence after its claim, live.
    pub(crate) margin: u8,
    /// How far the server clock may step back in a run, in total (the documented bound is
    /// less than `min(ttl, margin)`).
    pub(crate) step_back: u8,
    /// The last tick of real time (the model is finite; no tick past it).
    pub(crate) horizon: u8,
    /// Fences per tick: the server time in fence units (the engine's microseconds) is
    /// `server * FENCE_SCALE`. Larger than the grants a run can make, as a microsecond is
    /// shorter than a script.
    pub(crate) fence_scale: u16,
}

/// A client's acquisition: the client and which of its sessions (the engine's ticket id and
/// token are fresh for each).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Owner {
    /// The client.
    pub(crate) client: u8,
    /// Its session, from 1.
    pub(crate) session: u8,
}

/// `P:{T}:lock:K`: `"<fence>[+] <token>"` with its expiry.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct LockKey {
    /// The fence of the holding.
    pub(crate) fence: u16,
    /// The mark: the key may have waiters, so its release looks at the queue.
    pub(crate) marked: bool,
    /// Whose token.
    pub(crate) holder: Owner,
    /// Server time at which the key expires.
    pub(crate) expiry: u8,
}

/// `P:{T}:fence:K`: a tombstone (the released value) or a hand-off's fence (`"<f>@<exp>"`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct FenceKey {
    /// The fence it carries.
    pub(crate) fence: u16,
    /// A hand-off fence rather than a tombstone.
    pub(crate) handoff: bool,
    /// Server time at which it expires.
    pub(crate) expiry: u8,
}

/// One member of `P:{T}:queue:K`: `"<id>|<deadline>|<ttl>|<claim>|<token>"` and its score.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Ticket {
    /// Whose ticket (id and token).
    pub(crate) owner: Owner,
    /// Server time past which its waiter counts as gone.
    pub(crate) deadline: u8,
    /// Arrival order (`max(now, last + 1)` in fence units).
    pub(crate) score: u16,
}

/// A grant published on `P:{T}:wake:K`, on its way to the waiter's subscriber.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Grant {
    /// The ticket it grants.
    pub(crate) owner: Owner,
    /// The deadline of the ticket it granted: the waiter takes it only if it names its
    /// latest registration (a grant of an earlier one is stale, its claim may be over).
    pub(crate) deadline: u8,
    /// The fence.
    pub(crate) fence: u16,
    /// The `PX` the hand-off set: the waiter's local deadline is counted from it.
    pub(crate) px: u8,
}

/// Where a client is.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Phase {
    /// Between sessions.
    Idle,
    /// Its ticket is queued (or its last attempt failed); it retries on its fallback timer.
    Waiting {
        /// Real time its wait began.
        since: u8,
        /// Real time its last attempt was sent: a hand-off's local deadline counts from it.
        sent: u8,
        /// The deadline of its registered member as its last reply named it (`None`: not
        /// registered).
        known: Option<u8>,
        /// It retried since the last tick (the fallback timer fires well within a tick).
        retried: bool,
    },
    /// It believes it holds the key until `deadline` (real time): the lease is valid locally.
    Holding {
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
    /// The lock key, when present (unexpired).
    pub(crate) lock: Option<LockKey>,
    /// The fence key, when present.
    pub(crate) fence: Option<FenceKey>,
    /// The queue, in score order.
    pub(crate) queue: Vec<Ticket>,
    /// The queue key's expiry (meaningful while the queue is non-empty).
    pub(crate) queue_expiry: u8,
    /// Grant messages in flight.
    pub(crate) messages: Vec<Grant>,
    /// Each client's phase and its sessions begun so far.
    pub(crate) clients: Vec<(Phase, u8)>,
    /// The highest fence any script has granted (fence monotonicity is checked against it).
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
            // Above the step back: a fence is never 0, which stands for "none yet".
            server: sizes.step_back + 1,
            stepped: 0,
            lock: None,
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

    /// Redis's expiry: a key whose expiry has come is gone. (The model deletes it at once,
    /// as Redis's active expiry would; a key Redis has not yet swept would revive on a
    /// clock step back, which the model does not show.)
    pub(crate) fn expire(&mut self) {
        let now = self.server;
        if self.lock.is_some_and(|l| l.expiry <= now) {
            self.lock = None;
        }
        if self.fence.is_some_and(|f| f.expiry <= now) {
            self.fence = None;
        }
        if !self.queue.is_empty() && self.queue_expiry <= now {
            self.queue.clear();
        }
    }

    /// Records a grant by a script: fence monotonicity, and arrival order (no live ticket
    /// of another waiter was ahead of the grantee's).
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
        s.lock = self.lock.map(|l| LockKey {
            holder: owner(l.holder),
            ..l
        });
        for t in &mut s.queue {
            t.owner = owner(t.owner);
        }
        for m in &mut s.messages {
            m.owner = owner(m.owner);
        }
        s.messages.sort();
        s
    }

    /// The least of the state's renumberings: clients are interchangeable, so the checker
    /// visits one state of each class (stateright's symmetry reduction).
    pub(crate) fn representative(&self) -> Self {
        let n = u8::try_from(self.clients.len()).expect("a handful of clients");
        let mut order: Vec<u8> = (0..n).collect();
        let mut best = self.renumbered(&order);
        // Every permutation (Heap's algorithm, iterative): six for three clients.
        let mut c = vec![0usize; order.len()];
        let mut i = 0;
        while i < order.len() {
            if c[i] < i {
                if i % 2 == 0 {
                    order.swap(0, i);
                } else {
                    order.swap(c[i], i);
                }
                best = best.min(self.renumbered(&order));
                c[i] += 1;
                i = 0;
            } else {
                c[i] = 0;
                i += 1;
            }
        }
        best
    }
}
