//! [`Queue`]: the in-process store's slots in the order they were queued, with O(1)
//! removal from the middle.

use std::collections::VecDeque;

use super::slot::Slot;

/// Slots in the order they were queued, each at the position it was given (its `seq`),
/// so that one can be taken out from the middle in O(1), leaving a hole that is dropped
/// once it reaches the front.
#[derive(Default)]
pub(super) struct Queue {
    /// The position of `slots[0]`.
    pub(super) head: u64,
    pub(super) slots: VecDeque<Option<Slot>>,
}

impl Queue {
    /// The position the next slot pushed gets.
    pub(super) fn next(&self) -> u64 {
        self.head + self.slots.len() as u64
    }

    pub(super) fn push(&mut self, slot: Slot) {
        debug_assert_eq!(slot.seq(), self.next());
        self.slots.push_back(Some(slot));
    }

    pub(super) fn front(&self) -> Option<&Slot> {
        self.slots.front().and_then(Option::as_ref)
    }

    pub(super) fn remove(&mut self, seq: u64) {
        if let Some(index) = seq.checked_sub(self.head)
            && let Some(slot) = self.slots.get_mut(index as usize)
        {
            *slot = None;
        }
        self.trim();
    }

    /// Drop the holes at the front, and give memory back after a burst.
    pub(super) fn trim(&mut self) {
        while matches!(self.slots.front(), Some(None)) {
            self.slots.pop_front();
            self.head += 1;
        }
        if self.slots.capacity() > 64 && self.slots.len() < self.slots.capacity() / 4 {
            self.slots.shrink_to(self.slots.len() * 2);
        }
    }
}
