//! Which offsets of each partition are settled, and the offset to commit:
//! the one after the longest settled run from the partition's start.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Instant;

/// One message read from a partition, as the source holds it.
#[derive(Debug, Clone)]
pub(super) struct Polled {
    pub(super) partition: i32,
    pub(super) offset: i64,
    pub(super) generation: u64,
    pub(super) id: Option<String>,
    pub(super) payload: Vec<u8>,
    pub(super) count: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Slot {
    /// Read, not handed to a handler (in the channel, or waiting to retry).
    Waiting,
    /// With a handler.
    Handed,
    /// Acked or dead-lettered.
    Settled,
}

/// One partition this consumer owns.
#[derive(Debug)]
pub(super) struct Owned {
    pub(super) generation: u64,
    pub(super) slots: BTreeMap<i64, Slot>,
    /// The offset committed (or about to be): the next one to read.
    pub(super) committed: Option<i64>,
    /// Revoked: nothing more is handed out, running handlers drain.
    pub(super) revoking: bool,
}

impl Owned {
    /// Drops the settled run from the start; returns the offset to commit
    /// when it moved.
    pub(super) fn advance(&mut self) -> Option<i64> {
        let mut frontier = None;
        while let Some((&offset, &slot)) = self.slots.first_key_value() {
            if slot != Slot::Settled {
                break;
            }
            self.slots.remove(&offset);
            frontier = Some(offset + 1);
        }
        let frontier = frontier?;
        if self.committed.is_some_and(|c| c >= frontier) {
            return None;
        }
        self.committed = Some(frontier);
        Some(frontier)
    }

    pub(super) fn handed(&self) -> usize {
        self.slots.values().filter(|s| **s == Slot::Handed).count()
    }
}

/// What the librdkafka thread and the deliveries share.
#[derive(Debug, Default)]
pub(super) struct Tracker {
    pub(super) owned: HashMap<i32, Owned>,
    pub(super) generations: u64,
    /// Offsets settled since the last commit, per partition.
    pub(super) to_commit: BTreeMap<i32, i64>,
    /// Messages handed back, due at their instant.
    pub(super) retries: VecDeque<(Instant, Polled)>,
}

impl Tracker {
    pub(super) fn assign(&mut self, partition: i32) {
        if self.owned.get(&partition).is_some_and(|o| !o.revoking) {
            return;
        }
        self.generations += 1;
        self.owned.insert(
            partition,
            Owned {
                generation: self.generations,
                slots: BTreeMap::new(),
                committed: None,
                revoking: false,
            },
        );
    }

    /// The partition's state for a delivery of `generation`, if this
    /// consumer still owns it under that generation.
    pub(super) fn current(&mut self, partition: i32, generation: u64) -> Option<&mut Owned> {
        self.owned
            .get_mut(&partition)
            .filter(|o| o.generation == generation)
    }

    pub(super) fn settle(&mut self, partition: i32, generation: u64, offset: i64) -> bool {
        let Some(owned) = self.current(partition, generation) else {
            return false;
        };
        let Some(slot) = owned.slots.get_mut(&offset) else {
            return false;
        };
        *slot = Slot::Settled;
        if let Some(frontier) = owned.advance() {
            self.to_commit.insert(partition, frontier);
        }
        true
    }
}
