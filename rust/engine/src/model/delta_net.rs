//! The Gated DeltaNet sublayer (Qwen3-Next, Qwen3.5), a token mixer with a fixed-size state per
//! sequence in place of attention: one GEMM projects q, k and v (through a short causal
//! convolution and SiLU), the output gate z and per value head the write strength β = σ(b) and
//! the decay log g = -exp(A_log) · softplus(a + dt_bias); q and k are L2-normalized; the gated
//! delta rule (`rsgl_kernels::delta_rule`) runs per value head, chunked over a prompt and token
//! by token when decoding; each head's output is RMS-normalized, times SiLU(z), into out_proj.

use super::decoder::Step;
use super::linear::{Compute, Linear, LinearParts};
use super::mlp::{take_linear, Ranks};
use super::recurrent::{first_tokens, softplus, state_slot, CausalConv};
use super::Precision;
use crate::config::{GatedDeltaNet, ModelConfig};
use crate::error::{EngineError, Result};
use crate::weights::WeightStore;
use rsgl_kernels::delta_rule::DeltaRun;
use rsgl_kernels::pool::SendPtr;
use rsgl_kernels::portable::exp;

/// transformers' (and flash-linear-attention's) epsilon of the q/k L2 norm.
const L2_NORM_EPS: f32 = 1e-6;

pub(super) struct DeltaNet {
    /// Rows: q, k and v (the convolution's channels), z (value-head wide), b, then a (one each
    /// per value head).
    in_proj: Linear,
    conv: CausalConv,
    /// `-exp(A_log)` per value head.
    decay_rate: Vec<f32>,
    dt_bias: Vec<f32>,
    /// The gated RMS norm's weight, shared by the value heads (scales by `w`, not `1 + w`).
    norm: Vec<f32>,
    out: Linear,
    shape: GatedDeltaNet,
    eps: f32,
}

