//! The attention sublayer: q, k and v from one fused GEMM, their norms and rope, the new K/V
//! written to the sequence's pages, causal attention over them (sliding windows, sinks and soft
//! caps as the config says; both ways within the runs a chunk says), an optional sigmoid gate on
//! the output, and o_proj.

use super::archs::{Assembly, QkNorm};
use super::decoder::{scale_by, take_norm, Step};
use super::linear::{Compute, Linear, LinearParts};
use super::lora::{add_lora, LoraRows, LoraTarget};
use super::mlp::{take_linear, Ranks};
use super::rope::Rope;
use super::tensor_parallel::Shard;
use super::Precision;
use crate::config::ModelConfig;
use crate::error::Result;
use crate::kv::KvPart;
use crate::weights::WeightStore;
use rsgl_kernels::pool::SendPtr;
use rsgl_kernels::portable::exp;
use rsgl_kernels::profile::{self, Phase};
use rsgl_kernels::AttentionTask;

/// Query rows (tokens x heads of a kv group) one attention task covers: enough to reuse each
/// key page across rows, few enough that a prefill splits into many tasks to balance.
pub(super) const ATTENTION_TASK_ROWS: usize = 16;

/// Work items per thread a step's attention aims for: below it, tasks' key blocks split over
/// threads (a few sequences at a long context); a few per thread balance uneven ones.
const ATTENTION_PIECES_PER_THREAD: usize = 4;

/// An attention task and where its rows go: row `t` of its tokens at `out[offset + t * stride..]`.
pub(super) struct PlacedTask<'a> {
    pub task: AttentionTask<'a>,
    pub offset: usize,
    pub stride: usize,
}

/// Runs `tasks` on the pool, handed out dynamically (prefill tasks late in a prompt cost more
/// than early ones), each writing its rows of `out`. Where tasks are fewer than the threads'
/// share of work and their contexts span key blocks (batch-1 decode at a long context, MLA's one
/// task per sequence), each task's key blocks split over threads and their partials merge in
/// order afterwards (flash-decoding): the same bits as one thread, so no thread sits idle.
pub(super) fn run_attention(c: &Compute, tasks: &[PlacedTask], out: &mut [f32]) {
    if profile::enabled() {
        profile::add_bytes(tasks.iter().map(|placed| placed.task.bytes_read()).sum());
    }
    let (kern, dst) = (c.kernels, SendPtr(out.as_mut_ptr()));
    let target = ATTENTION_PIECES_PER_THREAD * c.pool.threads();
    let blocks: usize = tasks.iter().map(|t| t.task.key_blocks().len()).sum();
    if tasks.len() >= target || blocks <= tasks.len() {
        c.pool.for_each_dynamic(tasks.len(), &|i| {
            let placed = &tasks[i];
            // SAFETY: each task writes its own rows, and `out` holds them.
            unsafe { (kern.attention)(&placed.task, dst.get().add(placed.offset), placed.stride) };
        });
        return;
    }
    // (task, its key blocks this piece computes, where their partials go)
    let (mut pieces, mut starts, mut total) = (Vec::new(), Vec::with_capacity(tasks.len()), 0);
    for (i, placed) in tasks.iter().enumerate() {
        let (blocks, block_len) = (placed.task.key_blocks(), placed.task.block_partials_len());
        let per_piece = blocks.len().div_ceil(target.div_ceil(tasks.len()));
        for first in blocks.clone().step_by(per_piece) {
            pieces.push((i, first..(first + per_piece).min(blocks.end), total + (first - blocks.start) * block_len));
        }
        starts.push(total);
        total += blocks.len() * block_len;
    }
    let mut partials = vec![0.0; total];
    let into = SendPtr(partials.as_mut_ptr());
    c.pool.for_each_dynamic(pieces.len(), &|p| {
        let (i, ref blocks, at) = pieces[p];
        let task = &tasks[i].task;
        // SAFETY: pieces' partials are disjoint, and `partials` holds them all.
        let part = unsafe { std::slice::from_raw_parts_mut(into.get().add(at), blocks.len() * task.block_partials_len()) };
        (kern.attention_partials)(task, blocks.clone(), part);
    });
    c.pool.for_each_dynamic(tasks.len(), &|i| {
        let placed = &tasks[i];
        // SAFETY: as above, each task its own rows.
        unsafe { (kern.merge_partials)(&placed.task, &partials[starts[i]..], dst.get().add(placed.offset), placed.stride) };
    });
}

