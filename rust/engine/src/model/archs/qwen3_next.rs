//! Qwen3-Next and Qwen3.5: three of every four layers mix tokens with a Gated DeltaNet (the
//! config's `layer_types`) and the rest with attention whose output is gated by a sigmoid of a
//! second half of q_proj; q and k normalized per head, rope over the first part of each head
//! (`partial_rotary_factor`), and RMS norms that scale by `1 + w` (the DeltaNet's gated norm
//! excepted). Qwen3-Next's MLPs are experts beside a gated shared expert.

use super::{llama::QWEN3, Assembly};

pub const QWEN3_NEXT: Assembly = Assembly { norm_weight_offset: 1.0, attention_output_gate: true, ..QWEN3 };
