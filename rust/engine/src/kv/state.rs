//! The recurrent layers' per-sequence states (Gated DeltaNet's and Mamba-2's convolution windows,
//! delta-rule matrices and state space states), which take the place of their KV pages: a fixed number of slots, sized at start-up,
//! each holding one running sequence's state in every recurrent layer whatever its length.

use crate::config::ModelConfig;
use rsgl_kernels::memory::HugePageBuffer;

/// Every slot's state, per layer (empty for the layers that attend): each layer's slots are its
/// own length (`ModelConfig::state_len`).
pub struct RecurrentStates {
    layers: Vec<HugePageBuffer<f32>>,
}

impl RecurrentStates {
    pub fn new(cfg: &ModelConfig, slots: usize) -> Self {
        let layers = (0..cfg.num_hidden_layers).map(|layer| HugePageBuffer::zeroed(slots * cfg.state_len(layer))).collect();
        RecurrentStates { layers }
    }

    /// Every slot's state in `layer`, slot after slot.
    pub fn layer_mut(&mut self, layer: usize) -> &mut [f32] {
        &mut self.layers[layer]
    }
}

/// The free slots of [`RecurrentStates`]; a sequence takes one when admitted and gives it back
/// when it finishes, is aborted or is retracted.
pub struct StateSlots {
    free: Vec<u32>,
    total: usize,
}

impl StateSlots {
    pub fn new(total: usize) -> Self {
        StateSlots { free: (0..total as u32).rev().collect(), total }
    }

    pub fn total(&self) -> usize {
        self.total
    }

    pub fn free(&self) -> usize {
        self.free.len()
    }

    pub fn take(&mut self) -> Option<u32> {
        self.free.pop()
    }

    pub fn give_back(&mut self, slot: u32) {
        debug_assert!(!self.free.contains(&slot) && (slot as usize) < self.total, "slot {slot} given back twice");
        self.free.push(slot);
    }
}
