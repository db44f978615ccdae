//! Multi-head latent attention (DeepSeek-V2/V3). Each token's keys and values come from one
//! latent of `kv_lora_rank` values (normalized) and a rope key shared by every head; the KV pages
//! keep just those, one kv head of `kv_lora_rank + qk_rope_head_dim` per token, whose values are
//! the keys' latent part. Two forms read the same pages:
//! - absorbed (decode, short chunks): each head's q without rope is multiplied by its key
//!   up-projection into the latent's space, so every head attends over the latent rows directly
//!   (multi-query attention over `[latent | rope key]`), and its output, a latent, goes through
//!   the head's value up-projection;
//! - expanded (long prefill chunks): the context's latents are up-projected into every head's
//!   keys and values once, and the heads attend as in ordinary attention.
//!
//! Which is cheaper depends on the chunk's length (see `expand_from_tokens`); both give the
//! same result up to float rounding, LoRA adapters' updates included: those of the projections
//! of a token's input (q, q_a and q_b, kv_a, o) go into their columns of the outputs, before the
//! norms and the rope; a `kv_b_proj` update goes where each form applies `kv_b_proj` (see
//! [`AbsorbedKvB`]).

use super::attention::{run_attention, AttentionContext, PlacedTask, ATTENTION_TASK_ROWS};
use super::decoder::{take_norm, Step};
use super::linear::{Linear, LinearParts};
use super::lora::{add_lora, AbsorbedKvB, LoraRows, LoraTarget};
use super::mlp::{take_linear, Ranks};
use super::Precision;
use crate::config::{LatentAttention as Shape, ModelConfig};
use crate::error::{EngineError, Result};
use crate::kv::KvPart;
use crate::weights::WeightStore;
use rsgl_kernels::{AttentionTask, KvSlice, PagedKv};

pub(super) struct LatentAttention {
    shape: Shape,
    heads: usize,
    /// The hidden state's projections in one GEMM: q (`q_proj`, or `q_a_proj`'s low-rank q),
    /// then the latent and the rope key (`kv_a_proj_with_mqa`).
    input: Linear,
    /// `q_a_layernorm`'s weight and `q_b_proj`, where q goes through a low rank.
    q_up: Option<(Vec<f32>, Linear)>,
    latent_norm: Vec<f32>,
    /// Per head: its key up-projection transposed, q without rope -> the latent's space.
    absorb_keys: Vec<Linear>,
    /// Per head: its value up-projection, a latent -> the head's value.
    absorb_values: Vec<Linear>,
    /// Every head's key without rope, then its value, from a latent (`kv_b_proj`).
    expand: Linear,
    o: Linear,
    /// Chunks of at least this many tokens attend in the expanded form.
    expand_from_tokens: usize,
}

