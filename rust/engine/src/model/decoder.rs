//! One forward pass of a decoder over a ragged batch: every sequence contributes a run of new
//! tokens (a prefill chunk, or one token when decoding) at its own positions, reading and writing
//! its own KV pages. Each layer is arranged as its architecture's [`Assembly`] says (where the
//! norms sit, how q and k are normalized), with the config's scales and NoPE layers. It returns
//! logits, or for an embedding model (no lm_head) the final-norm hidden states the engine pools.

use super::archs::{Assembly, Norms, QkNorm};
use super::attention::{Attention, AttentionContext};
use super::delta_net::DeltaNet;
use super::embedding::Embedding;
use super::latent_attention::LatentAttention;
use super::linear::{Compute, Linear, LinearParts};
use super::lora::{self, LoraAdapter, LoraMixer, LoraModule, LoraRows, PeftAdapter};
use super::mamba2::Mamba2Layer;
use super::mlp::{Mlp, Ranks};
use super::mrope::MropePositions;
use super::qwen2_vl_vision::QwenVisionTower;
use super::rope::Rope;
use super::tensor_parallel::{AllReduce, Shard};
use super::vision::VisionTower;
use crate::config::{Architecture, ImageEncoder, ModelConfig, Quantization};
use crate::error::{EngineError, Result};
use crate::kv::{KvCache, KvPart};
use crate::weights::WeightStore;
use rsgl_kernels::profile::{self, Phase};
use rsgl_kernels::{ThreadPool, WeightDtype};
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Mutex;

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
    /// Its window page table, which layers whose KV lives in window pages read and write
    /// (entries behind their window are released); empty without such layers.
    pub window_pages: &'a [u32],
    /// The tokens (counted from `tokens[0]`) after which an output row is returned, one each in
    /// batch order (the batch decides: see `BatchEntry::new`).
    pub rows: Range<usize>,
    /// Where a model with recurrent layers keeps the sequence's state (after `start_pos` tokens;
    /// a chunk at position 0 starts a fresh one); None without such layers.
    pub state_slot: Option<usize>,
    /// `(n, slot)`: copy the state after the first `n` tokens into state slot `slot` as well (a
    /// snapshot the prefix cache keeps); `n` ends a delta-rule chunk (a multiple of its length
    /// from position 0).
    pub snapshot: Option<(usize, usize)>,
    /// Rows given in place of token embeddings (an image's, at its image tokens): `(index in
    /// tokens, hidden_size values)`.
    pub image_rows: Vec<(usize, &'a [f32])>,
    /// Runs of positions whose queries see the whole run (Gemma 3's image tokens), each ending
    /// within the chunk; attention is causal elsewhere.
    pub bidirectional: Vec<Range<usize>>,
    /// The sequence's 3D rope positions (M-RoPE), where its prompt has images for a model that
    /// gives them such positions; None: each token's position turns every rotary frequency.
    pub mrope: Option<&'a MropePositions>,
    /// The LoRA adapter (an id of [`DecoderModel::adapters`]) the sequence's projections add.
    pub lora: Option<usize>,
}

impl SeqChunk<'_> {
    /// The page table of layers whose KV lives in window pages (`windowed`), or of the others.
    pub(super) fn table(&self, windowed: bool) -> &[u32] {
        if windowed {
            self.window_pages
        } else {
            self.pages
        }
    }
}

/// What a forward pass returns per row.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ModelOutput {
    /// Next-token logits, through the lm_head.
    Logits,
    /// The final-norm hidden states, for embeddings (the lm_head is not loaded).
    HiddenStates,
}

/// A sublayer's norm weights, where its assembly puts norms.
#[derive(Clone)]
struct SublayerNorms {
    pre: Option<Vec<f32>>,
    post: Option<Vec<f32>>,
}