/// What every attention layer of one rank reads beside its own weights.
pub(super) struct AttentionContext<'a> {
    pub cfg: &'a ModelConfig,
    /// The global layers' rope, then the sliding layers' where it differs (Gemma 3).
    pub ropes: &'a [Rope],
    /// Attention scores' scale: 1/sqrt(head_dim) unless the config sets one.
    pub scale: f32,
    pub compute: &'a Compute,
    pub shard: &'a Shard,
}

/// One rank's slice of one layer's attention.
pub(super) struct Attention {
    /// q, k and v of this rank's heads, then their output gates where the layer has them.
    qkv: Linear,
    /// Each weight covers one head (per-head norms) or all of them (one norm over all heads).
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    /// Which of the model's rope tables rotates q and k; None in NoPE layers.
    rope: Option<usize>,
    /// Sliding-window layers: how many positions back a query sees (its own included).
    window: Option<usize>,
    /// Attention sinks (gpt-oss's `self_attn.sinks`, where the checkpoint has them): a learned
    /// logit per q head of this rank, in its softmax's denominator.
    sinks: Option<Vec<f32>>,
    output_gate: bool,
    o: Linear,
}

/// A layer's q, k and v projections (and q's output gates, each head's after its q, where
/// `gated`), from their own matrices or the one `qkv_proj` a checkpoint fuses them into (Phi-3).
fn take_qkv(w: &mut WeightStore, attn: &str, cfg: &ModelConfig, gated: bool) -> Result<[LinearParts; 3]> {
    let (h, q, kv) = (cfg.hidden_size, cfg.q_size(), cfg.kv_size());
    if w.contains(&format!("{attn}.qkv_proj.weight")) {
        let fused = take_linear(w, &format!("{attn}.qkv_proj"), q + 2 * kv, h)?;
        return Ok([fused.output_rows(0..q), fused.output_rows(q..q + kv), fused.output_rows(q + kv..q + 2 * kv)]);
    }
    let q_rows = if gated { 2 * q } else { q };
    let [q, k, v] = [("q_proj", q_rows), ("k_proj", kv), ("v_proj", kv)].map(|(proj, rows)| take_linear(w, &format!("{attn}.{proj}"), rows, h));
    Ok([q?, k?, v?])
}