impl LatentAttention {
    /// Layer `l`'s latent attention (`model.layers.{l}.self_attn`). A checkpoint's `kv_b_proj`
    /// holds every head's key (without rope) and value up-projections; llama.cpp's files hold them
    /// apart, the keys' transposed per head (`k_b_proj` `[heads, kv_lora_rank, qk_nope_head_dim]`,
    /// `v_b_proj` `[heads, v_head_dim, kv_lora_rank]`). Each form is rebuilt from the other.
    pub fn take(w: &mut WeightStore, l: usize, cfg: &ModelConfig, shape: &Shape, precision: &Precision, ranks: &Ranks) -> Result<Vec<LatentAttention>> {
        let [(_, pool)] = ranks else {
            return Err(EngineError::InvalidRequest(
                "a model with latent attention keeps one kv head, which tensor parallelism cannot split: use tp_size 1".into(),
            ));
        };
        let (h, heads) = (cfg.hidden_size, cfg.num_attention_heads);
        let (nope, v, lat) = (shape.qk_nope_head_dim, shape.v_head_dim, shape.kv_lora_rank);
        let attn = format!("model.layers.{l}.self_attn");
        let Precision { dtype, quantization, .. } = *precision;
        let pack = |parts: Vec<LinearParts>| Linear::fused(parts, dtype, quantization, pool);
        let q_rows = heads * shape.qk_head_dim();
        let (q, q_up) = match shape.q_lora_rank {
            None => (take_linear(w, &format!("{attn}.q_proj"), q_rows, h)?, None),
            Some(rank) => {
                let q_a = take_linear(w, &format!("{attn}.q_a_proj"), rank, h)?;
                let norm = take_norm(w, &format!("{attn}.q_a_layernorm.weight"), rank, cfg)?;
                (q_a, Some((norm, pack(vec![take_linear(w, &format!("{attn}.q_b_proj"), q_rows, rank)?]))))
            }
        };
        let latent = take_linear(w, &format!("{attn}.kv_a_proj_with_mqa"), shape.latent_key_dim(), h)?;
        let latent_norm = take_norm(w, &format!("{attn}.kv_a_layernorm.weight"), lat, cfg)?;
        let [kv_b, k_b, v_b] = ["kv_b_proj", "k_b_proj", "v_b_proj"].map(|name| format!("{attn}.{name}.weight"));
        if w.contains(&kv_b) {
            let expand = w.read(&kv_b)?;
            let row = |head: usize, r: usize| &expand[(head * (nope + v) + r) * lat..][..lat];
            let keys = (0..heads).flat_map(|head| (0..lat).flat_map(move |c| (0..nope).map(move |i| row(head, i)[c])));
            w.insert(&k_b, vec![heads, lat, nope], keys.collect())?;
            w.insert(&v_b, vec![heads, v, lat], (0..heads).flat_map(|head| (nope..nope + v).flat_map(move |r| row(head, r).iter().copied())).collect())?;
        } else {
            let (keys, values) = (w.read(&k_b)?, w.read(&v_b)?);
            if keys.len() != heads * lat * nope || values.len() != heads * v * lat {
                return Err(EngineError::ModelLoad(format!("{attn}: k_b_proj and v_b_proj do not have the shapes the model's config implies")));
            }
            let expand = (0..heads).flat_map(|head| {
                let keys = &keys[head * lat * nope..][..lat * nope];
                let key_rows = (0..nope).flat_map(move |i| (0..lat).map(move |c| keys[c * nope + i]));
                key_rows.chain(values[head * v * lat..][..v * lat].iter().copied())
            });
            w.insert(&kv_b, vec![heads * (nope + v), lat], expand.collect())?;
        }
        let expand = take_linear(w, &format!("{attn}.kv_b_proj"), heads * (nope + v), lat)?;
        let absorb_keys = LinearParts::new(w.take_matrices(&k_b, heads, lat, nope)?, None);
        let absorb_values = LinearParts::new(w.take_matrices(&v_b, heads, v, lat)?, None);
        let o = take_linear(w, &format!("{attn}.o_proj"), h, heads * v)?;
        // Expanding costs `kv_lora_rank x (nope + v)` per key and head; it saves, per query and
        // key, the absorbed form's longer dot products (the latent twice, against q and as the
        // value) over the expanded ones (q's head width and v).
        let saved_per_query = (2 * lat + shape.qk_rope_head_dim).saturating_sub(shape.qk_head_dim() + v);
        Ok(vec![LatentAttention {
            shape: shape.clone(),
            heads,
            input: pack(vec![q, latent]),
            q_up,
            latent_norm,
            absorb_keys: (0..heads).map(|head| pack(vec![absorb_keys.output_rows(head * lat..(head + 1) * lat)])).collect(),
            absorb_values: (0..heads).map(|head| pack(vec![absorb_values.output_rows(head * v..(head + 1) * v)])).collect(),
            expand: pack(vec![expand]),
            o: pack(vec![o]),
            expand_from_tokens: (lat * (nope + v)).checked_div(saved_per_query).map_or(usize::MAX, |tokens| tokens + 1),
        }])
    }