impl SublayerNorms {
    fn take(w: &mut WeightStore, layer: &str, norms: Norms, cfg: &ModelConfig) -> Result<SublayerNorms> {
        let mut take = |name: Option<&str>| name.map(|name| take_norm(w, &format!("{layer}.{name}.weight"), cfg.hidden_size, cfg)).transpose();
        Ok(SublayerNorms { pre: take(norms.pre)?, post: take(norms.post)? })
    }
}

/// An RMS norm's weight as the kernels multiply by it (the config's offset added).
pub(super) fn take_norm(w: &mut WeightStore, name: &str, len: usize, cfg: &ModelConfig) -> Result<Vec<f32>> {
    let mut weight = w.take(name, &[len])?;
    if cfg.norm_weight_offset != 0.0 {
        weight.iter_mut().for_each(|value| *value += cfg.norm_weight_offset);
    }
    Ok(weight)
}

struct Layer {
    attention_norms: SublayerNorms,
    mixer: Mixer,
    mlp_norms: SublayerNorms,
    mlp: Mlp,
}

/// How a layer mixes tokens: attention over KV pages (latent ones for multi-head latent
/// attention), or a recurrent state per sequence.
// One per layer, built once: the variants' size difference costs nothing.
#[allow(clippy::large_enum_variant)]
enum Mixer {
    Attention(Attention),
    LatentAttention(LatentAttention),
    DeltaNet(DeltaNet),
    Mamba2(Mamba2Layer),
}

/// One tensor-parallel rank's slice of every layer and of the lm_head (the whole model without
/// tensor parallelism), and the threads that run it.
struct RankModel {
    shard: Shard,
    layers: Vec<Layer>,
    /// `None` when the model returns hidden states (`ModelOutput::HiddenStates`).
    lm_head: Option<Linear>,
    compute: Compute,
}

/// What every rank reads of a step: the batch, and where each token sits.
pub(super) struct Step<'a> {
    pub seqs: &'a [SeqChunk<'a>],
    pub token_seq: Vec<usize>,
    pub positions: Vec<usize>,
    /// Per token, where the keys it attends to end, where a chunk has runs attended both ways
    /// ([`SeqChunk::bidirectional`]); None: causal.
    pub key_ends: Option<Vec<usize>>,
    /// Per token, its 3D rope positions, when a sequence of the step has M-RoPE positions.
    pub rope_positions: Option<Vec<[usize; 3]>>,
    /// The tokens of each LoRA adapter the step's sequences use: `(adapter id, runs of consecutive
    /// tokens)`.
    pub lora_rows: Vec<(usize, Vec<Range<usize>>)>,
}

pub struct DecoderModel {
    cfg: ModelConfig,
    /// Attention scores' scale: 1/sqrt(head_dim) unless the config sets one.
    attention_scale: f32,
    /// The input embedding, `None` when tied to `lm_head` (rows are then read from it).
    embed: Option<Embedding>,
    ranks: Vec<RankModel>,
    norm: Vec<f32>,
    /// The global layers' rope, then the sliding layers' where it differs (Gemma 3).
    ropes: Vec<Rope>,
    reduce: AllReduce,
    /// With tensor parallelism, the threads that drive the ranks (share `r` runs rank `r`, on
    /// its home CPU; share 0 is the caller): persistent, as a compute pool's workers are, so a
    /// decode step starts no thread.
    rank_drivers: Option<ThreadPool>,
    /// A vision-language model's image encoder.
    vision: Option<ImageTower>,
    /// Packs the LoRA adapters these layers take.
    lora_packer: LoraPacker,
    /// The LoRA adapters requests may name, by id. Ids are never reused: a request keeps
    /// referring to its adapter while others are loaded and unloaded.
    adapters: BTreeMap<usize, LoraAdapter>,
    next_adapter_id: usize,
}

