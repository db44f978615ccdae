//! Granite 4's hybrids (GraniteMoeHybrid): Mamba-2 layers beside attention layers (the config's
//! `layer_types`), attention without rope where `position_embedding_type` says so, Llama's pre-norms,
//! and in every layer a shared MLP beside (or without) the experts, all stored Granite's way.
//! Its multipliers come from the config.

use super::{llama::LLAMA, Assembly, MlpLayout};

pub const GRANITE_MOE_HYBRID: Assembly = Assembly { mlp_layout: MlpLayout::GraniteShared, ..LLAMA };
