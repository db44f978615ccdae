//! One forward pass of a Llama-family decoder over a ragged batch: every sequence contributes a
//! run of new tokens (a prefill chunk, or one token when decoding) at its own positions, reading
//! and writing its own KV pages.

use super::linear::{matmul_bt, Linear};
use super::rope::Rope;
use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::kv::KvCache;
use crate::weights::WeightStore;
use rayon::prelude::*;
use rsgl_kernels::{kernels, portable};

/// The part of one sequence computed in a step.
pub struct SeqChunk<'a> {
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`; earlier positions are already in the KV pages.
    pub start_pos: usize,
    /// The sequence's block table, covering at least `start_pos + tokens.len()` positions.
    pub pages: &'a [u32],
    /// Whether the logits after the last token are wanted (false mid-prompt when chunking).
    pub want_logits: bool,
}

struct Layer {
    input_norm: Vec<f32>,
    qkv: Linear,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    o: Linear,
    post_norm: Vec<f32>,
    gate_up: Linear,
    down: Linear,
}

pub struct LlamaModel {
    cfg: ModelConfig,
    embed: Vec<f32>,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    /// `None` when tied to the embedding.
    lm_head: Option<Vec<f32>>,
    rope: Rope,
}

fn take_linear(w: &mut WeightStore, prefix: &str, out: usize, inp: usize) -> Result<Linear> {
    Ok(Linear {
        weight: w.take(&format!("{prefix}.weight"), &[out, inp])?,
        bias: w.take_optional(&format!("{prefix}.bias"), &[out])?,
        in_features: inp,
        out_features: out,
    })
}

/// RMSNorm of each `weight.len()`-long row of `x`, in place.
fn rmsnorm_rows(x: &mut [f32], weight: &[f32], eps: f32) {
    let mut tmp = vec![0.0; weight.len()];
    for row in x.chunks_exact_mut(weight.len()) {
        portable::rmsnorm(row, weight, eps, &mut tmp);
        row.copy_from_slice(&tmp);
    }
}

fn rmsnorm_copy(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let mut out = x.to_vec();
    rmsnorm_rows(&mut out, weight, eps);
    out
}

impl LlamaModel {
    pub fn new(cfg: ModelConfig, mut w: WeightStore, max_positions: usize) -> Result<Self> {
        let (h, i, v, hd) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.head_dim);
        let embed = w.take("model.embed_tokens.weight", &[v, h])?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for l in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{l}");
            let attn = format!("{p}.self_attn");
            let qkv = Linear::fuse(vec![
                take_linear(&mut w, &format!("{attn}.q_proj"), cfg.q_size(), h)?,
                take_linear(&mut w, &format!("{attn}.k_proj"), cfg.kv_size(), h)?,
                take_linear(&mut w, &format!("{attn}.v_proj"), cfg.kv_size(), h)?,
            ]);
            let (q_norm, k_norm) = if cfg.qk_norm {
                (Some(w.take(&format!("{attn}.q_norm.weight"), &[hd])?), Some(w.take(&format!("{attn}.k_norm.weight"), &[hd])?))
            } else {
                (None, None)
            };
            layers.push(Layer {
                input_norm: w.take(&format!("{p}.input_layernorm.weight"), &[h])?,
                qkv,
                q_norm,
                k_norm,
                o: take_linear(&mut w, &format!("{attn}.o_proj"), h, cfg.q_size())?,
                post_norm: w.take(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
                gate_up: Linear::fuse(vec![
                    take_linear(&mut w, &format!("{p}.mlp.gate_proj"), i, h)?,
                    take_linear(&mut w, &format!("{p}.mlp.up_proj"), i, h)?,
                ]),
                down: take_linear(&mut w, &format!("{p}.mlp.down_proj"), h, i)?,
            });
        }
        let norm = w.take("model.norm.weight", &[h])?;
        let lm_head = if cfg.tie_word_embeddings { None } else { Some(w.take("lm_head.weight", &[v, h])?) };
        // A tied checkpoint may still carry a copy of the embedding as lm_head.
        let _ = w.take_optional("lm_head.weight", &[v, h])?;
        if !w.is_empty() {
            return Err(EngineError::ModelLoad(format!(
                "the checkpoint has tensors this {} model does not use: {:?}",
                cfg.architecture,
                &w.remaining_names()[..w.len().min(5)]
            )));
        }
        let rope = Rope::new(&cfg, max_positions);
        Ok(LlamaModel { cfg, embed, layers, norm, lm_head, rope })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Runs the batch, writing new K/V into the cache; returns the logits `[n, vocab]` of the
    /// sequences with `want_logits`, in batch order.
    pub fn forward(&self, seqs: &[SeqChunk], kv: &mut KvCache) -> Vec<f32> {
        let cfg = &self.cfg;
        let h = cfg.hidden_size;
        // Per token: which sequence and which position.
        let mut token_seq = Vec::new();
        let mut positions = Vec::new();
        for (s, chunk) in seqs.iter().enumerate() {
            for t in 0..chunk.tokens.len() {
                token_seq.push(s);
                positions.push(chunk.start_pos + t);
            }
        }
        let mut x: Vec<f32> = seqs
            .iter()
            .flat_map(|c| c.tokens.iter())
            .flat_map(|&tok| self.embed[tok as usize * h..(tok as usize + 1) * h].iter().copied())
            .collect();
        for (l, layer) in self.layers.iter().enumerate() {
            let normed = rmsnorm_copy(&x, &layer.input_norm, cfg.rms_norm_eps);
            let mut qkv = layer.qkv.forward(&normed);
            self.position_qk(layer, &mut qkv, &positions);
            let (qs, kvs) = (cfg.q_size(), cfg.kv_size());
            for (t, row) in qkv.chunks_exact(qs + 2 * kvs).enumerate() {
                let (k, v) = row[qs..].split_at(kvs);
                kv.write(l, seqs[token_seq[t]].pages, positions[t], k, v);
            }
            let attn = self.attention(l, &qkv, seqs, &token_seq, &positions, kv);
            add_into(&mut x, &layer.o.forward(&attn));
            let normed = rmsnorm_copy(&x, &layer.post_norm, cfg.rms_norm_eps);
            let gate_up = layer.gate_up.forward(&normed);
            let act = silu_gate(&gate_up, cfg.intermediate_size);
            add_into(&mut x, &layer.down.forward(&act));
        }
        let mut last_rows = Vec::new();
        let mut t0 = 0;
        for chunk in seqs {
            t0 += chunk.tokens.len();
            if chunk.want_logits {
                last_rows.extend_from_slice(&x[(t0 - 1) * h..t0 * h]);
            }
        }
        rmsnorm_rows(&mut last_rows, &self.norm, cfg.rms_norm_eps);
        matmul_bt(&last_rows, self.lm_head.as_deref().unwrap_or(&self.embed), h)
    }

    /// Qwen3's per-head q/k RMSNorm, then rope, on every token's q and k, in place.
    fn position_qk(&self, layer: &Layer, qkv: &mut [f32], positions: &[usize]) {
        let cfg = &self.cfg;
        let (qs, kvs) = (cfg.q_size(), cfg.kv_size());
        qkv.par_chunks_exact_mut(qs + 2 * kvs).zip(positions).for_each(|(row, &pos)| {
            let (q, rest) = row.split_at_mut(qs);
            let k = &mut rest[..kvs];
            if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
                rmsnorm_rows(q, qn, cfg.rms_norm_eps);
                rmsnorm_rows(k, kn, cfg.rms_norm_eps);
            }
            self.rope.apply(q, pos);
            self.rope.apply(k, pos);
        });
    }

    /// Causal attention of every new token over its sequence's cached positions `0..=pos`,
    /// one task per (token, head); query heads share kv heads in groups (GQA).
    fn attention(&self, layer: usize, qkv: &[f32], seqs: &[SeqChunk], token_seq: &[usize], positions: &[usize], kv: &KvCache) -> Vec<f32> {
        let cfg = &self.cfg;
        let (hd, nh) = (cfg.head_dim, cfg.num_attention_heads);
        let group = nh / cfg.num_key_value_heads;
        let row = cfg.q_size() + 2 * cfg.kv_size();
        let scale = 1.0 / (hd as f32).sqrt();
        let k = kernels();
        let mut out = vec![0.0; positions.len() * cfg.q_size()];
        out.par_chunks_exact_mut(hd).enumerate().for_each(|(task, o)| {
            let (t, head) = (task / nh, task % nh);
            let q = &qkv[t * row + head * hd..t * row + (head + 1) * hd];
            let pages = seqs[token_seq[t]].pages;
            let span = positions[t] + 1;
            let mut scores: Vec<f32> = (0..span)
                .map(|j| (k.dot)(q, kv.head(layer, pages, j, head / group, hd).0) * scale)
                .collect();
            portable::softmax(&mut scores);
            for (j, p) in scores.iter().enumerate() {
                (k.axpy)(*p, kv.head(layer, pages, j, head / group, hd).1, o);
            }
        });
        out
    }
}

fn add_into(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}

/// `silu(gate) * up` per token, from rows laid out `[gate | up]`.
fn silu_gate(gate_up: &[f32], inter: usize) -> Vec<f32> {
    let mut act = Vec::with_capacity(gate_up.len() / 2);
    for row in gate_up.chunks_exact(2 * inter) {
        let start = act.len();
        act.extend_from_slice(&row[..inter]);
        portable::silu_mul(&mut act[start..], &row[inter..]);
    }
    act
}