impl DeltaNet {
    /// Layer `l`'s `linear_attn`, as Qwen3.5 stores it (`in_proj_qkv`, `in_proj_z`, `in_proj_b`,
    /// `in_proj_a`) or Qwen3-Next (`in_proj_qkvz` and `in_proj_ba`, grouped by key head; its
    /// GGUF files split `in_proj_qkvz` as Qwen3.5's); the decay rates as `A_log` or, from GGUF
    /// files, as the `A = -exp(A_log)` they are.
    pub fn take(w: &mut WeightStore, l: usize, cfg: &ModelConfig, shape: &GatedDeltaNet, precision: &Precision, ranks: &Ranks) -> Result<Vec<DeltaNet>> {
        if ranks.len() > 1 {
            return Err(EngineError::InvalidRequest(format!("rsgl runs {} models' Gated DeltaNet layers on one rank: use tp_size 1", cfg.architecture)));
        }
        let prefix = format!("model.layers.{l}.linear_attn");
        let h = cfg.hidden_size;
        let GatedDeltaNet { key_heads, value_heads, key_head_dim: dk, value_head_dim: dv, conv_kernel, .. } = *shape;
        let channels = shape.conv_channels();
        let r = value_heads / key_heads;
        let take = |w: &mut WeightStore, name: &str, rows: usize| take_linear(w, &format!("{prefix}.{name}"), rows, h);
        let mut parts: Vec<LinearParts> = if w.contains(&format!("{prefix}.in_proj_qkvz.weight")) {
            let group = 2 * dk + 2 * r * dv;
            let qkvz = take(w, "in_proj_qkvz", key_heads * group)?;
            // Each key head's group holds its q, k, and its value heads' v and z.
            let pieces = [(0, dk), (dk, dk), (2 * dk, r * dv), (2 * dk + r * dv, r * dv)];
            pieces.iter().flat_map(|&(at, len)| (0..key_heads).map(move |g| (g * group + at, len))).map(|(at, len)| qkvz.output_rows(at..at + len)).collect()
        } else {
            vec![take(w, "in_proj_qkv", channels)?, take(w, "in_proj_z", value_heads * dv)?]
        };
        if w.contains(&format!("{prefix}.in_proj_ba.weight")) {
            let ba = take(w, "in_proj_ba", 2 * value_heads)?;
            // Each key head's group holds its value heads' b, then their a.
            parts.extend([0, r].iter().flat_map(|&at| (0..key_heads).map(move |g| 2 * r * g + at)).map(|at| ba.output_rows(at..at + r)));
        } else {
            parts.extend([take(w, "in_proj_b", value_heads)?, take(w, "in_proj_a", value_heads)?]);
        }
        let out = take_linear(w, &format!("{prefix}.out_proj"), h, value_heads * dv)?;
        let conv = CausalConv::take(w, &prefix, channels, conv_kernel)?;
        let decay_rate = match w.take_optional(&format!("{prefix}.A_log"), &[value_heads])? {
            Some(a_log) => a_log.iter().map(|&a| -exp(a)).collect(),
            None => w.take(&format!("{prefix}.A"), &[value_heads])?,
        };
        let dt_bias = w.take(&format!("{prefix}.dt_bias"), &[value_heads])?;
        let norm = w.take(&format!("{prefix}.norm.weight"), &[dv])?;
        let Precision { dtype, quantization, .. } = *precision;
        let pool = ranks[0].1;
        Ok(vec![DeltaNet {
            in_proj: Linear::fused(parts, dtype, quantization, pool),
            conv,
            decay_rate,
            dt_bias,
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
        let GatedDeltaNet { key_heads, value_heads, key_head_dim: dk, value_head_dim: dv, .. } = self.shape;
        let channels = self.shape.conv_channels();
        let slot_len = self.shape.state_len();
        let mut proj = self.in_proj.forward(c, x);
        let width = self.in_proj.out_features();
        let firsts = first_tokens(step);
        // The causal convolution and SiLU over each sequence's q, k and v, in place.
        self.conv.forward(c, step, &firsts, &mut proj, width, 0, states, slot_len);
        let states_at = SendPtr(states.as_mut_ptr());
        // The delta rule per sequence and value head.
        let tokens = x.len() / self.in_proj.weight_in_features();
        let mut core = vec![0.0f32; tokens * value_heads * dv];
        let core_at = SendPtr(core.as_mut_ptr());
        let proj = &proj;
        c.pool.for_each_dynamic(step.seqs.len() * value_heads, &|task| {
            let (s, head) = (task / value_heads, task % value_heads);
            let (chunk, first) = (&step.seqs[s], firsts[s]);
            let n = chunk.tokens.len();
            // This head's matrix within a slot.
            let matrix = self.conv.window_len() + head * dk * dv;
            // SAFETY: each task owns one head's matrix of its sequence's slot.
            let state = unsafe { std::slice::from_raw_parts_mut(states_at.get().add(state_slot(chunk) * slot_len + matrix), dk * dv) };
            if chunk.start_pos == 0 {
                state.fill(0.0);
            }
            let key_head = self.shape.key_head_of(head);
            let rows = || proj[first * width..(first + n) * width].chunks_exact(width);
            let gather = |at: usize, len: usize, scale: Option<f32>| -> Vec<f32> {
                let mut out = Vec::with_capacity(n * len);
                for row in rows() {
                    let piece = &row[at..at + len];
                    match scale {
                        Some(scale) => {
                            let norm = (piece.iter().map(|x| x * x).sum::<f32>() + L2_NORM_EPS).sqrt();
                            out.extend(piece.iter().map(|x| x / norm * scale));
                        }
                        None => out.extend_from_slice(piece),
                    }
                }
                out
            };
            let key_dim = key_heads * dk;
            let q = gather(key_head * dk, dk, Some(1.0 / (dk as f32).sqrt()));
            let k = gather(key_dim + key_head * dk, dk, Some(1.0));
            let v = gather(2 * key_dim + head * dv, dv, None);
            let (b_at, a_at) = (channels + value_heads * dv + head, channels + value_heads * dv + value_heads + head);
            let beta: Vec<f32> = rows().map(|row| 1.0 / (1.0 + exp(-row[b_at]))).collect();
            let g: Vec<f32> = rows().map(|row| self.decay_rate[head] * softplus(row[a_at] + self.dt_bias[head])).collect();
            let run = DeltaRun { q: &q, k: &k, v: &v, g: &g, beta: &beta, key_dim: dk, value_dim: dv };
            let mut out = vec![0.0f32; n * dv];
            // Up to the snapshot, then on: the snapshot's position is a chunk edge, so the split
            // changes no bits.
            let split = chunk.snapshot.map_or(n, |(at, _)| at);
            for (from, to) in [(0, split), (split, n)].into_iter().filter(|(from, to)| to > from) {
                let (piece, out) = (run.slice(from, to), &mut out[from * dv..to * dv]);
                match to - from {
                    1 => (c.kernels.delta_rule_recurrent)(&piece, state, out),
                    _ => (c.kernels.delta_rule_chunked)(&piece, chunk.start_pos + from, state, out),
                }
                if let Some((_, snapshot)) = chunk.snapshot.filter(|_| to == split) {
                    // SAFETY: as the state's: this head's matrix of the snapshot slot.
                    let copy = unsafe { std::slice::from_raw_parts_mut(states_at.get().add(snapshot * slot_len + matrix), dk * dv) };
                    copy.copy_from_slice(state);
                }
            }
            // RMS norm times SiLU(z), into this head's columns.
            let z_at = channels + head * dv;
            let mut normed = vec![0.0f32; dv];
            for (t, (o, row)) in out.chunks_exact(dv).zip(rows()).enumerate() {
                let inv = 1.0 / (o.iter().map(|x| x * x).sum::<f32>() / dv as f32 + self.eps).sqrt();
                normed.iter_mut().zip(o).zip(&self.norm).for_each(|((n, &o), &w)| *n = o * inv * w);
                // SAFETY: each task writes its own head's columns of its own tokens.
                let dst = unsafe { std::slice::from_raw_parts_mut(core_at.get().add(((first + t) * value_heads + head) * dv), dv) };
                (c.kernels.silu_mul)(&row[z_at..z_at + dv], &normed, dst);
            }
        });
        self.out.forward(c, &core)
    }
}
