//! One forward pass of a Llama-family decoder over a ragged batch: every sequence contributes a
//! run of new tokens (a prefill chunk, or one token when decoding) at its own positions, reading
//! and writing its own KV pages. It returns logits, or for an embedding model (no lm_head) the
//! final-norm hidden states the engine pools.

use super::embedding::Embedding;
use super::linear::{Compute, Linear, LinearParts};
use super::mlp::{take_linear, Mlp};
use super::rope::Rope;
use crate::config::{ModelConfig, Quantization};
use crate::error::{EngineError, Result};
use crate::kv::KvCache;
use crate::weights::WeightStore;
use rsgl_kernels::pool::SendPtr;
use rsgl_kernels::{AttentionTask, RopeStyle, WeightDtype};
use std::ops::Range;

/// Query rows (tokens x heads of a kv group) one attention task covers: enough to reuse each
/// key page across rows, few enough that a prefill splits into many tasks to balance.
const ATTENTION_TASK_ROWS: usize = 16;

/// How the weights are held: `dtype` for floats, the linear layers quantized when
/// `quantization` is set (the lm_head too with `quantize_lm_head`).
#[derive(Clone, Copy)]
pub struct Precision {
    pub dtype: WeightDtype,
    pub quantization: Option<Quantization>,
    pub quantize_lm_head: bool,
}

