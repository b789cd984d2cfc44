//! The permit scripts' shared `PRELUDE` (`engine/src/redis/permits/scripts.rs`), written
//! out with the same steps in the same order: `drop_expired`, `fits`, `grant`, `live_head`,
//! `pump` and `settle`. One [`Prelude`] is one script's run: like the Lua locals, what it
//! learns (whether the holders changed) lasts until the script ends.

use crate::permits::model::{Break, PermitsModel};
use crate::permits::state::{FenceField, Holder, Mode, State, Ticket};
use crate::state::{Grant, Owner};

/// One script's run over the state.
pub(crate) struct Prelude<'a> {
    /// The model (sizes, permits, break).
    model: &'a PermitsModel,
    /// The state the script changes.
    pub(crate) s: &'a mut State,
    /// The holders changed: `settle` sets the keys' expiry.
    dirty: bool,
}

impl<'a> Prelude<'a> {
    /// A script begins.
    pub(crate) fn new(model: &'a PermitsModel, s: &'a mut State) -> Self {
        Self {
            model,
            s,
            dirty: false,
        }
    }

    /// `drop_expired`: the holders whose lease ran out leave (with their fence field).
    pub(crate) fn drop_expired(&mut self) {
        let now = self.s.server;
        let before = self.s.holders.len();
        self.s.holders.retain(|h| h.expiry > now);
        self.dirty |= self.s.holders.len() != before;
    }

    /// The holders changed outside `grant` and `drop_expired` (a re-entry, a release, a
    /// renewal).
    pub(crate) fn touched(&mut self) {
        self.dirty = true;
    }

    /// Makes `holder` a holder, in the zset's order.
    pub(crate) fn insert(&mut self, holder: Holder) {
        let at = self.s.holders.partition_point(|h| *h < holder);
        self.s.holders.insert(at, holder);
    }

    /// `fits` (with `state`): a shared request while nobody holds alone and fewer than the
    /// limit hold; an exclusive one while nobody holds.
    pub(crate) fn fits(&self, mode: Mode) -> bool {
        let held = self.s.holders.len();
        let alone = held == 1 && self.s.holders[0].mode == Mode::Exclusive;
        match mode {
            Mode::Exclusive => held == 0,
            Mode::Shared => !alone && held < usize::from(self.model.permits),
        }
    }

    /// `grant`: `owner` holds for `px` ticks with fence `max(last + 1, now)`; `ahead` are
    /// the tickets that were ahead of its own (for the arrival-order check).
    pub(crate) fn grant(&mut self, owner: Owner, mode: Mode, px: u8, ahead: &[Ticket]) -> u16 {
        let last = self.s.fence.map_or(0, |f| f.fence);
        // The hash's TTL: kept by an `HSET` on a live hash; a new (or `DEL`eted, when
        // nobody holds) one gets its TTL from `settle`, which runs since this is dirty.
        let expiry = if self.s.holders.is_empty() {
            u8::MAX
        } else {
            self.s.fence.map_or(u8::MAX, |f| f.expiry)
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
    /// does not; each is a holder for its claim period and told by a message, except the
    /// caller's own ticket (`own`), which gets its full TTL. Returns the caller's fence if
    /// it was granted, and whether a ticket that does not fit is left waiting.
    pub(crate) fn pump(&mut self, own: Option<Owner>) -> (Option<u16>, bool) {
        let mut mine = None;
        loop {
            let Some(head) = self.live_head(own) else {
                return (mine, false);
            };
            let at = if self.fits(head.mode) || self.model.broken == Break::NoFitCheck {
                0
            } else if self.model.broken == Break::PumpPastBlocked
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
                let px = self.model.sizes.ttl.min(self.model.sizes.claim);
                let fence = self.grant(next.owner, next.mode, px, &ahead);
                self.s.messages.push(Grant {
                    owner: next.owner,
                    deadline: next.deadline,
                    fence,
                    px,
                });
            }
        }
    }

    /// `settle` (`expire`): when the holders changed, the fence hash expires the margin
    /// after the latest holder (or after now, when nobody holds). The zset's own expiry,
    /// its latest member's, is implied by [`State::expire`].
    pub(crate) fn settle(&mut self) {
        if !self.dirty {
            return;
        }
        let margin = self.model.sizes.margin;
        let base = self
            .s
            .holders
            .iter()
            .map(|h| h.expiry)
            .max()
            .unwrap_or(self.s.server);
        if let Some(f) = &mut self.s.fence {
            f.expiry = base + margin;
        }
    }
}