impl Attention {
    /// Layer `l`'s attention (`model.layers.{l}.self_attn`), one slice per rank.
    pub fn take(w: &mut WeightStore, l: usize, cfg: &ModelConfig, assembly: &Assembly, precision: &Precision, ranks: &Ranks) -> Result<Vec<Attention>> {
        let (h, hd) = (cfg.hidden_size, cfg.head_dim);
        let attn = format!("model.layers.{l}.self_attn");
        let gated = assembly.attention_output_gate;
        let [q, k, v] = take_qkv(w, &attn, cfg, gated)?;
        let o = take_linear(w, &format!("{attn}.o_proj"), h, cfg.q_size())?;
        // A family that normalizes q and k may leave it to the config (GLM-4.5's `use_qk_norm`).
        let qk_norm = if cfg.qk_norm { assembly.qk_norm } else { QkNorm::None };
        let qk_norm_sizes = match qk_norm {
            QkNorm::None => None,
            QkNorm::PerHead => Some((hd, hd)),
            QkNorm::AllHeads => Some((cfg.q_size(), cfg.kv_size())),
        };
        let (q_norm, k_norm) = match qk_norm_sizes {
            Some((q, k)) => (Some(take_norm(w, &format!("{attn}.q_norm.weight"), q, cfg)?), Some(take_norm(w, &format!("{attn}.k_norm.weight"), k, cfg)?)),
            None => (None, None),
        };
        let sinks = w.take_optional(&format!("{attn}.sinks"), &[cfg.num_attention_heads])?;
        let sliding = cfg.sliding_window.as_ref().filter(|window| window.layers.contains(&l));
        let rope = match sliding {
            _ if cfg.no_rope_layers.contains(&l) => None,
            Some(window) if window.rope_theta.is_some() => Some(1),
            _ => Some(0),
        };
        let Precision { dtype, quantization, .. } = *precision;
        Ok(ranks
            .iter()
            .map(|&(shard, pool)| {
                let (q_rows, kv_rows) = (shard.q_rows(hd), shard.kv_rows(hd));
                let [gated_q_rows, gate_rows] = shard.gated_q_rows(hd);
                let mut qkv: Vec<LinearParts> = match gated {
                    // Each head's q, then its gate.
                    true => gated_q_rows.into_iter().map(|rows| q.output_rows(rows)).collect(),
                    false => vec![q.output_rows(q_rows.clone())],
                };
                qkv.extend([k.output_rows(kv_rows.clone()), v.output_rows(kv_rows)]);
                if gated {
                    qkv.extend(gate_rows.into_iter().map(|rows| q.output_rows(rows)));
                }
                Attention {
                    qkv: Linear::fused(qkv, dtype, quantization, pool),
                    q_norm: q_norm.clone(),
                    k_norm: k_norm.clone(),
                    rope,
                    window: sliding.map(|window| window.size),
                    sinks: sinks.as_ref().map(|sinks| sinks[shard.q_heads.clone()].to_vec()),
                    output_gate: gated,
                    o: Linear::fused(vec![o.input_columns(q_rows, shard.adds_bias())], dtype, quantization, pool),
                }
            })
            .collect())
    }

    /// The sublayer's output (this rank's partial sum) for the normalized input `x`; layer
    /// `layer`'s new K and V go into `kv`; `lora`'s rows add their adapters' updates of q, k, v
    /// and o.
    pub fn forward(&self, cx: &AttentionContext, x: &[f32], kv: &mut KvPart, layer: usize, step: &Step, lora: &[LoraRows]) -> Vec<f32> {
        let (c, hd) = (cx.compute, cx.cfg.head_dim);
        let (qs, kvs) = (cx.shard.q_heads.len() * hd, cx.shard.kv_heads.len() * hd);
        let row = self.qkv.out_features();
        let mut qkv = {
            let _phase = profile::phase(Phase::QkvProjection);
            let mut qkv = self.qkv.forward(c, x);
            // A fused `qkv_proj`'s update covers q|k|v, as the fused output does; gates follow v.
            let targets = [(LoraTarget::Q, 0), (LoraTarget::K, qs), (LoraTarget::V, qs + kvs), (LoraTarget::Qkv, 0), (LoraTarget::QGate, qs + 2 * kvs)];
            for (target, first) in targets {
                add_lora(c, lora, target, x, &mut qkv, row, first);
            }
            qkv
        };
        {
            let _phase = profile::phase(Phase::Rope);
            self.position_qk(cx, qs, kvs, &mut qkv, step);
        }
        let windowed = kv.is_windowed(layer);
        let kv_write = profile::phase(Phase::KvWrite);
        for (t, row) in qkv.chunks_exact(row).enumerate() {
            let (k, v) = row[qs..qs + 2 * kvs].split_at(kvs);
            kv.write(layer, step.seqs[step.token_seq[t]].table(windowed), step.positions[t], k, v);
        }
        drop(kv_write);
        let mut attn = {
            let _phase = profile::phase(Phase::Attention);
            self.attention(cx, &kv.layer(layer), windowed, &qkv, step)
        };
        if self.output_gate {
            let gates = qkv.chunks_exact(row).map(|row| &row[qs + 2 * kvs..]);
            for (out, gate) in attn.chunks_exact_mut(qs).zip(gates) {
                out.iter_mut().zip(gate).for_each(|(o, &g)| *o /= 1.0 + exp(-g));
            }
        }
        let _phase = profile::phase(Phase::OutputProjection);
        let mut out = self.o.forward(c, &attn);
        add_lora(c, lora, LoraTarget::O, &attn, &mut out, self.o.out_features(), 0);
        out
    }

