//! The Mamba-2 sublayer (Granite 4's hybrids), a token mixer with a fixed-size state per sequence
//! in place of attention: one GEMM projects the gate z, then x, B and C (through a short causal
//! convolution and SiLU) and per head the step size Δ = softplus(dt + dt_bias); the selective
//! state space recurrence (`rsgl_kernels::ssd`, decay exp(Δ A) with A = -exp(A_log), skip D) runs
//! per head, its heads in groups sharing B and C, chunked over a prompt and token by token when
//! decoding; the output times SiLU(z) is RMS-normalized per group into out_proj.

use super::decoder::Step;
use super::linear::{Compute, Linear};
use super::mlp::{take_linear, Ranks};
use super::recurrent::{first_tokens, softplus, state_slot, CausalConv};
use super::Precision;
use crate::config::{Mamba2, ModelConfig};
use crate::error::{EngineError, Result};
use crate::weights::WeightStore;
use rsgl_kernels::pool::SendPtr;
use rsgl_kernels::portable::exp;
use rsgl_kernels::ssd::{chunked, recurrent, SsdRun};

pub(super) struct Mamba2Layer {
    /// Rows: z (every head's), x, B and C (the convolution's channels), then dt (one per head).
    in_proj: Linear,
    conv: CausalConv,
    /// `-exp(A_log)` per head.
    decay_rate: Vec<f32>,
    dt_bias: Vec<f32>,
    /// D per head.
    skip: Vec<f32>,
    /// The gated RMS norm's weight over every head's outputs.
    norm: Vec<f32>,
    out: Linear,
    shape: Mamba2,
    eps: f32,
}

impl Mamba2Layer {
    /// Layer `l`'s `mamba`.
    pub fn take(w: &mut WeightStore, l: usize, cfg: &ModelConfig, shape: &Mamba2, precision: &Precision, ranks: &Ranks) -> Result<Vec<Mamba2Layer>> {
        if ranks.len() > 1 {
            return Err(EngineError::InvalidRequest(format!("rsgl runs {} models' Mamba-2 layers on one rank: use tp_size 1", cfg.architecture)));
        }
        let prefix = format!("model.layers.{l}.mamba");
        let (h, inner, channels, heads) = (cfg.hidden_size, shape.inner_size(), shape.conv_channels(), shape.heads);
        let in_proj = take_linear(w, &format!("{prefix}.in_proj"), inner + channels + heads, h)?;
        let out = take_linear(w, &format!("{prefix}.out_proj"), h, inner)?;
        let conv = CausalConv::take(w, &prefix, channels, shape.conv_kernel)?;
        let decay_rate = w.take(&format!("{prefix}.A_log"), &[heads])?.iter().map(|&a| -exp(a)).collect();
        let dt_bias = w.take(&format!("{prefix}.dt_bias"), &[heads])?;
        let skip = w.take(&format!("{prefix}.D"), &[heads])?;
        let norm = w.take(&format!("{prefix}.norm.weight"), &[inner])?;
        let Precision { dtype, quantization, .. } = *precision;
        let pool = ranks[0].1;
        Ok(vec![Mamba2Layer {
            in_proj: Linear::fused(vec![in_proj], dtype, quantization, pool),
            conv,
            decay_rate,
            dt_bias,
            skip,
            norm,
            out: Linear::fused(vec![out], dtype, quantization, pool),
            shape: shape.clone(),
            eps: cfg.rms_norm_eps,
        }])
    }

