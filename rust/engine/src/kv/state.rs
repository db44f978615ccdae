//! The recurrent layers' per-sequence states (Gated DeltaNet's and Mamba-2's convolution windows,
//! delta-rule matrices and state-space states), which take the place of their KV pages: a fixed
//! number of slots, sized at start-up, each holding one running sequence's state in every
//! recurrent layer whatever its length.

use super::disk::PageHash;
use crate::config::ModelConfig;
use rsgl_kernels::memory::HugePageBuffer;
use std::collections::HashMap;

/// Every slot's state, per layer (empty for the layers that attend): each layer's slots are its
/// own length (`ModelConfig::state_len`).
pub struct RecurrentStates {
    slots: usize,
    layers: Vec<HugePageBuffer<f32>>,
}

impl RecurrentStates {
    pub fn new(cfg: &ModelConfig, slots: usize) -> Self {
        let layers = (0..cfg.num_hidden_layers).map(|layer| HugePageBuffer::zeroed(slots * cfg.state_len(layer))).collect();
        RecurrentStates { slots, layers }
    }

    /// Every slot's state in `layer`, slot after slot.
    pub fn layer_mut(&mut self, layer: usize) -> &mut [f32] {
        &mut self.layers[layer]
    }

    /// Copies slot `from`'s state into slot `to`, in every layer.
    pub fn copy_slot(&mut self, from: u32, to: u32) {
        let (from, to) = (from as usize, to as usize);
        for layer in self.layers.iter_mut().filter(|layer| !layer.is_empty()) {
            let len = layer.len() / self.slots;
            layer.copy_within(from * len..(from + 1) * len, to * len);
        }
    }
}

/// Who holds each slot of [`RecurrentStates`]: a running request (taken when it is admitted,
/// given back when it finishes, is aborted or is retracted), or the prefix cache, as a snapshot
/// of the state after a prefix of whole pages (found by the prefix's page hash). A request that
/// finds a snapshot of its prompt's prefix starts from a copy of it. Snapshots are evicted least
/// recently used first when a request needs a slot.
pub(crate) struct StateSlots {
    free: Vec<u32>,
    total: usize,
    snapshots: HashMap<PageHash, Snapshot>,
    clock: u64,
}

struct Snapshot {
    slot: u32,
    last_use: u64,
}

impl StateSlots {
    pub fn new(total: usize) -> Self {
        StateSlots { free: (0..total as u32).rev().collect(), total, snapshots: HashMap::new(), clock: 0 }
    }

    /// Slots neither a request nor a snapshot holds.
    pub fn free(&self) -> usize {
        self.free.len()
    }

    pub fn snapshots(&self) -> usize {
        self.snapshots.len()
    }

    /// A slot, evicting the least recently used snapshot when none is free.
    pub fn take(&mut self) -> Option<u32> {
        if self.free.is_empty() {
            let (&oldest, _) = self.snapshots.iter().min_by_key(|(_, snapshot)| snapshot.last_use)?;
            let evicted = self.snapshots.remove(&oldest).expect("just found");
            self.free.push(evicted.slot);
        }
        self.free.pop()
    }

    pub fn give_back(&mut self, slot: u32) {
        debug_assert!(!self.free.contains(&slot) && (slot as usize) < self.total, "slot {slot} given back twice");
        self.free.push(slot);
    }

    /// The longest prefix of `prefix_pages` (a prompt's page hashes, in order) with a snapshot:
    /// its length in pages and the snapshot's slot.
    pub fn longest_snapshot(&mut self, prefix_pages: &[PageHash]) -> Option<(usize, u32)> {
        self.clock += 1;
        let pages = prefix_pages.iter().rposition(|hash| self.snapshots.contains_key(hash))? + 1;
        let snapshot = self.snapshots.get_mut(&prefix_pages[pages - 1]).expect("just found");
        snapshot.last_use = self.clock;
        Some((pages, snapshot.slot))
    }

    /// Keeps `slot` as the snapshot of the prefix named `prefix`, unless one is kept already
    /// (then `slot` goes back to the free slots).
    pub fn keep_snapshot(&mut self, prefix: PageHash, slot: u32) {
        self.clock += 1;
        match self.snapshots.get_mut(&prefix) {
            Some(kept) => {
                kept.last_use = self.clock;
                self.give_back(slot);
            }
            None => drop(self.snapshots.insert(prefix, Snapshot { slot, last_use: self.clock })),
        }
    }

    /// Drops every snapshot.
    pub fn flush(&mut self) {
        let slots: Vec<u32> = self.snapshots.drain().map(|(_, snapshot)| snapshot.slot).collect();
        self.free.extend(slots);
    }
}