    /// The q/k RMSNorms (per head, or over all heads: each weight's length says), then the
    /// layer's rope unless it is a NoPE one, on every token's q and k (this rank's heads), in place;
    /// then q's scale by position where the config has one.
    fn position_qk(&self, cx: &AttentionContext, qs: usize, kvs: usize, qkv: &mut [f32], step: &Step) {
        let (cfg, c) = (cx.cfg, cx.compute);
        let kern = c.kernels;
        c.pool.for_chunks_mut(qkv, self.qkv.out_features(), &|t, row| {
            let pos = step.positions[t];
            let (q, rest) = row.split_at_mut(qs);
            let k = &mut rest[..kvs];
            if let (Some(qn), Some(kn)) = (&self.q_norm, &self.k_norm) {
                let mut normed = vec![0.0; qn.len().max(kn.len())];
                for (heads, weight) in [(&mut *q, qn), (&mut *k, kn)] {
                    let normed = &mut normed[..weight.len()];
                    for head in heads.chunks_exact_mut(weight.len()) {
                        (kern.add_rmsnorm)(head, None, weight, cfg.rms_norm_eps, normed);
                        head.copy_from_slice(normed);
                    }
                }
            }
            match (self.rope.map(|index| &cx.ropes[index]), &step.rope_positions) {
                (Some(rope), Some(positions)) => {
                    rope.apply_3d(kern, q, k, positions[t]);
                }
                (Some(rope), None) => {
                    rope.apply(kern, q, pos);
                    rope.apply(kern, k, pos);
                }
                (None, _) => {}
            }
            if let Some(temperature) = &cfg.scales.query_temperature {
                scale_by(q, temperature.at(pos));
            }
        });
    }

    /// Causal attention of every new token over its sequence's positions `0..=pos` (the last
    /// `window` of them in a sliding layer; to the end of its run, for a token in a run attended
    /// both ways), for this rank's kv heads, as tasks of one kv head's query group over a run of
    /// consecutive tokens ([`run_attention`]).
    fn attention(&self, cx: &AttentionContext, paged: &rsgl_kernels::PagedKv, windowed: bool, qkv: &[f32], step: &Step) -> Vec<f32> {
        let (cfg, c, hd) = (cx.cfg, cx.compute, cx.cfg.head_dim);
        let (kv_heads, qs) = (cx.shard.kv_heads.len(), cx.shard.q_heads.len() * hd);
        let group = cfg.num_attention_heads / cfg.num_key_value_heads;
        let row = self.qkv.out_features();
        let block = (ATTENTION_TASK_ROWS / group).max(1);
        // (sequence, first token of the batch, tokens, first position, kv head)
        let mut tasks = Vec::new();
        let mut tokens = 0;
        for (s, chunk) in step.seqs.iter().enumerate() {
            for b in (0..chunk.tokens.len()).step_by(block) {
                let n = block.min(chunk.tokens.len() - b);
                tasks.extend((0..kv_heads).map(|h| (s, tokens + b, n, chunk.start_pos + b, h)));
            }
            tokens += chunk.tokens.len();
        }
        let placed: Vec<PlacedTask> = tasks
            .into_iter()
            .map(|(s, t, tokens, first_pos, h)| PlacedTask {
                task: AttentionTask {
                    kv: paged,
                    pages: step.seqs[s].table(windowed),
                    kv_head: h,
                    group,
                    q: &qkv[t * row + h * group * hd..],
                    q_stride: row,
                    tokens,
                    first_pos,
                    scale: cx.scale,
                    window: self.window,
                    softcap: cfg.scales.attention_logit_cap,
                    sinks: self.sinks.as_ref().map(|sinks| &sinks[h * group..(h + 1) * group]),
                    key_ends: step.key_ends.as_ref().map(|ends| &ends[t..t + tokens]),
                },
                // Its tokens' columns of its kv head's query heads.
                offset: t * qs + h * group * hd,
                stride: qs,
            })
            .collect();
        let mut out = vec![0.0; tokens * qs];
        run_attention(c, &placed, &mut out);
        out
    }
}