/// What packing a LoRA adapter needs of the model: adapters loaded at run time are packed on the
/// caller's thread, while the engine thread runs steps.
#[derive(Clone)]
pub struct LoraPacker {
    cfg: ModelConfig,
    /// The base model's float weights' dtype, which adapters are held in: bf16 adapters over a bf16
    /// or quantized model read half the bytes of float32 ones at every step.
    dtype: WeightDtype,
    /// Each layer's projections adapters may update.
    modules: Vec<Vec<LoraModule>>,
    /// What each tensor-parallel rank holds of the model: adapters are split as its weights are.
    shards: Vec<Shard>,
}

impl LoraPacker {
    /// A packer for a dense model of `cfg` (separate q/k/v/o and gate/up/down projections) on
    /// one rank.
    #[cfg(test)]
    pub(crate) fn new(cfg: ModelConfig) -> LoraPacker {
        let shards = Shard::all(cfg.num_attention_heads, cfg.num_key_value_heads, cfg.vocab_size, 1).expect("one rank");
        LoraPacker { modules: lora::dense_modules(&cfg), cfg, dtype: WeightDtype::F32, shards }
    }

    /// Packs `adapter` (on `pool`), refusing it where it does not fit the model or `max_rank`.
    pub fn pack(&self, adapter: PeftAdapter, max_rank: Option<usize>, pool: &ThreadPool) -> Result<LoraAdapter> {
        LoraAdapter::from_peft(adapter, &self.cfg, &self.modules, &self.shards, self.dtype, max_rank, pool)
    }
}

/// A vision tower of one of the families rsgl runs.
enum ImageTower {
    Siglip(VisionTower),
    Qwen(QwenVisionTower),
}