    /// The sublayer's output for the normalized input `x`; layer `layer`'s latents go into `kv`;
    /// `lora`'s rows add their adapters' updates.
    pub fn forward(&self, cx: &AttentionContext, x: &[f32], kv: &mut KvPart, layer: usize, step: &Step, lora: &[LoraRows]) -> Vec<f32> {
        let (c, kern, eps) = (cx.compute, cx.compute.kernels, cx.cfg.rms_norm_eps);
        let (heads, qk, lat, key_dim) = (self.heads, self.shape.qk_head_dim(), self.shape.kv_lora_rank, self.shape.latent_key_dim());
        let rope = &cx.ropes[0];
        let mut input = self.input.forward(c, x);
        let width = self.input.out_features();
        let q_cols = width - key_dim;
        for (target, first) in [(LoraTarget::Q, 0), (LoraTarget::QA, 0), (LoraTarget::KvA, q_cols)] {
            add_lora(c, lora, target, x, &mut input, width, first);
        }
        let own_q = input.chunks_exact(width).flat_map(|row| &row[..q_cols]).copied().collect::<Vec<f32>>();
        let mut q = match &self.q_up {
            None => own_q,
            Some((norm, q_b)) => {
                let mut low_rank = own_q;
                let mut normed = vec![0.0; low_rank.len()];
                c.pool.for_chunk_pairs_mut(&mut low_rank, q_cols, &mut normed, q_cols, &|_, row, out| (kern.add_rmsnorm)(row, None, norm, eps, out));
                let mut q = q_b.forward(c, &normed);
                add_lora(c, lora, LoraTarget::QB, &normed, &mut q, q_b.out_features(), 0);
                q
            }
        };
        let nope = self.shape.qk_nope_head_dim;
        c.pool.for_chunks_mut(&mut q, heads * qk, &|t, row| {
            row.chunks_exact_mut(qk).for_each(|head| rope.rotate(kern, &mut head[nope..], step.positions[t]));
        });
        let mut latents = vec![0.0; step.positions.len() * key_dim];
        c.pool.for_chunks_mut(&mut latents, key_dim, &|t, out| {
            let mut row = input[t * width + q_cols..(t + 1) * width].to_vec();
            (kern.add_rmsnorm)(&mut row[..lat], None, &self.latent_norm, eps, &mut out[..lat]);
            out[lat..].copy_from_slice(&row[lat..]);
            rope.rotate(kern, &mut out[lat..], step.positions[t]);
        });
        let windowed = kv.is_windowed(layer);
        for (t, latent) in latents.chunks_exact(key_dim).enumerate() {
            kv.write(layer, step.seqs[step.token_seq[t]].table(windowed), step.positions[t], latent, &[]);
        }
        // Each chunk in its cheaper form; the absorbed ones together.
        let v = self.shape.v_head_dim;
        let mut out = vec![0.0; step.positions.len() * heads * v];
        let mut absorbed = Vec::new();
        let mut first = 0;
        for (s, chunk) in step.seqs.iter().enumerate() {
            let tokens = first..first + chunk.tokens.len();
            if chunk.tokens.len() >= self.expand_from_tokens {
                let table = chunk.table(windowed);
                self.expanded(
                    cx,
                    kv.read_keys(layer, table, 0..chunk.start_pos + chunk.tokens.len()),
                    &q[tokens.start * heads * qk..tokens.end * heads * qk],
                    chunk.start_pos,
                    lora.iter().find(|rows| rows.runs.iter().any(|run| run.contains(&tokens.start))),
                    &mut out[tokens.start * heads * v..tokens.end * heads * v],
                );
            } else {
                absorbed.push((s, tokens));
            }
            first += chunk.tokens.len();
        }
        if !absorbed.is_empty() {
            self.absorbed(cx, &kv.layer(layer), windowed, &q, &absorbed, step, lora, &mut out);
        }
        let mut output = self.o.forward(c, &out);
        add_lora(c, lora, LoraTarget::O, &out, &mut output, self.o.out_features(), 0);
        output
    }

