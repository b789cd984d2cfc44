//! The steps every script shares, written out in the same order as the scripts run them:
//! `drop_expired`, `fits`, `grant`, `live_head`, `pump` and `settle`. One [`Script`] is one
//! script's run: like the Lua locals, what it learns (whether the holders changed) lasts
//! until the script ends.

use crate::model::{Break, Protocol};
use crate::state::{FenceField, Grant, Holder, Mode, Owner, State, Ticket};

/// One script's run over the state.
pub(crate) struct Script<'a> {
    /// The model (sizes, break).
    model: &'a Protocol,
    /// The state the script changes.
    pub(crate) s: &'a mut State,
    /// The holders changed: `settle` sets the fence's expiry.
    dirty: bool,
}

impl<'a> Script<'a> {
    /// A script begins: first `drop_expired`, the holders whose lease ran out leave.
    pub(crate) fn new(model: &'a Protocol, s: &'a mut State) -> Self {
        let now = s.server;
        let before = s.holders.len();
        s.holders.retain(|h| h.expiry > now);
        let dirty = s.holders.len() != before;
        Self { model, s, dirty }
    }

    /// The holders changed outside `grant` (a re-entry, a release, a renewal).
    pub(crate) fn touched(&mut self) {
        self.dirty = true;
    }

    /// Makes `holder` a holder, in the set's order.
    pub(crate) fn insert(&mut self, holder: Holder) {
        let at = self.s.holders.partition_point(|h| *h < holder);
        self.s.holders.insert(at, holder);
    }

    /// `fits`: an alone request while nobody holds; a shared one while nobody holds alone
    /// and fewer than the limit hold.
    pub(crate) fn fits(&self, mode: Mode) -> bool {
        let held = self.s.holders.len();
        let alone = self.s.holders.iter().any(|h| h.mode == Mode::Alone);
        match mode {
            Mode::Alone => held == 0,
            Mode::Shared => !alone && held < usize::from(self.model.sizes.limit),
        }
    }

    /// `grant`: `owner` holds for `px` ticks with fence `max(last + 1, now)`, in either
    /// mode; `ahead` are the tickets that were ahead of its own (for the arrival order).
    pub(crate) fn grant(&mut self, owner: Owner, mode: Mode, px: u8, ahead: &[Ticket]) -> u16 {
        let last = self.s.fence.map_or(0, |f| f.fence);
        // Its expiry: kept while someone holds; a new one (or one nobody's lease covers)
        // gets it from `settle`, which runs since this is dirty.
        let expiry = match self.s.fence {
            Some(f) if !self.s.holders.is_empty() => f.expiry,
            _ => u8::MAX,
        };
        let fence = (last + 1).max(self.s.now_us(&self.model.sizes));
        self.s.fence = Some(FenceField { fence, expiry });
        self.insert(Holder {
            expiry: self.s.server + px,
            owner,
            fence,
            mode,
        });
        self.dirty = true;
        self.s.granted(owner, fence, ahead);
        fence
    }

    /// `live_head`: drops dead tickets at the head (never the caller's own, `own`).
    fn live_head(&mut self, own: Option<Owner>) -> Option<Ticket> {
        while let Some(&head) = self.s.queue.first() {
            if Some(head.owner) == own || head.deadline > self.s.server {
                return Some(head);
            }
            self.s.queue.remove(0);
        }
        None
    }

    /// `pump`: grants the queue from its head as many as fit, stopping at the first that
    /// does not; each is a holder for its claim period and told by a message naming its
    /// ticket's nonce, except the caller's own ticket (`own`), which gets its full TTL.
    /// Returns the caller's fence if it was granted, and whether a ticket that does not
    /// fit is left waiting.
    pub(crate) fn pump(&mut self, own: Option<Owner>) -> (Option<u16>, bool) {
        let mut mine = None;
        loop {
            let Some(head) = self.live_head(own) else {
                return (mine, false);
            };
            let broken = self.model.broken;
            let at = if self.fits(head.mode) || broken == Break::NoFitCheck {
                0
            } else if broken == Break::PumpPastBlocked
                && let Some(i) = self.s.queue.iter().position(|t| {
                    (Some(t.owner) == own || t.deadline > self.s.server) && self.fits(t.mode)
                })
            {
                i
            } else {
                return (mine, true);
            };
            let ahead: Vec<Ticket> = self.s.queue[..at].to_vec();
            let next = self.s.queue.remove(at);
            if Some(next.owner) == own {
                mine = Some(self.grant(next.owner, next.mode, self.model.sizes.ttl, &ahead));
            } else {
                let px = self.model.px();
                let fence = self.grant(next.owner, next.mode, px, &ahead);
                self.s.messages.push(Grant {
                    owner: next.owner,
                    latest: next.latest,
                    deadline: next.deadline,
                    fence,
                });
            }
        }
    }

    /// The check of a lost wake-up, as a script that pumped ends: no live ticket (the
    /// caller's own counts as live, as in `pump`) is left at the head while it fits.
    pub(crate) fn check_woken(&mut self, own: Option<Owner>) {
        let now = self.s.server;
        let head = self
            .s
            .queue
            .iter()
            .find(|t| Some(t.owner) == own || t.deadline > now);
        if head.is_some_and(|h| self.fits(h.mode)) {
            self.s.stalled = true;
        }
    }

    /// `settle`: when the holders changed, the fence expires the margin after the latest
    /// holder (or after now, when nobody holds).
    pub(crate) fn settle(self) {
        if !self.dirty {
            return;
        }
        let base = self.s.holders.iter().map(|h| h.expiry).max();
        let base = base.unwrap_or(self.s.server);
        if let Some(f) = &mut self.s.fence {
            f.expiry = base + self.model.sizes.margin;
        }
    }
}