impl DecoderModel {
    /// Packs the weights in `dtype` for the kernels of each rank's `Compute` (one per
    /// tensor-parallel rank; one without tensor parallelism), each rank's slice on its own threads.
    pub fn new(cfg: ModelConfig, mut w: WeightStore, max_positions: usize, precision: Precision, output: ModelOutput, computes: Vec<Compute>) -> Result<Self> {
        let Precision { dtype, quantization, quantize_lm_head } = precision;
        let (h, v, hd) = (cfg.hidden_size, cfg.vocab_size, cfg.head_dim);
        let assembly: Assembly = Architecture::named(&cfg.architecture).expect("a validated config names a known architecture").assembly;
        if assembly.qk_norm == QkNorm::AllHeads && computes.len() > 1 {
            return Err(EngineError::InvalidRequest(format!(
                "a {} model normalizes q and k over all heads at once, which tensor parallelism would split: use tp_size 1",
                cfg.architecture
            )));
        }
        let shards = Shard::all(cfg.num_attention_heads, cfg.num_key_value_heads, v, computes.len())?;
        let ranks: Vec<(&Shard, &ThreadPool)> = shards.iter().zip(&computes).map(|(s, c)| (s, &c.pool)).collect();
        let ranks: &Ranks = &ranks;
        let embed = w.take_matrix("model.embed_tokens.weight", v, h)?;
        let mut layers: Vec<Vec<Layer>> = shards.iter().map(|_| Vec::with_capacity(cfg.num_hidden_layers)).collect();
        let mut lora_modules = Vec::with_capacity(cfg.num_hidden_layers);
        for l in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{l}");
            let delta_net = cfg.gated_delta_net.as_ref().filter(|net| net.layers.contains(&l));
            let mamba2 = cfg.mamba2.as_ref().filter(|mamba| mamba.layers.contains(&l));
            let lora_mixer = match (delta_net, mamba2, &cfg.latent_attention) {
                (None, None, None) if assembly.attention_output_gate => LoraMixer::GatedAttention { head_dim: hd },
                (None, None, None) => LoraMixer::Attention,
                (None, None, Some(_)) => LoraMixer::LatentAttention,
                _ => LoraMixer::Other,
            };
            lora_modules.push(lora::layer_modules(&w, l, lora_mixer));
            let mixers: Vec<Mixer> = match (delta_net, mamba2, &cfg.latent_attention) {
                (Some(net), _, _) => DeltaNet::take(&mut w, l, &cfg, net, &precision, ranks)?.into_iter().map(Mixer::DeltaNet).collect(),
                (_, Some(mamba), _) => Mamba2Layer::take(&mut w, l, &cfg, mamba, &precision, ranks)?.into_iter().map(Mixer::Mamba2).collect(),
                (_, _, Some(latent)) => LatentAttention::take(&mut w, l, &cfg, latent, &precision, ranks)?.into_iter().map(Mixer::LatentAttention).collect(),
                _ => Attention::take(&mut w, l, &cfg, &assembly, &precision, ranks)?.into_iter().map(Mixer::Attention).collect(),
            };
            let attention_norms = SublayerNorms::take(&mut w, &p, assembly.attention, &cfg)?;
            let mlp_norms = SublayerNorms::take(&mut w, &p, assembly.mlp, &cfg)?;
            let mlps = Mlp::take(&mut w, l, &p, &cfg, assembly.mlp_layout, &precision, ranks)?;
            for ((rank_layers, mixer), mlp) in layers.iter_mut().zip(mixers).zip(mlps) {
                rank_layers.push(Layer { attention_norms: attention_norms.clone(), mixer, mlp_norms: mlp_norms.clone(), mlp });
            }
        }
        let norm = take_norm(&mut w, "model.norm.weight", h, &cfg)?;
        let vision = match &cfg.vision {
            Some(ImageEncoder::Siglip(vision)) => Some(ImageTower::Siglip(VisionTower::take(&mut w, vision, h, dtype, &computes[0])?)),
            Some(ImageEncoder::Qwen2_5Vl(vision)) => Some(ImageTower::Qwen(QwenVisionTower::take(&mut w, vision, h, dtype, &computes[0])?)),
            None => {
                // The SigLIP-style tower of a vision-language model run on text (LLaVA's CLIP).
                ["model.vision_model.", "model.multi_modal_projector."].iter().for_each(|prefix| w.drop_prefixed(prefix));
                None
            }
        };
        // A GGUF file's LongRoPE factors, which its config holds.
        for factors in ["rope_factors_short.weight", "rope_factors_long.weight"] {
            drop(w.take_optional(factors, &[cfg.rotary_dim.unwrap_or(hd) / 2])?);
        }
        // A GGUF, AWQ or GPTQ file chose its lm_head's type itself; a quantized-at-load lm_head
        // is asked for.
        let lm_head_quantization = quantization.filter(|q| quantize_lm_head || q.as_stored());
        let pack_lm_head = |weight: LinearParts| -> Vec<Option<Linear>> {
            ranks.iter().map(|(shard, pool)| Some(Linear::fused(vec![weight.output_rows(shard.vocab.clone())], dtype, lm_head_quantization, pool))).collect()
        };
        let (embed, lm_heads) = if output == ModelOutput::HiddenStates || cfg.tie_word_embeddings {
            // A tied checkpoint may still carry a copy of the embedding as lm_head; an
            // embedding model does not use its lm_head.
            drop(w.take_optional("lm_head.weight", &[v, h])?);
            match output {
                ModelOutput::Logits => (None, pack_lm_head(LinearParts::new(embed, None))),
                ModelOutput::HiddenStates => (Some(Embedding::new(&embed, dtype)), shards.iter().map(|_| None).collect()),
            }
        } else {
            (Some(Embedding::new(&embed, dtype)), pack_lm_head(LinearParts::new(w.take_matrix("lm_head.weight", v, h)?, None)))
        };
        w.drop_layers_from(cfg.num_hidden_layers);
        if !w.is_empty() {
            return Err(EngineError::ModelLoad(format!(
                "the checkpoint has tensors this {} model does not use: {:?}",
                cfg.architecture,
                &w.remaining_names()[..w.len().min(5)]
            )));
        }
        // GGUF files are read in the Hugging Face layout (llama.cpp's q/k permutation is undone),
        // so the family's rope style holds for both.
        let mrope_section = cfg.vision.as_ref().and_then(ImageEncoder::mrope_section);
        let mut ropes = vec![Rope::global(&cfg, max_positions, assembly.rope_style).with_mrope_section(mrope_section)];
        if let Some(theta) = cfg.sliding_window.as_ref().and_then(|window| window.rope_theta) {
            ropes.push(Rope::new(&cfg, theta, None, max_positions, assembly.rope_style));
        }
        let reduce = AllReduce::new(shards.len());
        let homes: Vec<usize> = computes.iter().filter_map(|c| c.home_cpu).collect();
        let pinned = homes.len() == computes.len();
        let rank_drivers = (computes.len() > 1).then(|| ThreadPool::on_cpus(computes.len(), &homes, pinned));
        let ranks: Vec<RankModel> = shards
            .into_iter()
            .zip(layers)
            .zip(lm_heads)
            .zip(computes)
            .map(|(((shard, layers), lm_head), compute)| RankModel { shard, layers, lm_head, compute })
            .collect();
        let attention_scale = cfg.scales.attention.unwrap_or(1.0 / (hd as f32).sqrt());
        let shards = ranks.iter().map(|rank| rank.shard.clone()).collect();
        let lora_packer = LoraPacker { cfg: cfg.clone(), modules: lora_modules, shards, dtype };
        let adapters = BTreeMap::new();
        Ok(DecoderModel { cfg, attention_scale, embed, ranks, norm, ropes, reduce, rank_drivers, vision, lora_packer, adapters, next_adapter_id: 0 })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn lora_packer(&self) -> &LoraPacker {
        &self.lora_packer
    }