/// The part of one sequence computed in a step.
pub struct SeqChunk<'a> {
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`; earlier positions are already in the KV pages.
    pub start_pos: usize,
    /// The sequence's page table, covering at least `start_pos + tokens.len()` positions.
    pub pages: &'a [u32],
    /// The tokens (counted from `tokens[0]`) after which an output row is returned, one each in
    /// batch order (the batch decides: see `BatchEntry::new`).
    pub rows: Range<usize>,
}

/// What a forward pass returns per row.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ModelOutput {
    /// Next-token logits, through the lm_head.
    Logits,
    /// The final-norm hidden states, for embeddings (the lm_head is not loaded).
    HiddenStates,
}

struct Layer {
    input_norm: Vec<f32>,
    qkv: Linear,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    o: Linear,
    post_norm: Vec<f32>,
    mlp: Mlp,
}

pub struct LlamaModel {
    cfg: ModelConfig,
    /// The input embedding, `None` when tied to `lm_head` (rows are then read from it).
    embed: Option<Embedding>,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    /// `None` when the model returns hidden states (`ModelOutput::HiddenStates`).
    lm_head: Option<Linear>,
    rope: Rope,
    compute: Compute,
}

impl LlamaModel {
    /// Packs the weights in `dtype` for the kernels of `compute`.
    pub fn new(cfg: ModelConfig, mut w: WeightStore, max_positions: usize, precision: Precision, output: ModelOutput, compute: Compute) -> Result<Self> {
        let Precision { dtype, quantization, quantize_lm_head } = precision;
        let (h, v, hd) = (cfg.hidden_size, cfg.vocab_size, cfg.head_dim);
        let pool = &compute.pool;
        let embed = w.take_matrix("model.embed_tokens.weight", v, h)?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for l in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{l}");
            let attn = format!("{p}.self_attn");
            let qkv = ["q_proj", "k_proj", "v_proj"]
                .into_iter()
                .zip([cfg.q_size(), cfg.kv_size(), cfg.kv_size()])
                .map(|(proj, rows)| take_linear(&mut w, &format!("{attn}.{proj}"), rows, h))
                .collect::<Result<Vec<_>>>()?;
            let (q_norm, k_norm) = if cfg.qk_norm {
                (Some(w.take(&format!("{attn}.q_norm.weight"), &[hd])?), Some(w.take(&format!("{attn}.k_norm.weight"), &[hd])?))
            } else {
                (None, None)
            };
            layers.push(Layer {
                input_norm: w.take(&format!("{p}.input_layernorm.weight"), &[h])?,
                qkv: Linear::fused(qkv, dtype, quantization, pool),
                q_norm,
                k_norm,
                o: Linear::fused(vec![take_linear(&mut w, &format!("{attn}.o_proj"), h, cfg.q_size())?], dtype, quantization, pool),
                post_norm: w.take(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
                mlp: Mlp::take(&mut w, &p, &cfg, &precision, pool)?,
            });
        }
        let norm = w.take("model.norm.weight", &[h])?;
        // A GGUF, AWQ or GPTQ file chose its lm_head's type itself; a quantized-at-load lm_head
        // is asked for.
        let lm_head_quantization = quantization.filter(|q| quantize_lm_head || q.as_stored());
        let pack_lm_head = |weight| Linear::fused(vec![LinearParts { weight, bias: None }], dtype, lm_head_quantization, pool);
        let (embed, lm_head) = if output == ModelOutput::HiddenStates || cfg.tie_word_embeddings {
            // A tied checkpoint may still carry a copy of the embedding as lm_head; an
            // embedding model does not use its lm_head.
            drop(w.take_optional("lm_head.weight", &[v, h])?);
            match output {
                ModelOutput::Logits => (None, Some(pack_lm_head(embed))),
                ModelOutput::HiddenStates => (Some(Embedding::new(&embed, dtype)), None),
            }
        } else {
            (Some(Embedding::new(&embed, dtype)), Some(pack_lm_head(w.take_matrix("lm_head.weight", v, h)?)))
        };
        if !w.is_empty() {
            return Err(EngineError::ModelLoad(format!(
                "the checkpoint has tensors this {} model does not use: {:?}",
                cfg.architecture,
                &w.remaining_names()[..w.len().min(5)]
            )));
        }
        // Checkpoints in Hugging Face's layout rotate halves (llama.cpp's q/k permutation is
        // undone when a GGUF file is loaded).
        let rope = Rope::new(&cfg, max_positions, RopeStyle::Neox);
        Ok(LlamaModel { cfg, embed, layers, norm, lm_head, rope, compute })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The length of each row [`Self::forward`] returns.
    pub fn output_width(&self) -> usize {
        match self.lm_head {
            Some(_) => self.cfg.vocab_size,
            None => self.cfg.hidden_size,
        }
    }

    /// The compute threads, idle between forward passes (the engine fills token masks on them).
    pub fn pool(&self) -> &rsgl_kernels::ThreadPool {
        &self.compute.pool
    }

    /// Runs the batch, writing new K/V into the cache; returns the rows `[n, output_width]`
    /// (logits, or final-norm hidden states) after each chunk's [`SeqChunk::rows`] tokens, in
    /// batch order.
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
        let mut x = Vec::with_capacity(positions.len() * h);
        for &tok in seqs.iter().flat_map(|c| c.tokens) {
            match &self.embed {
                Some(e) => e.push_row(tok as usize, h, &mut x),
                None => x.extend(self.lm_head.as_ref().expect("tied to the embedding").weight.row(tok as usize)),
            }
        }
        let c = &self.compute;
        let mut residual_delta: Option<Vec<f32>> = None;
        for (l, layer) in self.layers.iter().enumerate() {
            let normed = self.add_and_norm(&mut x, residual_delta.as_deref(), &layer.input_norm);
            let mut qkv = layer.qkv.forward(c, &normed);
            self.position_qk(layer, &mut qkv, &positions);
            let (qs, kvs) = (cfg.q_size(), cfg.kv_size());
            for (t, row) in qkv.chunks_exact(qs + 2 * kvs).enumerate() {
                let (k, v) = row[qs..].split_at(kvs);
                kv.write(l, seqs[token_seq[t]].pages, positions[t], k, v);
            }
            let attn = self.attention(l, &qkv, seqs, kv);
            let normed = self.add_and_norm(&mut x, Some(&layer.o.forward(c, &attn)), &layer.post_norm);
            residual_delta = Some(layer.mlp.forward(c, &normed));
        }
        if let Some(delta) = residual_delta {
            add_into(&mut x, &delta);
        }
        let mut last_rows = Vec::new();
        let mut t0 = 0;
        for chunk in seqs {
            let rows = &chunk.rows;
            last_rows.extend_from_slice(&x[(t0 + rows.start) * h..(t0 + rows.end) * h]);
            t0 += chunk.tokens.len();
        }
        let normed = self.add_and_norm(&mut last_rows, None, &self.norm);
        match &self.lm_head {
            Some(lm_head) => lm_head.forward(c, &normed),
            None => normed,
        }
    }

    /// `x += delta` (the residual stream), then the RMSNorm of each row of `x`, row-parallel.
    fn add_and_norm(&self, x: &mut [f32], delta: Option<&[f32]>, weight: &[f32]) -> Vec<f32> {
        let (h, eps, kern) = (weight.len(), self.cfg.rms_norm_eps, self.compute.kernels);
        let mut normed = vec![0.0; x.len()];
        self.compute.pool.for_chunk_pairs_mut(x, h, &mut normed, h, &|row, x, out| {
            (kern.add_rmsnorm)(x, delta.map(|d| &d[row * h..(row + 1) * h]), weight, eps, out);
        });
        normed
    }

    /// Qwen3's per-head q/k RMSNorm, then rope, on every token's q and k, in place.
    fn position_qk(&self, layer: &Layer, qkv: &mut [f32], positions: &[usize]) {
        let (cfg, kern) = (&self.cfg, self.compute.kernels);
        let (qs, kvs) = (cfg.q_size(), cfg.kv_size());
        self.compute.pool.for_chunks_mut(qkv, qs + 2 * kvs, &|t, row| {
            let pos = positions[t];
            let (q, rest) = row.split_at_mut(qs);
            let k = &mut rest[..kvs];
            if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
                let mut normed = vec![0.0; cfg.head_dim];
                for (heads, weight) in [(&mut *q, qn), (&mut *k, kn)] {
                    for head in heads.chunks_exact_mut(cfg.head_dim) {
                        (kern.add_rmsnorm)(head, None, weight, cfg.rms_norm_eps, &mut normed);
                        head.copy_from_slice(&normed);
                    }
                }
            }
            self.rope.apply(kern, q, pos);
            self.rope.apply(kern, k, pos);
        });
    }

    /// Causal attention of every new token over its sequence's positions `0..=pos`, as tasks of
    /// one kv head's query group over a run of consecutive tokens, handed out dynamically
    /// (prefill tasks late in a prompt cost more than early ones).
    fn attention(&self, layer: usize, qkv: &[f32], seqs: &[SeqChunk], kv: &KvCache) -> Vec<f32> {
        let cfg = &self.cfg;
        let (hd, kv_heads, qs) = (cfg.head_dim, cfg.num_key_value_heads, cfg.q_size());
        let group = cfg.num_attention_heads / kv_heads;
        let row = qs + 2 * cfg.kv_size();
        let block = (ATTENTION_TASK_ROWS / group).max(1);
        // (sequence, first token of the batch, tokens, first position, kv head)
        let mut tasks = Vec::new();
        let mut tokens = 0;
        for (s, chunk) in seqs.iter().enumerate() {
            for b in (0..chunk.tokens.len()).step_by(block) {
                let n = block.min(chunk.tokens.len() - b);
                tasks.extend((0..kv_heads).map(|h| (s, tokens + b, n, chunk.start_pos + b, h)));
            }
            tokens += chunk.tokens.len();
        }
        let paged = kv.layer(layer);
        let (kern, scale) = (self.compute.kernels, 1.0 / (hd as f32).sqrt());
        let mut out = vec![0.0; tokens * qs];
        let dst = SendPtr(out.as_mut_ptr());
        self.compute.pool.for_each_dynamic(tasks.len(), &|i| {
            let (s, t, tokens, first_pos, h) = tasks[i];
            let task = AttentionTask {
                kv: &paged,
                pages: seqs[s].pages,
                kv_head: h,
                group,
                q: &qkv[t * row + h * group * hd..],
                q_stride: row,
                tokens,
                first_pos,
                scale,
            };
            // SAFETY: each task writes its own tokens' columns of its kv head's query heads.
            unsafe { (kern.attention)(&task, dst.get().add(t * qs + h * group * hd), qs) };
        });
        out
    }
}

fn add_into(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}