    /// The sublayer's output for the normalized input `x`, stepping each sequence's state in
    /// `states` (every slot's state of this layer; a chunk at position 0 starts from zeros),
    /// and copying it into a snapshot slot where a chunk asks for one.
    pub fn forward(&self, c: &Compute, x: &[f32], states: &mut [f32], step: &Step) -> Vec<f32> {
        let Mamba2 { heads, head_dim: p, state_size: n, groups, .. } = self.shape;
        let (inner, channels, slot_len) = (self.shape.inner_size(), self.shape.conv_channels(), self.shape.state_len());
        let mut proj = self.in_proj.forward(c, x);
        let width = self.in_proj.out_features();
        let firsts = first_tokens(step);
        // The causal convolution and SiLU over each sequence's x, B and C, in place.
        self.conv.forward(c, step, &firsts, &mut proj, width, inner, states, slot_len);
        let tokens = x.len() / self.in_proj.weight_in_features();
        let mut core = vec![0.0f32; tokens * inner];
        let (states_at, core_at) = (SendPtr(states.as_mut_ptr()), SendPtr(core.as_mut_ptr()));
        let proj = &proj;
        let heads_per_group = heads / groups;
        // The recurrence per sequence and head.
        c.pool.for_each_dynamic(step.seqs.len() * heads, &|task| {
            let (s, head) = (task / heads, task % heads);
            let (chunk, first) = (&step.seqs[s], firsts[s]);
            let tokens = chunk.tokens.len();
            // This head's state within a slot.
            let head_state = self.conv.window_len() + head * n * p;
            // SAFETY: each task owns one head's state of its sequence's slot.
            let state = unsafe { std::slice::from_raw_parts_mut(states_at.get().add(state_slot(chunk) * slot_len + head_state), n * p) };
            if chunk.start_pos == 0 {
                state.fill(0.0);
            }
            let rows = || proj[first * width..(first + tokens) * width].chunks_exact(width);
            let gather = |at: usize, len: usize| -> Vec<f32> { rows().flat_map(|row| &row[at..at + len]).copied().collect() };
            let group = head / heads_per_group;
            let xs = gather(inner + head * p, p);
            let b = gather(2 * inner + group * n, n);
            let c = gather(2 * inner + (groups + group) * n, n);
            let dt: Vec<f32> = rows().map(|row| softplus(row[inner + channels + head] + self.dt_bias[head])).collect();
            let run = SsdRun { x: &xs, dt: &dt, b: &b, c: &c, a: self.decay_rate[head], d: self.skip[head], head_dim: p, state_size: n };
            let mut out = vec![0.0f32; tokens * p];
            // Up to the snapshot, then on: the snapshot's position is a chunk edge, so the split
            // changes no bits.
            let split = chunk.snapshot.map_or(tokens, |(at, _)| at);
            for (from, to) in [(0, split), (split, tokens)].into_iter().filter(|(from, to)| to > from) {
                let (piece, out) = (run.slice(from, to), &mut out[from * p..to * p]);
                match to - from {
                    1 => recurrent(&piece, state, out),
                    _ => chunked(&piece, chunk.start_pos + from, state, out),
                }
                if let Some((_, snapshot)) = chunk.snapshot.filter(|_| to == split) {
                    // SAFETY: as the state's: this head's state in the snapshot slot.
                    let copy = unsafe { std::slice::from_raw_parts_mut(states_at.get().add(snapshot * slot_len + head_state), n * p) };
                    copy.copy_from_slice(state);
                }
            }
            for (t, o) in out.chunks_exact(p).enumerate() {
                // SAFETY: each task writes its own head's columns of its own tokens.
                let dst = unsafe { std::slice::from_raw_parts_mut(core_at.get().add((first + t) * inner + head * p), p) };
                dst.copy_from_slice(o);
            }
        });
        // Times SiLU(z), then RMS-normalized per group of heads.
        let group_width = inner / groups;
        c.pool.for_chunks_mut(&mut core, inner, &|t, row| {
            let z = &proj[t * width..t * width + inner];
            let y = row.to_vec();
            (c.kernels.silu_mul)(z, &y, row);
            for (group, weight) in row.chunks_exact_mut(group_width).zip(self.norm.chunks_exact(group_width)) {
                let inv = 1.0 / (group.iter().map(|y| y * y).sum::<f32>() / group_width as f32 + self.eps).sqrt();
                group.iter_mut().zip(weight).for_each(|(y, &w)| *y = *y * inv * w);
            }
        });
        self.out.forward(c, &core)
    }
}