    /// Packs and adds a LoRA adapter (see [`Self::add_adapter`]).
    pub fn load_adapter(&mut self, adapter: PeftAdapter, max_rank: Option<usize>) -> Result<usize> {
        let packed = self.lora_packer.pack(adapter, max_rank, self.pool())?;
        Ok(self.add_adapter(packed))
    }

    /// Adds a packed LoRA adapter requests may then use; returns its id in [`Self::adapters`].
    /// The engine keeps names unique.
    pub fn add_adapter(&mut self, adapter: LoraAdapter) -> usize {
        let id = self.next_adapter_id;
        self.next_adapter_id += 1;
        self.adapters.insert(id, adapter);
        id
    }

    /// Drops the adapter `id` (no request may use it any more).
    pub fn remove_adapter(&mut self, id: usize) -> Option<LoraAdapter> {
        self.adapters.remove(&id)
    }

    pub fn adapters(&self) -> &BTreeMap<usize, LoraAdapter> {
        &self.adapters
    }

    /// The length of each row [`Self::forward`] returns.
    pub fn output_width(&self) -> usize {
        match self.ranks[0].lm_head {
            Some(_) => self.cfg.vocab_size,
            None => self.cfg.hidden_size,
        }
    }

    /// An image's rows for the language model, in place of its image tokens, from its
    /// preprocessed tiles (or patches, of grid `grid_thw`); on the first rank's threads.
    pub fn encode_image(&self, pixels: &[f32], grid_thw: Option<[usize; 3]>) -> Result<Vec<f32>> {
        let vision = self.vision.as_ref().ok_or_else(|| EngineError::InvalidRequest(format!("this {} model does not read images", self.cfg.architecture)))?;
        let _phase = profile::phase(Phase::ForwardOther);
        let compute = &self.ranks[0].compute;
        match (vision, grid_thw) {
            (ImageTower::Siglip(tower), _) => tower.forward(compute, pixels),
            (ImageTower::Qwen(tower), Some(grid)) => tower.forward(compute, pixels, grid),
            (ImageTower::Qwen(_), None) => Err(EngineError::InvalidRequest("a Qwen2.5-VL image needs its patch grid (grid_thw)".into())),
        }
    }