    /// The absorbed form for `chunks` (sequence, its tokens in the batch), over the latent pages;
    /// writes each token's heads' values into `out` (`[token][head][v_head_dim]`), `lora`'s rows
    /// with their adapters' `kv_b_proj` updates.
    #[allow(clippy::too_many_arguments)]
    fn absorbed(
        &self,
        cx: &AttentionContext,
        paged: &PagedKv,
        windowed: bool,
        q: &[f32],
        chunks: &[(usize, std::ops::Range<usize>)],
        step: &Step,
        lora: &[LoraRows],
        out: &mut [f32],
    ) {
        let c = cx.compute;
        let (heads, qk, nope, lat, key_dim, v) =
            (self.heads, self.shape.qk_head_dim(), self.shape.qk_nope_head_dim, self.shape.kv_lora_rank, self.shape.latent_key_dim(), self.shape.v_head_dim);
        let tokens: Vec<usize> = chunks.iter().flat_map(|(_, tokens)| tokens.clone()).collect();
        let n = tokens.len();
        // Queries in the latents' space: `[token][head][latent | rope]`.
        let mut queries = vec![0.0; n * heads * key_dim];
        for (head, absorb) in self.absorb_keys.iter().enumerate() {
            let q_nope: Vec<f32> = tokens.iter().flat_map(|&t| &q[(t * heads + head) * qk..][..nope]).copied().collect();
            for (i, latent_q) in absorb.forward(c, &q_nope).chunks_exact(lat).enumerate() {
                let row = &mut queries[(i * heads + head) * key_dim..][..key_dim];
                row[..lat].copy_from_slice(latent_q);
                row[lat..].copy_from_slice(&q[(tokens[i] * heads + head) * qk + nope..][..self.shape.qk_rope_head_dim]);
            }
        }
        // Each adapter's rows (indices into `tokens`) and its kv_b_proj update: A, and the absorbed form.
        let kv_b_updates: Vec<(Vec<usize>, f32, &Linear, &AbsorbedKvB)> = lora
            .iter()
            .filter_map(|rows| {
                let (a, absorbed) = rows.layer.absorbed_kv_b()?;
                let mine: Vec<usize> = (0..n).filter(|&i| rows.runs.iter().any(|run| run.contains(&tokens[i]))).collect();
                (!mine.is_empty()).then_some((mine, rows.scaling, a, absorbed))
            })
            .collect();
        for (mine, scaling, _, update) in &kv_b_updates {
            // `[row][head][r]`: each head's q without rope in the update's rank space.
            let r = update.a_t.weight_in_features();
            let mut ranked = vec![0.0; mine.len() * heads * r];
            for (head, key_b_t) in update.key_b_t.iter().enumerate() {
                let q_nope: Vec<f32> = mine.iter().flat_map(|&i| &q[(tokens[i] * heads + head) * qk..][..nope]).copied().collect();
                for (j, z) in key_b_t.forward(c, &q_nope).chunks_exact(r).enumerate() {
                    ranked[(j * heads + head) * r..][..r].copy_from_slice(z);
                }
            }
            for (row, delta) in update.a_t.forward(c, &ranked).chunks_exact(lat).enumerate() {
                let (j, head) = (row / heads, row % heads);
                (c.kernels.axpy)(*scaling, delta, &mut queries[(mine[j] * heads + head) * key_dim..][..lat]);
            }
        }
        // (sequence, first row in `queries`, tokens, first position)
        let block = (ATTENTION_TASK_ROWS / heads).max(1);
        let mut tasks = Vec::new();
        let mut row = 0;
        for (s, chunk_tokens) in chunks {
            let start_pos = step.seqs[*s].start_pos;
            for b in (0..chunk_tokens.len()).step_by(block) {
                tasks.push((*s, row + b, block.min(chunk_tokens.len() - b), start_pos + b));
            }
            row += chunk_tokens.len();
        }
        let latent_out_row = heads * lat;
        let placed: Vec<PlacedTask> = tasks
            .into_iter()
            .map(|(s, first_row, tokens, first_pos)| PlacedTask {
                task: AttentionTask {
                    kv: paged,
                    pages: step.seqs[s].table(windowed),
                    kv_head: 0,
                    group: heads,
                    q: &queries[first_row * heads * key_dim..],
                    q_stride: heads * key_dim,
                    tokens,
                    first_pos,
                    scale: cx.scale,
                    window: None,
                    softcap: None,
                    sinks: None,
                    key_ends: None,
                },
                offset: first_row * latent_out_row,
                stride: latent_out_row,
            })
            .collect();
        let mut latent_out = vec![0.0; n * latent_out_row];
        run_attention(c, &placed, &mut latent_out);
        for (head, absorb) in self.absorb_values.iter().enumerate() {
            let head_latents: Vec<f32> = latent_out.chunks_exact(latent_out_row).flat_map(|row| &row[head * lat..(head + 1) * lat]).copied().collect();
            for (&t, value) in tokens.iter().zip(absorb.forward(c, &head_latents).chunks_exact(v)) {
                out[(t * heads + head) * v..][..v].copy_from_slice(value);
            }
        }
        for (mine, scaling, a, update) in &kv_b_updates {
            // A token's row of `latent_out` is its heads' latents one after another: `[row · head][latent]`.
            let latents: Vec<f32> = mine.iter().flat_map(|&i| &latent_out[i * latent_out_row..(i + 1) * latent_out_row]).copied().collect();
            let ranked = a.forward(c, &latents);
            let r = a.out_features();
            for (head, value_b) in update.value_b.iter().enumerate() {
                let head_ranked: Vec<f32> = (0..mine.len()).flat_map(|j| &ranked[(j * heads + head) * r..][..r]).copied().collect();
                for (&i, delta) in mine.iter().zip(value_b.forward(c, &head_ranked).chunks_exact(v)) {
                    (c.kernels.axpy)(*scaling, delta, &mut out[(tokens[i] * heads + head) * v..][..v]);
                }
            }
        }
    }