    /// The first rank's compute threads, idle between forward passes (the engine fills token
    /// masks on them).
    pub fn pool(&self) -> &ThreadPool {
        &self.ranks[0].compute.pool
    }

    /// How many kv heads each rank holds: the parts of its KV cache.
    pub fn kv_heads_per_rank(&self) -> Vec<usize> {
        self.ranks.iter().map(|r| r.shard.kv_heads.len()).collect()
    }

    /// Runs the batch, writing new K/V into the cache; returns the rows `[n, output_width]`
    /// (logits, or final-norm hidden states) after each chunk's [`SeqChunk::rows`] tokens, in
    /// batch order. With tensor parallelism, every rank runs its slice of every layer on threads
    /// of its own (rank 0 on the calling thread), and the lm_head's pieces are joined here.
    pub fn forward(&self, seqs: &[SeqChunk], kv: &mut KvCache) -> Vec<f32> {
        let _phase = profile::phase(Phase::ForwardOther);
        // Per token: which sequence and which position.
        let mut token_seq = Vec::new();
        let mut positions = Vec::new();
        for (s, chunk) in seqs.iter().enumerate() {
            for t in 0..chunk.tokens.len() {
                token_seq.push(s);
                positions.push(chunk.start_pos + t);
            }
        }
        let key_ends = seqs.iter().any(|chunk| !chunk.bidirectional.is_empty()).then(|| {
            let run_end = |chunk: &SeqChunk, pos: usize| chunk.bidirectional.iter().find(|run| run.contains(&pos)).map_or(pos + 1, |run| run.end);
            token_seq.iter().zip(&positions).map(|(&s, &pos)| run_end(&seqs[s], pos)).collect()
        });
        let rope_positions = seqs.iter().any(|chunk| chunk.mrope.is_some()).then(|| {
            let at = |chunk: &SeqChunk, p: usize| chunk.mrope.map_or([p; 3], |mrope| mrope.at(p));
            seqs.iter().flat_map(|chunk| (chunk.start_pos..chunk.start_pos + chunk.tokens.len()).map(move |p| at(chunk, p))).collect()
        });
        let mut lora_rows: Vec<(usize, Vec<Range<usize>>)> = Vec::new();
        let mut first = 0;
        for chunk in seqs {
            let tokens = first..first + chunk.tokens.len();
            first = tokens.end;
            let Some(adapter) = chunk.lora else { continue };
            let runs = match lora_rows.iter_mut().find(|(a, _)| *a == adapter) {
                Some((_, runs)) => runs,
                None => {
                    lora_rows.push((adapter, Vec::new()));
                    &mut lora_rows.last_mut().expect("just pushed").1
                }
            };
            match runs.last_mut() {
                Some(run) if run.end == tokens.start => run.end = tokens.end,
                _ => runs.push(tokens),
            }
        }
        let step = Step { seqs, token_seq, positions, key_ends, rope_positions, lora_rows };
        let Some(drivers) = &self.rank_drivers else {
            return self.run_rank(&self.ranks[0], &step, &mut kv.parts_mut()[0]);
        };
        // Each driver takes its rank's KV part and leaves its rank's output.
        let parts: Vec<Mutex<Option<&mut KvPart>>> = kv.parts_mut().iter_mut().map(|part| Mutex::new(Some(part))).collect();
        let pieces: Vec<Mutex<Vec<f32>>> = self.ranks.iter().map(|_| Mutex::new(Vec::new())).collect();
        drivers.run(&|r| {
            let part = parts[r].lock().unwrap_or_else(|e| e.into_inner()).take().expect("one driver per rank");
            *pieces[r].lock().unwrap_or_else(|e| e.into_inner()) = self.run_rank(&self.ranks[r], &step, part);
        });
        let pieces: Vec<Vec<f32>> = pieces.into_iter().map(|p| p.into_inner().unwrap_or_else(|e| e.into_inner())).collect();
        let rank0 = &self.ranks[0];
        match &rank0.lm_head {
            // Each rank's logits are its vocabulary columns of every row.
            Some(_) => {
                let rows = pieces[0].len() / rank0.shard.vocab.len();
                let mut logits = Vec::with_capacity(rows * self.cfg.vocab_size);
                for row in 0..rows {
                    for (rank, piece) in self.ranks.iter().zip(&pieces) {
                        let width = rank.shard.vocab.len();
                        logits.extend_from_slice(&piece[row * width..(row + 1) * width]);
                    }
                }
                logits
            }
            None => pieces.into_iter().next().expect("rank 0's hidden states"),
        }
    }

    /// The step's tokens embedded, `[tokens, hidden_size]`: the residual stream a rank starts
    /// from.
    fn embed(&self, step: &Step) -> Vec<f32> {
        let h = self.cfg.hidden_size;
        let mut x = Vec::with_capacity(step.positions.len() * h);
        for &tok in step.seqs.iter().flat_map(|c| c.tokens) {
            match &self.embed {
                Some(e) => e.push_row(tok as usize, h, &mut x),
                None => {
                    let rank = self.ranks.iter().find(|r| r.shard.vocab.contains(&(tok as usize))).expect("a rank holds every vocabulary row");
                    x.extend(rank.lm_head.as_ref().expect("tied to the embedding").weight.row(tok as usize - rank.shard.vocab.start));
                }
            }
        }
        scale_by(&mut x, self.cfg.scales.embedding);
        let mut first = 0;
        for chunk in step.seqs {
            for &(at, row) in &chunk.image_rows {
                x[(first + at) * h..(first + at + 1) * h].copy_from_slice(row);
            }
            first += chunk.tokens.len();
        }
        x
    }

    /// One rank's forward pass over its slice; returns its lm_head rows (every rank's hidden
    /// states are the same; rank 0's are returned). Every rank embeds the tokens into a
    /// residual stream of its own, on its own threads (no rank copies another's). A panic
    /// poisons the reduction so the other ranks stop waiting for this one.
    fn run_rank(&self, rank: &RankModel, step: &Step, kv: &mut KvPart) -> Vec<f32> {
        struct PoisonOnPanic<'a>(&'a AllReduce);
        impl Drop for PoisonOnPanic<'_> {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    self.0.poison();
                }
            }
        }
        let _poison = PoisonOnPanic(&self.reduce);
        let mut x = self.embed(step);
        let (cfg, c, h) = (&self.cfg, &rank.compute, self.cfg.hidden_size);
        let attention_cx = AttentionContext { cfg, ropes: &self.ropes, scale: self.attention_scale, compute: c, shard: &rank.shard };
        let mut round = 0;
        let mut residual_delta: Option<Vec<f32>> = None;
        for (l, layer) in rank.layers.iter().enumerate() {
            let lora: Vec<LoraRows> = step
                .lora_rows
                .iter()
                .map(|(adapter, runs)| {
                    let adapter = &self.adapters[adapter];
                    LoraRows { runs, scaling: adapter.scaling, layer: adapter.layer(rank.shard.rank, l) }
                })
                .collect();
            let normed = self.sublayer_input(c, &mut x, residual_delta.take(), &layer.attention_norms);
            let mut attn_out = match &layer.mixer {
                Mixer::Attention(attention) => attention.forward(&attention_cx, &normed, kv, l, step, &lora),
                other => {
                    let _phase = profile::phase(Phase::OtherMixer);
                    match other {
                        Mixer::LatentAttention(attention) => attention.forward(&attention_cx, &normed, kv, l, step, &lora),
                        Mixer::DeltaNet(net) => net.forward(c, &normed, kv.states.layer_mut(l), step),
                        Mixer::Mamba2(mamba) => mamba.forward(c, &normed, kv.states.layer_mut(l), step),
                        Mixer::Attention(_) => unreachable!("matched above"),
                    }
                }
            };
            self.reduce.reduce(rank.shard.rank, &mut round, &mut attn_out, &c.pool);
            let attn_out = self.sublayer_output(c, attn_out, &layer.attention_norms);
            let normed = self.sublayer_input(c, &mut x, Some(attn_out), &layer.mlp_norms);
            let mut mlp_out = layer.mlp.forward(c, &normed, &lora);
            self.reduce.reduce(rank.shard.rank, &mut round, &mut mlp_out, &c.pool);
            residual_delta = Some(self.sublayer_output(c, mlp_out, &layer.mlp_norms));
        }
        if let Some(delta) = residual_delta {
            add_into(&mut x, &delta);
        }
        let mut last_rows = Vec::new();
        let mut t0 = 0;
        for chunk in step.seqs {
            let rows = &chunk.rows;
            last_rows.extend_from_slice(&x[(t0 + rows.start) * h..(t0 + rows.end) * h]);
            t0 += chunk.tokens.len();
        }
        let normed = add_and_norm(c, cfg.rms_norm_eps, &mut last_rows, None, &self.norm);
        match &rank.lm_head {
            Some(lm_head) => {
                let _phase = profile::phase(Phase::LmHead);
                let mut logits = lm_head.forward(c, &normed);
                if cfg.scales.logits_divisor != 1.0 {
                    logits.iter_mut().for_each(|logit| *logit /= cfg.scales.logits_divisor);
                }
                if let Some(cap) = cfg.scales.final_logit_cap {
                    let width = rank.shard.vocab.len();
                    c.pool.for_chunks_mut(&mut logits, width, &|_, row| (c.kernels.softcap)(row, cap));
                }
                logits
            }
            None => normed,
        }
    }

    /// What a sublayer reads: the residual stream `x` with the last sublayer's output `delta`
    /// added, normalized where the sublayer has a norm before it.
    fn sublayer_input(&self, c: &Compute, x: &mut [f32], delta: Option<Vec<f32>>, norms: &SublayerNorms) -> Vec<f32> {
        match &norms.pre {
            Some(weight) => add_and_norm(c, self.cfg.rms_norm_eps, x, delta.as_deref(), weight),
            None => {
                if let Some(delta) = delta {
                    add_into(x, &delta);
                }
                x.to_vec()
            }
        }
    }

    /// A sublayer's output as it joins the residual stream: normalized where the sublayer has a
    /// norm after it, then scaled by the config's residual scale.
    fn sublayer_output(&self, c: &Compute, mut out: Vec<f32>, norms: &SublayerNorms) -> Vec<f32> {
        if let Some(weight) = &norms.post {
            out = add_and_norm(c, self.cfg.rms_norm_eps, &mut out, None, weight);
        }
        scale_by(&mut out, self.cfg.scales.residual);
        out
    }
}

/// `x += delta` (the residual stream), then the RMSNorm of each row of `x`, row-parallel.
fn add_and_norm(c: &Compute, eps: f32, x: &mut [f32], delta: Option<&[f32]>, weight: &[f32]) -> Vec<f32> {
    let _phase = profile::phase(Phase::Norm);
    let (h, kern) = (weight.len(), c.kernels);
    let mut normed = vec![0.0; x.len()];
    c.pool.for_chunk_pairs_mut(x, h, &mut normed, h, &|row, x, out| {
        (kern.add_rmsnorm)(x, delta.map(|d| &d[row * h..(row + 1) * h]), weight, eps, out);
    });
    normed
}

fn add_into(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}

/// `x *= scale`; nothing to do for the scale of 1 most models have.
pub(super) fn scale_by(x: &mut [f32], scale: f32) {
    if scale != 1.0 {
        x.iter_mut().for_each(|value| *value *= scale);
    }
}