    /// The expanded form for one chunk at `start_pos` with queries `q` (`[token][head][qk]`),
    /// over its sequence's `keys` (latent rows of positions `0..start_pos + tokens`), its keys and
    /// values with the `kv_b_proj` update of its adapter (`lora`, whose rows hold the chunk's):
    /// writes each token's heads' values into `out`.
    fn expanded(&self, cx: &AttentionContext, keys: Vec<f32>, q: &[f32], start_pos: usize, lora: Option<&LoraRows>, out: &mut [f32]) {
        let c = cx.compute;
        let (heads, qk, nope, lat, key_dim, v) =
            (self.heads, self.shape.qk_head_dim(), self.shape.qk_nope_head_dim, self.shape.kv_lora_rank, self.shape.latent_key_dim(), self.shape.v_head_dim);
        let positions = keys.len() / key_dim;
        let latents: Vec<f32> = keys.chunks_exact(key_dim).flat_map(|row| &row[..lat]).copied().collect();
        let mut expanded = self.expand.forward(c, &latents);
        if let Some(rows) = lora {
            let context = 0..positions;
            let adapter = LoraRows { runs: std::slice::from_ref(&context), scaling: rows.scaling, layer: rows.layer };
            add_lora(c, &[adapter], LoraTarget::KvB, &latents, &mut expanded, heads * (nope + v), 0);
        }
        // One page holding every position, per head: keys `[qk][positions]`, values `[positions][v]`.
        let (mut page_keys, mut page_values) = (vec![0.0; heads * qk * positions], vec![0.0; heads * positions * v]);
        for (pos, (row, key)) in expanded.chunks_exact(heads * (nope + v)).zip(keys.chunks_exact(key_dim)).enumerate() {
            for head in 0..heads {
                let (k_nope, value) = row[head * (nope + v)..][..nope + v].split_at(nope);
                let head_keys = &mut page_keys[head * qk * positions..][..qk * positions];
                for (d, &x) in k_nope.iter().chain(&key[lat..]).enumerate() {
                    head_keys[d * positions + pos] = x;
                }
                page_values[(head * positions + pos) * v..][..v].copy_from_slice(value);
            }
        }
        let paged = PagedKv {
            keys: KvSlice::F32(&page_keys),
            values: Some(KvSlice::F32(&page_values)),
            page_size: positions,
            kv_heads: heads,
            head_dim: qk,
            value_dim: v,
        };
        let tokens = q.len() / (heads * qk);
        let block = ATTENTION_TASK_ROWS;
        let placed: Vec<PlacedTask> = (0..tokens)
            .step_by(block)
            .flat_map(|b| (0..heads).map(move |head| (b, head)))
            .map(|(b, head)| PlacedTask {
                task: AttentionTask {
                    kv: &paged,
                    pages: &[0],
                    kv_head: head,
                    group: 1,
                    q: &q[(b * heads + head) * qk..],
                    q_stride: heads * qk,
                    tokens: block.min(tokens - b),
                    first_pos: start_pos + b,
                    scale: cx.scale,
                    window: None,
                    softcap: None,
                    sinks: None,
                    key_ends: None,
                },
                // Its tokens' columns of its head.
                offset: (b * heads + head) * v,
                stride: heads * v,
            })
            .collect();
        run_attention(c, &placed, out);
    }
}
