//! LoRA adapters (PEFT's format, or llama.cpp's GGUF files made from it): for some projections
//! of every layer, a low-rank update `scaling · B·A` (A `[r, in]`, B `[out, r]`, held in float32)
//! that requests naming the adapter add to the base layer's output. The base GEMM runs once for
//! the whole batch; then the rows of each adapter add `scaling · (x·Aᵀ)·Bᵀ` to their columns of
//! the projection (its slice of the fused q|k|v or gate|up output). Rows without an adapter pay
//! nothing. With tensor parallelism each rank holds its slice of every update, cut as its shard
//! of the base weight is: B's rows of its output columns where the projection is split by output
//! rows (q, k, v, gate, up), A's columns of its input slice where it is split by input columns (o,
//! down), whose update then joins the rank's partial sum before the reduction.

use super::linear::{Compute, Linear, LinearParts};
use super::tensor_parallel::Shard;
use crate::config::{Architecture, LatentAttention as LatentShape, ModelConfig};
use crate::error::{EngineError, Result};
use crate::weights::WeightStore;
use rsgl_kernels::{ThreadPool, WeightDtype};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::path::Path;

/// The projections of a decoder layer an adapter may update: separate, or fused as a checkpoint
/// fuses them (Phi-3's `qkv_proj`, Phi-3's and GLM-4's `gate_up_proj`, Granite 4's
/// `input_linear`), whose updates' B rows cover q|k|v and gate|up in that order, as rsgl's fused
/// outputs hold their columns; and multi-head latent attention's (DeepSeek-V2/V3).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum LoraTarget {
    Q,
    K,
    V,
    Qkv,
    /// Gated attention's output gates (Qwen3-Next, Qwen3.5): the rows of a `q_proj` update
    /// that its q rows interleave with, head by head.
    QGate,
    O,
    Gate,
    Up,
    GateUp,
    Down,
    /// Latent attention's low-rank q (`q_a_proj`, before `q_a_layernorm`), where q goes through a
    /// low rank; its `q_proj` otherwise takes [`LoraTarget::Q`].
    QA,
    /// The low-rank q's up-projection into the heads' q (`q_b_proj`).
    QB,
    /// The latent and the rope key (`kv_a_proj_with_mqa`, before the latent's norm and the rope).
    KvA,
    /// Every head's key (without rope) and value from the latent (`kv_b_proj`).
    KvB,
}

impl LoraTarget {
    pub const ALL: [LoraTarget; 14] = [
        LoraTarget::Q,
        LoraTarget::K,
        LoraTarget::V,
        LoraTarget::Qkv,
        LoraTarget::QGate,
        LoraTarget::O,
        LoraTarget::Gate,
        LoraTarget::Up,
        LoraTarget::GateUp,
        LoraTarget::Down,
        LoraTarget::QA,
        LoraTarget::QB,
        LoraTarget::KvA,
        LoraTarget::KvB,
    ];
}

/// Where a layer's projections sit in a Hugging Face checkpoint, past `model.layers.N.` (PEFT
/// names their modules so too), and which target each is. A layer has a fused projection or the
/// separate ones; a layer of routed experts may have a shared expert beside them (Qwen2-MoE's and
/// Qwen3-Next's `shared_expert`, DeepSeek's and GLM-4.5's `shared_experts`, Granite 4's
/// `shared_mlp`), whose projections take the MLP's targets.
const LAYER_MODULES: [(&str, LoraTarget); 21] = [
    ("self_attn.qkv_proj", LoraTarget::Qkv),
    ("self_attn.q_proj", LoraTarget::Q),
    ("self_attn.k_proj", LoraTarget::K),
    ("self_attn.v_proj", LoraTarget::V),
    ("self_attn.o_proj", LoraTarget::O),
    ("self_attn.q_a_proj", LoraTarget::QA),
    ("self_attn.q_b_proj", LoraTarget::QB),
    ("self_attn.kv_a_proj_with_mqa", LoraTarget::KvA),
    ("self_attn.kv_b_proj", LoraTarget::KvB),
    ("mlp.gate_up_proj", LoraTarget::GateUp),
    ("mlp.gate_proj", LoraTarget::Gate),
    ("mlp.up_proj", LoraTarget::Up),
    ("mlp.down_proj", LoraTarget::Down),
    ("mlp.shared_expert.gate_proj", LoraTarget::Gate),
    ("mlp.shared_expert.up_proj", LoraTarget::Up),
    ("mlp.shared_expert.down_proj", LoraTarget::Down),
    ("mlp.shared_experts.gate_proj", LoraTarget::Gate),
    ("mlp.shared_experts.up_proj", LoraTarget::Up),
    ("mlp.shared_experts.down_proj", LoraTarget::Down),
    ("shared_mlp.input_linear", LoraTarget::GateUp),
    ("shared_mlp.output_linear", LoraTarget::Down),
];

/// A projection of one layer that adapters may update.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct LoraModule {
    target: LoraTarget,
    /// Its path in the layer (`self_attn.q_proj`), as PEFT's tensors name it.
    path: &'static str,
    /// The base projection's `(out, in)` features.
    shape: (usize, usize),
    /// Gated attention's `q_proj`: its rows are each head's q (this many) then its output
    /// gate's (as many), which update [`LoraTarget::Q`] and [`LoraTarget::QGate`].
    gated_head_dim: Option<usize>,
}

/// What one tensor-parallel rank holds of an update: the slice its shard of the base weight
/// implies.
enum RankSlice {
    /// A projection split by output rows: these rows of B (A whole).
    BRows(Vec<Range<usize>>),
    /// A projection split by input columns: these columns of A (B whole), so the rank's update
    /// is its share of the sum the reduction makes.
    AColumns(Range<usize>),
}

impl LoraModule {
    /// The updates rank `shard` makes of this projection (gated attention's `q_proj`: its q rows'
    /// and its gates'), each with its slice, from the ranges that rank's base weights take.
    fn rank_slices(&self, shard: &Shard, cfg: &ModelConfig) -> Vec<(LoraTarget, RankSlice)> {
        use LoraTarget::*;
        use RankSlice::*;
        let ((out, inp), hd) = (self.shape, cfg.head_dim);
        let shifted = |rows: Range<usize>, by: usize| rows.start + by..rows.end + by;
        match (self.target, self.gated_head_dim) {
            (Q, Some(hd)) => {
                let [q_rows, gate_rows] = shard.gated_q_rows(hd);
                vec![(Q, BRows(q_rows)), (QGate, BRows(gate_rows))]
            }
            (QGate, _) => {
                let [_, gate_rows] = shard.gated_q_rows(hd);
                vec![(QGate, BRows(gate_rows))]
            }
            // Each head's q: head_dim rows, or latent attention's nope + rope dims.
            (Q, None) => vec![(Q, BRows(vec![shard.q_rows(out / cfg.num_attention_heads)]))],
            (K | V, _) => vec![(self.target, BRows(vec![shard.kv_rows(hd)]))],
            (Qkv, _) => {
                let (q, kv, kv_rows) = (cfg.q_size(), cfg.kv_size(), shard.kv_rows(hd));
                vec![(Qkv, BRows(vec![shard.q_rows(hd), shifted(kv_rows.clone(), q), shifted(kv_rows, q + kv)]))]
            }
            // Each head's attention output: head_dim wide, or latent attention's v_head_dim.
            (O, _) => vec![(O, AColumns(shard.q_rows(inp / cfg.num_attention_heads)))],
            (Gate | Up, _) => vec![(self.target, BRows(vec![shard.columns(out)]))],
            (GateUp, _) => {
                let columns = shard.columns(out / 2);
                vec![(GateUp, BRows(vec![columns.clone(), shifted(columns, out / 2)]))]
            }
            (Down, _) => vec![(Down, AColumns(shard.columns(inp)))],
            // Latent attention runs on one rank (its models refuse tp_size > 1): the whole update.
            (QA | QB | KvA | KvB, _) => {
                let every_row = 0..out;
                vec![(self.target, BRows(vec![every_row]))]
            }
        }
    }
}

/// A layer's token mixer, as far as adapters go.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum LoraMixer {
    /// Softmax attention: q, k and v projections (or one fused), and o.
    Attention,
    /// Softmax attention whose `q_proj` holds each head's q, then its output gate, of `head_dim` each.
    GatedAttention { head_dim: usize },
    /// Multi-head latent attention: `q_proj` (or `q_a_proj` and `q_b_proj`), `kv_a_proj_with_mqa`,
    /// `kv_b_proj` and `o_proj`.
    LatentAttention,
    /// A recurrent layer, whose projections take no adapters.
    Other,
}

/// The projections of layer `l` adapters may update, as the checkpoint `w` holds them (read
/// before the layer takes its weights): its `mixer`'s where it is an attention layer, and its
/// dense MLP's or shared expert's. Routed experts are not among them.
pub(super) fn layer_modules(w: &WeightStore, l: usize, mixer: LoraMixer) -> Vec<LoraModule> {
    let shape = |path: &str| w.shape(&format!("model.layers.{l}.{path}.weight"));
    LAYER_MODULES
        .into_iter()
        .filter(|(path, _)| mixer != LoraMixer::Other || !path.starts_with("self_attn."))
        .filter_map(|(path, target)| {
            let (out, inp) = match (shape(path), target) {
                (Some(&[out, inp]), _) => (out, inp),
                // A GGUF file's `kv_b_proj`, split into the heads' keys (transposed) and values.
                (None, LoraTarget::KvB) => match (shape("self_attn.k_b_proj")?, shape("self_attn.v_b_proj")?) {
                    (&[heads, latent, nope], &[_, v, _]) => (heads * (nope + v), latent),
                    _ => return None,
                },
                _ => return None,
            };
            let gated_head_dim = match mixer {
                LoraMixer::GatedAttention { head_dim } if target == LoraTarget::Q => Some(head_dim),
                _ => None,
            };
            Some(LoraModule { target, path, shape: (out, inp), gated_head_dim })
        })
        .collect()
}

/// The projections of a dense model of `cfg` with separate q/k/v/o and gate/up/down
/// projections, layer by layer.
#[cfg(test)]
pub(crate) fn dense_modules(cfg: &ModelConfig) -> Vec<Vec<LoraModule>> {
    use LoraTarget::*;
    let (h, q, kv, inter) = (cfg.hidden_size, cfg.q_size(), cfg.kv_size(), cfg.intermediate_size);
    let layer = [
        ("self_attn.q_proj", Q, (q, h)),
        ("self_attn.k_proj", K, (kv, h)),
        ("self_attn.v_proj", V, (kv, h)),
        ("self_attn.o_proj", O, (h, q)),
        ("mlp.gate_proj", Gate, (inter, h)),
        ("mlp.up_proj", Up, (inter, h)),
        ("mlp.down_proj", Down, (h, inter)),
    ]
    .map(|(path, target, shape)| LoraModule { target, path, shape, gated_head_dim: None });
    vec![layer.to_vec(); cfg.num_hidden_layers]
}

/// Where PEFT's tensor names put the decoder layers: a causal LM's `model.layers`, or a
/// vision-language model's text model's as transformers names it (Gemma 3's and Qwen2.5-VL's
/// `model.language_model`, transformers 4's `language_model.model`; SmolVLM's `model.text_model`).
const TEXT_LAYERS: [&str; 4] = [
    "base_model.model.model.layers.",
    "base_model.model.model.language_model.layers.",
    "base_model.model.language_model.model.layers.",
    "base_model.model.model.text_model.layers.",
];

/// Where PEFT's tensor names put a vision-language model's vision tower and its projector, past
/// `base_model.model.` and an optional `model.`.
const VISION_PARTS: [&str; 5] = ["vision_model.", "vision_tower.", "visual.", "connector.", "multi_modal_projector."];

/// PEFT's `target_modules`: module names, or one regular expression (or "all-linear").
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
pub enum TargetModules {
    Names(Vec<String>),
    Pattern(String),
}

/// What rsgl reads of a PEFT `adapter_config.json` (its other keys say how it was trained).
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct PeftConfig {
    #[serde(default)]
    pub peft_type: Option<String>,
    pub r: usize,
    pub lora_alpha: f64,
    /// rsLoRA: the update is scaled by `lora_alpha / sqrt(r)` instead of `lora_alpha / r`.
    #[serde(default)]
    pub use_rslora: bool,
    pub target_modules: TargetModules,
    #[serde(default)]
    pub use_dora: bool,
    #[serde(default)]
    pub rank_pattern: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    pub alpha_pattern: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    pub modules_to_save: Option<Vec<String>>,
    #[serde(default)]
    pub fan_in_fan_out: bool,
    /// Parameters updated beside `target_modules`' linear layers (transformers 5's stacked
    /// routed experts).
    #[serde(default)]
    pub target_parameters: Option<Vec<String>>,
}

impl PeftConfig {
    /// An `adapter_config.json`'s fields (a JSON object, or the Python dict the binding passes).
    pub fn deserialize_from<'de, D: serde::Deserializer<'de>>(de: D) -> std::result::Result<PeftConfig, String> {
        crate::request::deserialize_with_path(de)
    }

    /// The factor on `B·A`.
    pub fn scaling(&self) -> f32 {
        let r = self.r as f64;
        (if self.use_rslora { self.lora_alpha / r.sqrt() } else { self.lora_alpha / r }) as f32
    }
}

/// An adapter as the engine is given it: its name, its `adapter_config.json` and its weights
/// (`adapter_model.safetensors`, mapped), or what a GGUF LoRA file says of them.
pub struct PeftAdapter {
    pub name: String,
    pub config: PeftConfig,
    pub weights: WeightStore,
}

/// Hugging Face architectures llama.cpp's converter files under another architecture's GGUF name
/// (rsgl's name, the GGUF name): their adapters' files carry it.
const CONVERTED_AS: &[(&str, &str)] = &[("mistral", "llama")];

impl PeftAdapter {
    /// The GGUF LoRA file `path` (llama.cpp's `convert_lora_to_gguf.py` writes them from PEFT
    /// folders; `llama-server --lora` takes them) as the PEFT adapter it was made from, for a base
    /// model of `cfg`: its tensors under PEFT's names and laid out as PEFT's, its rank that of its
    /// tensors, its scaling llama.cpp's (`adapter.lora.alpha / r`; 1 with no alpha). Refuses a file
    /// that is not a LoRA adapter, or was made for another architecture than the base model's.
    pub fn from_gguf(name: String, path: &Path, cfg: &ModelConfig) -> Result<PeftAdapter> {
        let source = path.display();
        let refuse = |why: String| EngineError::ModelLoad(format!("LoRA adapter {name:?}: {source} {why}"));
        let metadata = WeightStore::gguf_metadata(path).map_err(|e| EngineError::ModelLoad(format!("LoRA adapter {name:?}: {e}")))?;
        let text = |key: &str| metadata.get(key).and_then(Value::as_str);
        if (text("general.type"), text("adapter.type")) != (Some("adapter"), Some("lora")) {
            let kind = match text("general.type") {
                Some("adapter") => format!("a {:?} adapter", text("adapter.type").unwrap_or("unnamed")),
                Some(kind) => format!("a {kind:?} file"),
                None => "a file with no general.type".into(),
            };
            return Err(refuse(format!(
                "is not a LoRA adapter but {kind}; give a GGUF LoRA file (general.type \"adapter\", adapter.type \"lora\"), as llama.cpp's convert_lora_to_gguf.py writes them"
            )));
        }
        let made_for = text("general.architecture");
        let base = Architecture::named(&cfg.architecture).and_then(|a| a.gguf_name);
        let converted_as = CONVERTED_AS.iter().find(|(rsgl, _)| *rsgl == cfg.architecture).map(|(_, gguf)| *gguf);
        if made_for.is_none() || (made_for != base && made_for != converted_as) {
            return Err(refuse(format!(
                "was made for a {:?} model, but the base model is a {} ({:?} in GGUF files); convert the adapter with --base the base model's folder",
                made_for.unwrap_or("unnamed"),
                cfg.architecture,
                base.unwrap_or("none")
            )));
        }
        if metadata.contains_key("adapter.alora.invocation_tokens") {
            return Err(refuse("is an activated LoRA (adapter.alora.invocation_tokens), which rsgl does not apply yet".into()));
        }
        let alpha =
            metadata.get("adapter.lora.alpha").and_then(Value::as_f64).ok_or_else(|| refuse("has no adapter.lora.alpha; the file looks broken".into()))?;
        let weights = WeightStore::open_gguf_lora(path, &cfg.architecture, cfg.num_attention_heads, cfg.num_key_value_heads)?;
        let a_matrices: Vec<(&str, usize)> =
            weights.names().into_iter().filter_map(|tensor| Some((tensor.strip_suffix(".lora_A.weight")?, *weights.shape(tensor)?.first()?))).collect();
        let ranks: BTreeSet<usize> = a_matrices.iter().map(|&(_, r)| r).collect();
        let r = match ranks.iter().collect::<Vec<_>>()[..] {
            [] => return Err(refuse("holds no lora_a / lora_b tensors of a decoder layer's projections".into())),
            [&r] => r,
            _ => return Err(refuse(format!("updates its modules at several ranks ({ranks:?}), which rsgl does not apply yet"))),
        };
        let modules: BTreeSet<String> = a_matrices.iter().filter_map(|(module, _)| module.rsplit_once('.')).map(|(_, module)| module.to_string()).collect();
        let config = PeftConfig {
            peft_type: Some("LORA".into()),
            r,
            // llama.cpp scales an adapter with no alpha by 1.
            lora_alpha: if alpha == 0.0 { r as f64 } else { alpha },
            use_rslora: false,
            target_modules: TargetModules::Names(modules.into_iter().collect()),
            use_dora: false,
            rank_pattern: BTreeMap::new(),
            alpha_pattern: BTreeMap::new(),
            modules_to_save: None,
            fan_in_fan_out: false,
            target_parameters: None,
        };
        Ok(PeftAdapter { name, config, weights })
    }
}

/// One projection's update: `x·Aᵀ` then `·Bᵀ`.
struct LoraPair {
    a: Linear,
    b: Linear,
}

/// An adapter's updates of one layer (one rank's slices of them), by [`LoraTarget`] (none where
/// it leaves a projection be).
#[derive(Default)]
pub(super) struct LoraLayer {
    pairs: [Option<LoraPair>; LoraTarget::ALL.len()],
    /// Its `kv_b_proj` update as latent attention's absorbed form applies it.
    absorbed_kv_b: Option<AbsorbedKvB>,
}

impl LoraLayer {
    /// The `kv_b_proj` update's A (`[r, kv_lora_rank]`) and its absorbed form, where the adapter
    /// updates `kv_b_proj`.
    pub(super) fn absorbed_kv_b(&self) -> Option<(&Linear, &AbsorbedKvB)> {
        Some((&self.pairs[LoraTarget::KvB as usize].as_ref()?.a, self.absorbed_kv_b.as_ref()?))
    }
}

/// A `kv_b_proj` update `s·B·A` (B's rows: each head's key without rope, then its value) where
/// latent attention never forms a head's keys or values (the absorbed form), head by head: its q
/// without rope meets the keys' update `s·B_k·A` as `s·Aᵀ·(B_kᵀ·q)`, a term of its query in the
/// latent's space; its attention output, a latent `o`, gets the values' update `s·B_v·(A·o)`.
/// Both are exact: the latent is linear in both.
pub(super) struct AbsorbedKvB {
    /// `Aᵀ` (`[kv_lora_rank, r]`).
    pub(super) a_t: Linear,
    /// Per head, `B_kᵀ` (`[r, qk_nope_head_dim]`).
    pub(super) key_b_t: Vec<Linear>,
    /// Per head, `B_v` (`[v_head_dim, r]`).
    pub(super) value_b: Vec<Linear>,
}

impl AbsorbedKvB {
    /// From A's values (`[r, kv_lora_rank]`) and B's (`[heads · (qk_nope_head_dim + v_head_dim), r]`).
    fn new(a: &[f32], b: &[f32], r: usize, heads: usize, shape: &LatentShape, dtype: WeightDtype, pool: &ThreadPool) -> Result<AbsorbedKvB> {
        let (lat, nope, v) = (shape.kv_lora_rank, shape.qk_nope_head_dim, shape.v_head_dim);
        let b_row = |head: usize, row: usize| &b[(head * (nope + v) + row) * r..][..r];
        let mut w = WeightStore::new();
        w.insert("a_t", vec![lat, r], (0..lat).flat_map(|col| a.iter().skip(col).step_by(lat).copied()).collect())?;
        let key_b_t = (0..heads).flat_map(|head| (0..r).flat_map(move |k| (0..nope).map(move |i| b_row(head, i)[k])));
        w.insert("key_b_t", vec![heads, r, nope], key_b_t.collect())?;
        w.insert("value_b", vec![heads, v, r], (0..heads).flat_map(|head| (nope..nope + v).flat_map(move |row| b_row(head, row).to_vec())).collect())?;
        let pack = |parts: LinearParts| Linear::fused(vec![parts], dtype, None, pool);
        let a_t = pack(LinearParts::new(w.take_matrix("a_t", lat, r)?, None));
        let mut per_head = |name: &str, rows: usize, cols: usize| -> Result<Vec<Linear>> {
            let matrices = LinearParts::new(w.take_matrices(name, heads, rows, cols)?, None);
            Ok((0..heads).map(|head| pack(matrices.output_rows(head * rows..(head + 1) * rows))).collect())
        };
        Ok(AbsorbedKvB { a_t, key_b_t: per_head("key_b_t", r, nope)?, value_b: per_head("value_b", v, r)? })
    }
}

/// A loaded adapter.
pub struct LoraAdapter {
    pub name: String,
    pub rank: usize,
    pub scaling: f32,
    /// Names these weights, every byte (with the adapter's name and scaling): the prefix cache
    /// keeps the KV of requests using it apart, on disk too, and an adapter loaded again under
    /// the same name with other weights never finds the KV of the one before.
    pub fingerprint: u64,
    /// Each layer's updates, one per tensor-parallel rank, sliced as that rank's base weights are.
    layers: Vec<Vec<LoraLayer>>,
}

impl LoraAdapter {
    /// Packs a PEFT adapter for a model of `cfg` with the
    /// projections `modules` (each layer's, from [`layer_modules`]), split over the ranks `shards`
    /// as the base weights are, its A and B in `dtype`; refuses one whose shapes do not fit it,
    /// whose rank is over `max_rank`, or that updates what rsgl does not apply adapters to.
    pub(super) fn from_peft(
        adapter: PeftAdapter,
        cfg: &ModelConfig,
        modules: &[Vec<LoraModule>],
        shards: &[Shard],
        dtype: WeightDtype,
        max_rank: Option<usize>,
        pool: &ThreadPool,
    ) -> Result<LoraAdapter> {
        let PeftAdapter { name, config, weights: mut w } = adapter;
        let refuse = |why: String| EngineError::ModelLoad(format!("LoRA adapter {name:?}: {why}"));
        check_config(&config).map_err(refuse)?;
        if let Some(max) = max_rank.filter(|&max| config.r > max) {
            return Err(refuse(format!("its rank r={} is over max_lora_rank={max}; raise max_lora_rank to serve it", config.r)));
        }
        let fingerprint = {
            use sha2::{Digest, Sha256};
            let mut hasher = Sha256::new();
            hasher.update(format!("lora {name} {}\n", config.scaling()));
            hasher.update(w.digest());
            u64::from_le_bytes(hasher.finalize()[..8].try_into().expect("8 bytes"))
        };
        let r = config.r;
        let names = w.names();
        let text_layers = TEXT_LAYERS.into_iter().find(|layers| names.iter().any(|name| name.starts_with(layers))).unwrap_or(TEXT_LAYERS[0]);
        // What the weights update tells more than the module names that reach it.
        if let Some(fault) = misplaced(&names, text_layers, modules, cfg) {
            return Err(refuse(fault));
        }
        check_target_names(&config).map_err(refuse)?;
        let mut layers = Vec::with_capacity(modules.len());
        for (l, modules) in modules.iter().enumerate() {
            let mut layer: Vec<LoraLayer> = shards.iter().map(|_| LoraLayer::default()).collect();
            for module in modules {
                let prefix = format!("{text_layers}{l}.{}", module.path);
                let (a_name, b_name) = (format!("{prefix}.lora_A.weight"), format!("{prefix}.lora_B.weight"));
                if !w.contains(&a_name) && !w.contains(&b_name) {
                    continue;
                }
                let (out, inp) = module.shape;
                for (tensor, shape) in [(&a_name, [r, inp]), (&b_name, [out, r])] {
                    match w.shape(tensor) {
                        None => return Err(refuse(format!("it has {} without {tensor}", if tensor == &a_name { &b_name } else { &a_name }))),
                        Some(found) if found != shape => {
                            return Err(refuse(format!(
                                "{tensor} has shape {found:?}, but rank {r} over the base model's {} ({out} x {inp}) takes {shape:?}: \
                                 the adapter was made for another model (or its r disagrees with its weights)",
                                module.path
                            )))
                        }
                        Some(_) => {}
                    }
                }
                if let (LoraTarget::KvB, Some(shape)) = (module.target, &cfg.latent_attention) {
                    // Latent attention runs on one rank (its models refuse tp_size > 1), which holds every head.
                    let heads = cfg.num_attention_heads;
                    layer[0].absorbed_kv_b = Some(AbsorbedKvB::new(&w.read(&a_name)?, &w.read(&b_name)?, r, heads, shape, dtype, pool)?);
                }
                let a = LinearParts::new(w.take_matrix(&a_name, r, inp)?, None);
                let b = LinearParts::new(w.take_matrix(&b_name, out, r)?, None);
                let pack = |parts| Linear::fused(parts, dtype, None, pool);
                for (shard, layer) in shards.iter().zip(&mut layer) {
                    for (target, slice) in module.rank_slices(shard, cfg) {
                        let (a, b) = match slice {
                            RankSlice::BRows(rows) => (a.clone(), rows.into_iter().map(|rows| b.output_rows(rows)).collect()),
                            RankSlice::AColumns(columns) => (a.input_columns(columns, false), vec![b.clone()]),
                        };
                        layer.pairs[target as usize] = Some(LoraPair { a: pack(vec![a]), b: pack(b) });
                    }
                }
            }
            layers.push(layer);
        }
        if !w.is_empty() {
            let left = w.remaining_names();
            return Err(refuse(format!(
                "it has weights rsgl does not apply: {:?}; it applies updates of the projections of the base model's {} decoder layers",
                &left[..left.len().min(5)],
                modules.len()
            )));
        }
        if layers.iter().flatten().all(|layer| layer.pairs.iter().all(Option::is_none)) {
            return Err(refuse("its weights hold no lora_A / lora_B tensors".into()));
        }
        Ok(LoraAdapter { name, rank: r, scaling: config.scaling(), fingerprint, layers })
    }

    /// Rank `rank`'s updates of layer `l`.
    pub(super) fn layer(&self, rank: usize, l: usize) -> &LoraLayer {
        &self.layers[l][rank]
    }
}

/// Why an adapter of the tensors `names` is refused where some update what is not among the
/// model's projections (`modules`, each layer's, under `text_layers` in PEFT's names) but names a
/// part of the model: a vision tower, a recurrent layer, routed experts, a projection another
/// checkpoint of the layer would have (one such tensor named).
fn misplaced(names: &[&str], text_layers: &str, modules: &[Vec<LoraModule>], cfg: &ModelConfig) -> Option<String> {
    // A tensor's layer and module path in it.
    fn layer_module<'a>(name: &'a str, text_layers: &str) -> Option<(usize, &'a str)> {
        let (layer, module) = name.strip_prefix(text_layers)?.split_once('.')?;
        Some((layer.parse().ok()?, module.strip_suffix(".lora_A.weight").or_else(|| module.strip_suffix(".lora_B.weight"))?))
    }
    let vision = names.iter().find(|name| {
        let path = name.strip_prefix("base_model.model.").unwrap_or(name);
        let path = path.strip_prefix("model.").unwrap_or(path);
        VISION_PARTS.iter().any(|part| path.starts_with(part))
    });
    if let Some(name) = vision {
        return Some(format!(
            "it updates the vision tower or its projector ({name}), which rsgl does not apply adapters to; \
             it applies adapters of the language model's layers only (target_modules matching those alone)"
        ));
    }
    if let Some(name) = names
        .iter()
        .find(|name| layer_module(name, text_layers).is_some_and(|(_, module)| ["linear_attn.", "mamba."].iter().any(|mixer| module.starts_with(mixer))))
    {
        return Some(format!(
            "it updates a recurrent layer's projections ({name}), which rsgl does not apply adapters to; \
             in a hybrid model it applies those of the attention layers and of the MLPs"
        ));
    }
    if let Some(name) = names.iter().find(|name| layer_module(name, text_layers).is_some_and(|(_, module)| module.split('.').any(|part| part == "experts"))) {
        return Some(format!(
            "it updates routed experts ({name}), which rsgl does not apply adapters to; \
             in a mixture-of-experts model it applies those of the attention projections, dense MLPs and shared experts"
        ));
    }
    let (l, module, has) = names.iter().find_map(|name| {
        let (l, module) = layer_module(name, text_layers)?;
        let has = modules.get(l)?;
        (LAYER_MODULES.iter().any(|(path, _)| *path == module) && !has.iter().any(|known| known.path == module)).then_some((l, module, has))
    })?;
    let has: Vec<&str> = has.iter().map(|module| module.path).collect();
    Some(format!(
        "it updates {module} of layer {l}, which this {} model's layer {l} does not have; the projections adapters may update there are {has:?}",
        cfg.architecture
    ))
}

/// What in an adapter's config rsgl does not follow, if anything.
fn check_config(config: &PeftConfig) -> std::result::Result<(), String> {
    if let Some(kind) = config.peft_type.as_deref().filter(|kind| *kind != "LORA") {
        return Err(format!("its peft_type is {kind:?}; rsgl serves LORA adapters"));
    }
    if config.r == 0 {
        return Err("its rank r is 0".into());
    }
    if let Some(parameters) = config.target_parameters.as_ref().filter(|parameters| !parameters.is_empty()) {
        return Err(format!(
            "it updates parameters ({parameters:?}, target_parameters), such as routed experts' stacked weights, which rsgl does not apply adapters to; \
             in a mixture-of-experts model it applies those of the attention projections, dense MLPs and shared experts"
        ));
    }
    if config.use_dora {
        return Err("it is a DoRA adapter (use_dora), which rsgl does not apply yet".into());
    }
    if !config.rank_pattern.is_empty() || !config.alpha_pattern.is_empty() {
        return Err("it sets ranks or alphas per module (rank_pattern, alpha_pattern), which rsgl does not apply yet".into());
    }
    if config.modules_to_save.as_ref().is_some_and(|modules| !modules.is_empty()) {
        return Err("it replaces whole modules (modules_to_save), which rsgl does not apply yet".into());
    }
    if config.fan_in_fan_out {
        return Err("its weights are stored transposed (fan_in_fan_out, GPT-2's Conv1D), which rsgl does not read".into());
    }
    Ok(())
}

/// Whether `target_modules` names modules rsgl does not apply adapters to.
fn check_target_names(config: &PeftConfig) -> std::result::Result<(), String> {
    if let TargetModules::Names(names) = &config.target_modules {
        let mut handled: Vec<&str> = Vec::new();
        for (path, _) in LAYER_MODULES {
            let module = path.rsplit('.').next().expect("a module name");
            if !handled.contains(&module) {
                handled.push(module);
            }
        }
        let others: Vec<&String> = names.iter().filter(|name| !handled.contains(&name.as_str())).collect();
        if !others.is_empty() {
            return Err(format!("it targets {others:?}, which rsgl does not apply adapters to; it applies them to {handled:?}"));
        }
    }
    Ok(())
}

/// The rows of a step that use one adapter (runs of consecutive rows), and its updates of the
/// layer being run.
pub(super) struct LoraRows<'a> {
    pub runs: &'a [Range<usize>],
    pub scaling: f32,
    pub layer: &'a LoraLayer,
}

/// Adds each adapter's update of `target` to its rows of `out` (`[rows, width]`), in the columns
/// from `first` that the projection's outputs fill; `x` (`[rows, in]`) is the projection's input.
/// An adapter's rows are gathered into one GEMM pair (a row's result does not depend on the
/// others in it), and its deltas added back row by row.
pub(super) fn add_lora(c: &Compute, adapters: &[LoraRows], target: LoraTarget, x: &[f32], out: &mut [f32], width: usize, first: usize) {
    for rows in adapters {
        let Some(pair) = &rows.layer.pairs[target as usize] else { continue };
        let (inp, n) = (pair.a.weight_in_features(), pair.b.out_features());
        let input: Cow<[f32]> = match rows.runs {
            [run] => Cow::Borrowed(&x[run.start * inp..run.end * inp]),
            runs => Cow::Owned(runs.iter().flat_map(|run| &x[run.start * inp..run.end * inp]).copied().collect()),
        };
        let deltas = pair.b.forward(c, &pair.a.forward(c, &input));
        for (row, delta) in rows.runs.iter().flat_map(Range::clone).zip(deltas.chunks_exact(n)) {
            (c.kernels.axpy)(rows.scaling, delta, &mut out[row * width + first..row * width + first + n]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two layers of hidden size 8, 2 q heads and 1 kv head of 4, an MLP of 12.
    fn config() -> ModelConfig {
        serde_json::from_value(serde_json::json!({
            "architecture": "llama", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 12,
            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": null, "attention_bias": false,
            "qk_norm": false, "tie_word_embeddings": false, "max_position_embeddings": 16
        }))
        .expect("a tiny config")
    }

    fn peft_config(r: usize, extra: serde_json::Value) -> PeftConfig {
        let mut json = serde_json::json!({"peft_type": "LORA", "r": r, "lora_alpha": 8, "target_modules": ["k_proj", "down_proj"], "bias": "none"});
        json.as_object_mut().expect("an object").extend(extra.as_object().expect("an object").clone());
        serde_json::from_value(json).expect("an adapter config")
    }

    /// An adapter of rank `r` updating k and down in every layer, with the tensors `shapes` says
    /// (`(name, shape)`) in place of, or beside, the ones that fit.
    fn adapter(r: usize, config: PeftConfig, shapes: &[(&str, Vec<usize>)]) -> PeftAdapter {
        let mut weights = WeightStore::new();
        for l in 0..2 {
            let k = format!("base_model.model.model.layers.{l}.self_attn.k_proj");
            let down = format!("base_model.model.model.layers.{l}.mlp.down_proj");
            for (name, shape) in [(format!("{k}.lora_A.weight"), vec![r, 8]), (format!("{k}.lora_B.weight"), vec![4, r])] {
                weights.insert_random(&name, shape, 0.1, l as u64);
            }
            for (name, shape) in [(format!("{down}.lora_A.weight"), vec![r, 12]), (format!("{down}.lora_B.weight"), vec![8, r])] {
                weights.insert_random(&name, shape, 0.1, l as u64);
            }
        }
        for (name, shape) in shapes {
            weights.drop_prefixed(name);
            weights.insert_random(name, shape.clone(), 0.1, 9);
        }
        PeftAdapter { name: "ad".into(), config, weights }
    }

    /// The ranks a model of `cfg` splits over.
    fn shards(cfg: &ModelConfig, ranks: usize) -> Vec<Shard> {
        Shard::all(cfg.num_attention_heads, cfg.num_key_value_heads, cfg.vocab_size, ranks).expect("a split")
    }

    fn load(adapter: PeftAdapter, max_rank: Option<usize>) -> Result<LoraAdapter> {
        let cfg = config();
        LoraAdapter::from_peft(adapter, &cfg, &dense_modules(&cfg), &shards(&cfg, 1), WeightDtype::F32, max_rank, &ThreadPool::new(1, false))
    }

    fn refusal(adapter: PeftAdapter, max_rank: Option<usize>) -> String {
        match load(adapter, max_rank) {
            Err(EngineError::ModelLoad(message)) => message,
            Err(other) => panic!("not a load error: {other:?}"),
            Ok(_) => panic!("the adapter was accepted"),
        }
    }

    #[test]
    fn scaling_is_alpha_over_r_or_over_its_root_with_rslora() {
        assert_eq!(peft_config(4, serde_json::json!({})).scaling(), 2.0);
        assert_eq!(peft_config(4, serde_json::json!({"use_rslora": true})).scaling(), 4.0);
    }

    #[test]
    fn an_adapter_that_fits_loads_its_targets_only() {
        let loaded = load(adapter(2, peft_config(2, serde_json::json!({})), &[]), Some(2)).expect("it fits");
        assert_eq!((loaded.rank, loaded.scaling), (2, 4.0));
        for layer in loaded.layers.iter().flatten() {
            let targets: Vec<LoraTarget> = LoraTarget::ALL.into_iter().filter(|&t| layer.pairs[t as usize].is_some()).collect();
            assert_eq!(targets, [LoraTarget::K, LoraTarget::Down]);
        }
    }

    #[test]
    fn bad_adapters_are_refused_naming_the_adapter_and_the_fault() {
        let fits = || peft_config(2, serde_json::json!({}));
        let k_a = "base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight";
        let cases = [
            (adapter(4, peft_config(4, serde_json::json!({})), &[]), "r=4 is over max_lora_rank=2"),
            (adapter(2, fits(), &[(k_a, vec![2, 16])]), "made for another model"),
            (adapter(2, peft_config(1, serde_json::json!({})), &[]), "made for another model"),
            (adapter(2, fits(), &[("base_model.model.lm_head.lora_A.weight", vec![2, 8])]), "weights rsgl does not apply"),
            (adapter(2, fits(), &[("base_model.model.model.layers.2.self_attn.k_proj.lora_A.weight", vec![2, 8])]), "weights rsgl does not apply"),
            (adapter(2, peft_config(2, serde_json::json!({"target_modules": ["k_proj", "embed_tokens"]})), &[]), "targets [\"embed_tokens\"]"),
            (adapter(2, peft_config(2, serde_json::json!({"use_dora": true})), &[]), "DoRA"),
            (adapter(2, peft_config(2, serde_json::json!({"target_parameters": ["mlp.experts.gate_up_proj"]})), &[]), "routed experts' stacked weights"),
            (adapter(2, peft_config(2, serde_json::json!({"peft_type": "IA3"})), &[]), "LORA adapters"),
        ];
        for (bad, why) in cases {
            let message = refusal(bad, Some(2));
            assert!(message.starts_with("LoRA adapter \"ad\": ") && message.contains(why), "{message}");
        }
        let mut one_sided = adapter(2, fits(), &[]);
        one_sided.weights.drop_prefixed("base_model.model.model.layers.0.mlp.down_proj.lora_B");
        assert!(refusal(one_sided, None).contains("without base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"));
    }

    /// The projections `layer_modules` finds in a checkpoint of the tiny config's two layers whose
    /// layer tensors are `tensors` (`(path in the layer, shape)`), each in both layers.
    fn checkpoint_modules(tensors: &[(&str, [usize; 2])], mixer: LoraMixer) -> Vec<Vec<LoraModule>> {
        let mut w = WeightStore::new();
        for l in 0..2 {
            for (path, shape) in tensors {
                w.insert_random(&format!("model.layers.{l}.{path}.weight"), shape.to_vec(), 0.1, 0);
            }
            w.insert_random(&format!("model.layers.{l}.input_layernorm.weight"), vec![8], 0.1, 0);
        }
        (0..2).map(|l| layer_modules(&w, l, mixer)).collect()
    }

    /// An adapter of rank 2 with `modules` (`(path past base_model.model., (out, in))`) updated.
    fn adapter_of(modules: &[(&str, (usize, usize))]) -> PeftAdapter {
        let mut weights = WeightStore::new();
        for (i, (path, (out, inp))) in modules.iter().enumerate() {
            weights.insert_random(&format!("base_model.model.{path}.lora_A.weight"), vec![2, *inp], 0.1, i as u64);
            weights.insert_random(&format!("base_model.model.{path}.lora_B.weight"), vec![*out, 2], 0.1, i as u64 + 100);
        }
        let config = peft_config(2, serde_json::json!({"target_modules": ".*"}));
        PeftAdapter { name: "ad".into(), config, weights }
    }

    fn load_over(adapter: PeftAdapter, modules: &[Vec<LoraModule>]) -> Result<LoraAdapter> {
        let cfg = config();
        LoraAdapter::from_peft(adapter, &cfg, modules, &shards(&cfg, 1), WeightDtype::F32, None, &ThreadPool::new(1, false))
    }

    fn targets(loaded: &LoraAdapter, l: usize) -> Vec<LoraTarget> {
        LoraTarget::ALL.into_iter().filter(|&t| loaded.layer(0, l).pairs[t as usize].is_some()).collect()
    }

    #[test]
    fn a_checkpoints_fused_projections_take_fused_updates_and_only_those() {
        // Phi-3's layout: q|k|v (8 + 4 + 4) and gate|up (12 + 12) fused.
        let fused = [("self_attn.qkv_proj", [16, 8]), ("self_attn.o_proj", [8, 8]), ("mlp.gate_up_proj", [24, 8]), ("mlp.down_proj", [8, 12])];
        let modules = checkpoint_modules(&fused, LoraMixer::Attention);
        let paths: Vec<&str> = modules[1].iter().map(|module| module.path).collect();
        assert_eq!(paths, ["self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"]);
        let updates = [("model.layers.0.self_attn.qkv_proj", (16, 8)), ("model.layers.1.mlp.gate_up_proj", (24, 8)), ("model.layers.1.mlp.down_proj", (8, 12))];
        let loaded = load_over(adapter_of(&updates), &modules).expect("it fits");
        assert_eq!((targets(&loaded, 0), targets(&loaded, 1)), (vec![LoraTarget::Qkv], vec![LoraTarget::GateUp, LoraTarget::Down]));
        let refusal = |adapter, modules: &[Vec<LoraModule>]| match load_over(adapter, modules) {
            Err(EngineError::ModelLoad(message)) => message,
            _ => panic!("the adapter was not refused as a load error"),
        };
        // A separate projection over a fused checkpoint, and a fused one over separate projections.
        let message = refusal(adapter_of(&[("model.layers.0.self_attn.qkv_proj", (16, 8)), ("model.layers.1.self_attn.q_proj", (8, 8))]), &modules);
        assert!(message.contains("it updates self_attn.q_proj of layer 1, which this llama model's layer 1 does not have"), "{message}");
        let message = refusal(adapter_of(&[("model.layers.0.mlp.gate_up_proj", (24, 8))]), &dense_modules(&config()));
        assert!(message.contains("it updates mlp.gate_up_proj of layer 0, which this llama model's layer 0 does not have"), "{message}");
        let message = refusal(adapter_of(&[("model.layers.0.self_attn.qkv_proj", (12, 8))]), &modules);
        assert!(message.contains("qkv_proj.lora_B.weight has shape [12, 2]") && message.contains("another model"), "{message}");
    }

    #[test]
    fn layers_without_attention_or_with_experts_take_what_they_have() {
        // A recurrent layer's MLP, beside its mixer's projections.
        let recurrent = [("linear_attn.out_proj", [8, 8]), ("mlp.gate_proj", [12, 8]), ("mlp.up_proj", [12, 8]), ("mlp.down_proj", [8, 12])];
        let modules = checkpoint_modules(&recurrent, LoraMixer::Other);
        assert_eq!(modules[0].iter().map(|module| module.target).collect::<Vec<_>>(), [LoraTarget::Gate, LoraTarget::Up, LoraTarget::Down]);
        match load_over(adapter_of(&[("model.layers.0.mlp.up_proj", (12, 8)), ("model.layers.1.linear_attn.out_proj", (8, 8))]), &modules) {
            Err(EngineError::ModelLoad(message)) => {
                assert!(message.contains("it updates a recurrent layer's projections (base_model.model.model.layers.1.linear_attn.out_proj.lora_"), "{message}")
            }
            _ => panic!("an adapter of a recurrent layer was not refused"),
        }
        // Routed experts beside a shared expert of width 6.
        let moe =
            [("self_attn.o_proj", [8, 8]), ("mlp.experts.0.gate_proj", [4, 8]), ("mlp.shared_expert.up_proj", [6, 8]), ("mlp.shared_expert.down_proj", [8, 6])];
        let modules = checkpoint_modules(&moe, LoraMixer::Attention);
        let shared = load_over(adapter_of(&[("model.layers.1.mlp.shared_expert.down_proj", (8, 6))]), &modules).expect("it fits");
        assert_eq!(targets(&shared, 1), [LoraTarget::Down]);
        for experts in ["model.layers.1.mlp.experts.0.gate_proj", "model.layers.0.block_sparse_moe.experts.3.w1", "model.layers.0.mlp.experts"] {
            match load_over(adapter_of(&[("model.layers.1.self_attn.o_proj", (8, 8)), (experts, (4, 8))]), &modules) {
                Err(EngineError::ModelLoad(message)) => {
                    assert!(message.contains(&format!("it updates routed experts (base_model.model.{experts}.lora_")), "{message}")
                }
                _ => panic!("an adapter of routed experts was not refused"),
            }
        }
    }

    #[test]
    fn a_gated_attention_q_update_splits_into_the_q_rows_and_the_gates_rows() {
        // 2 heads of 4: q_proj's rows are head 0's q, its gate, head 1's q, its gate.
        let modules = checkpoint_modules(&[("self_attn.q_proj", [16, 8])], LoraMixer::GatedAttention { head_dim: 4 });
        let mut weights = WeightStore::new();
        let q = "base_model.model.model.layers.1.self_attn.q_proj";
        weights.insert(&format!("{q}.lora_A.weight"), vec![2, 8], vec![0.5; 16]).expect("A");
        weights.insert(&format!("{q}.lora_B.weight"), vec![16, 2], (0..32).map(|i| i as f32).collect()).expect("B");
        let adapter = PeftAdapter { name: "ad".into(), config: peft_config(2, serde_json::json!({"target_modules": ["q_proj"]})), weights };
        let loaded = load_over(adapter, &modules).expect("it fits");
        assert_eq!(targets(&loaded, 1), [LoraTarget::Q, LoraTarget::QGate]);
        let b_rows = |target: LoraTarget| -> Vec<f32> {
            let b = &loaded.layer(0, 1).pairs[target as usize].as_ref().expect("a pair").b;
            (0..b.out_features()).flat_map(|row| b.weight.row(row)).map(|value| value / 2.0).collect()
        };
        // B's values are 2 per row: row i holds 2i and 2i + 1.
        let rows = |rows: &[std::ops::Range<usize>]| -> Vec<f32> { rows.iter().cloned().flatten().flat_map(|row| [row as f32, row as f32 + 0.5]).collect() };
        assert_eq!(b_rows(LoraTarget::Q), rows(&[0..4, 8..12]));
        assert_eq!(b_rows(LoraTarget::QGate), rows(&[4..8, 12..16]));
    }

    /// An adapter of rank 2 updating `modules` (`(path past base_model.model., (out, in))`) whose
    /// A holds each column's index and B each row's, so a rank's slice shows which it holds.
    fn counting_adapter(modules: &[(&str, (usize, usize))]) -> PeftAdapter {
        let mut weights = WeightStore::new();
        for (path, (out, inp)) in modules {
            let a = (0..2 * inp).map(|i| (i % inp) as f32).collect();
            let b = (0..2 * out).map(|i| (i / 2) as f32).collect();
            weights.insert(&format!("base_model.model.{path}.lora_A.weight"), vec![2, *inp], a).expect("A");
            weights.insert(&format!("base_model.model.{path}.lora_B.weight"), vec![*out, 2], b).expect("B");
        }
        PeftAdapter { name: "ad".into(), config: peft_config(2, serde_json::json!({"target_modules": ".*"})), weights }
    }

    /// The columns of A and rows of B rank `rank` holds of a counting adapter's update of `target`
    /// in layer 0.
    fn held(loaded: &LoraAdapter, rank: usize, target: LoraTarget) -> (Vec<usize>, Vec<usize>) {
        let pair = loaded.layer(rank, 0).pairs[target as usize].as_ref().expect("a pair");
        let a_columns = pair.a.weight.row(0).into_iter().map(|column| column as usize).collect();
        (a_columns, (0..pair.b.out_features()).map(|row| pair.b.weight.row(row)[0] as usize).collect())
    }

    fn indices(ranges: &[Range<usize>]) -> Vec<usize> {
        ranges.iter().cloned().flatten().collect()
    }

    #[test]
    fn each_rank_holds_the_slice_of_an_update_its_shard_of_the_base_weight_takes() {
        // 4 q heads and 2 kv heads of 2, an MLP of 12, over 2 ranks: rank 1 holds q heads 2 and
        // 3, kv head 1 and the MLP's columns 6..12.
        let mut cfg = config();
        (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) = (4, 2, 2);
        let pack = |adapter, modules: &[Vec<LoraModule>]| {
            LoraAdapter::from_peft(adapter, &cfg, modules, &shards(&cfg, 2), WeightDtype::F32, None, &ThreadPool::new(1, false)).expect("it fits")
        };
        // Phi-3's layout: q|k|v (8 + 4 + 4) and gate|up (12 + 12) fused.
        let fused = [("self_attn.qkv_proj", [16, 8]), ("self_attn.o_proj", [8, 8]), ("mlp.gate_up_proj", [24, 8]), ("mlp.down_proj", [8, 12])];
        let updates = [
            ("model.layers.0.self_attn.qkv_proj", (16, 8)),
            ("model.layers.0.self_attn.o_proj", (8, 8)),
            ("model.layers.0.mlp.gate_up_proj", (24, 8)),
            ("model.layers.0.mlp.down_proj", (8, 12)),
        ];
        let loaded = pack(counting_adapter(&updates), &checkpoint_modules(&fused, LoraMixer::Attention));
        let span = |range: Range<usize>| range.collect::<Vec<_>>();
        let whole = |n: usize| span(0..n);
        // Split by output rows: A whole, B's rows of the rank's q, k and v heads, or MLP columns.
        assert_eq!(held(&loaded, 0, LoraTarget::Qkv), (whole(8), indices(&[0..4, 8..10, 12..14])));
        assert_eq!(held(&loaded, 1, LoraTarget::Qkv), (whole(8), indices(&[4..8, 10..12, 14..16])));
        assert_eq!(held(&loaded, 0, LoraTarget::GateUp), (whole(8), indices(&[0..6, 12..18])));
        assert_eq!(held(&loaded, 1, LoraTarget::GateUp), (whole(8), indices(&[6..12, 18..24])));
        // Split by input columns: A's columns of the rank's heads or MLP columns, B whole.
        assert_eq!(held(&loaded, 0, LoraTarget::O), (whole(4), whole(8)));
        assert_eq!(held(&loaded, 1, LoraTarget::O), (span(4..8), whole(8)));
        assert_eq!(held(&loaded, 0, LoraTarget::Down), (whole(6), whole(8)));
        assert_eq!(held(&loaded, 1, LoraTarget::Down), (span(6..12), whole(8)));
        // Gated attention: q_proj's rows are each head's q, then its gate.
        let gated = checkpoint_modules(&[("self_attn.q_proj", [16, 8]), ("self_attn.k_proj", [4, 8])], LoraMixer::GatedAttention { head_dim: 2 });
        let loaded = pack(counting_adapter(&[("model.layers.0.self_attn.q_proj", (16, 8)), ("model.layers.0.self_attn.k_proj", (4, 8))]), &gated);
        assert_eq!(held(&loaded, 1, LoraTarget::Q).1, indices(&[8..10, 12..14]));
        assert_eq!(held(&loaded, 1, LoraTarget::QGate).1, indices(&[10..12, 14..16]));
        assert_eq!(held(&loaded, 0, LoraTarget::QGate).1, indices(&[2..4, 6..8]));
        assert_eq!(held(&loaded, 1, LoraTarget::K), (whole(8), span(2..4)));
    }

    /// The tiny config with latent attention: its 2 heads' q of 3 + 2 (rope) through a rank of 6, a latent of 4, values of 3.
    fn latent_config() -> ModelConfig {
        let shape = LatentShape { q_lora_rank: Some(6), kv_lora_rank: 4, qk_nope_head_dim: 3, qk_rope_head_dim: 2, v_head_dim: 3 };
        ModelConfig { latent_attention: Some(shape), ..config() }
    }

    #[test]
    fn latent_attention_layers_take_updates_of_their_projections_kv_b_proj_in_the_absorbed_form_too() {
        let attention = [
            ("self_attn.q_a_proj", vec![6, 8]),
            ("self_attn.q_b_proj", vec![10, 6]),
            ("self_attn.kv_a_proj_with_mqa", vec![6, 8]),
            ("self_attn.o_proj", vec![8, 6]),
            ("mlp.shared_experts.down_proj", vec![8, 12]),
            ("mlp.experts.0.down_proj", vec![8, 4]),
        ];
        // Layer 0's kv_b_proj as a Hugging Face checkpoint holds it; layer 1's split per head as a GGUF file holds it.
        let kv_b_layouts = [vec![("self_attn.kv_b_proj", vec![12, 4])], vec![("self_attn.k_b_proj", vec![2, 4, 3]), ("self_attn.v_b_proj", vec![2, 3, 4])]];
        let mut w = WeightStore::new();
        for (l, kv_b) in kv_b_layouts.iter().enumerate() {
            for (path, shape) in attention.iter().chain(kv_b) {
                w.insert_random(&format!("model.layers.{l}.{path}.weight"), shape.clone(), 0.1, 0);
            }
        }
        let modules: Vec<Vec<LoraModule>> = (0..2).map(|l| layer_modules(&w, l, LoraMixer::LatentAttention)).collect();
        let paths: Vec<(&str, (usize, usize))> = modules[1].iter().map(|module| (module.path, module.shape)).collect();
        assert_eq!(
            paths,
            [
                ("self_attn.o_proj", (8, 6)),
                ("self_attn.q_a_proj", (6, 8)),
                ("self_attn.q_b_proj", (10, 6)),
                ("self_attn.kv_a_proj_with_mqa", (6, 8)),
                ("self_attn.kv_b_proj", (12, 4)),
                ("mlp.shared_experts.down_proj", (8, 12)),
            ]
        );
        let cfg = latent_config();
        let kv_b = "model.layers.1.self_attn.kv_b_proj";
        let updates = [("model.layers.0.self_attn.q_a_proj", (6, 8)), ("model.layers.0.self_attn.q_b_proj", (10, 6)), (kv_b, (12, 4))];
        let adapter = adapter_of(&[("model.layers.0.self_attn.kv_a_proj_with_mqa", (6, 8)), ("model.layers.0.self_attn.o_proj", (8, 6))]);
        let pool = ThreadPool::new(1, false);
        let loaded = LoraAdapter::from_peft(adapter, &cfg, &modules, &shards(&cfg, 1), WeightDtype::F32, None, &pool).expect("it fits");
        assert_eq!(targets(&loaded, 0), [LoraTarget::O, LoraTarget::KvA]);
        let adapter = adapter_of(&updates);
        let [a, b] = ["A", "B"].map(|matrix| adapter.weights.read(&format!("base_model.model.{kv_b}.lora_{matrix}.weight")).expect("a tensor"));
        let loaded = LoraAdapter::from_peft(adapter, &cfg, &modules, &shards(&cfg, 1), WeightDtype::F32, None, &pool).expect("it fits");
        assert_eq!((targets(&loaded, 0), targets(&loaded, 1)), (vec![LoraTarget::QA, LoraTarget::QB], vec![LoraTarget::KvB]));
        assert!(loaded.layer(0, 0).absorbed_kv_b().is_none());
        // Head h's key update B_k·A (`[3, 4]`) and value update B_v·A (`[3, 4]`), from B's rows 6h.. and 6h + 3..
        let (r, lat) = (2, 4);
        let update = |first_row: usize| -> Vec<Vec<f32>> {
            (first_row..first_row + 3).map(|row| (0..lat).map(|col| (0..r).map(|k| b[row * r + k] * a[k * lat + col]).sum()).collect()).collect()
        };
        let (a_matrix, absorbed) = loaded.layer(0, 1).absorbed_kv_b().expect("a kv_b_proj update");
        let c = Compute::new(ThreadPool::new(1, false), Default::default());
        let (q_nope, latent) = ([0.3, -1.2, 0.7], [0.5, -0.25, 1.5, -2.0]);
        for head in 0..2 {
            let (keys, values) = (update(6 * head), update(6 * head + 3));
            let want_q: Vec<f32> = (0..lat).map(|col| (0..3).map(|i| keys[i][col] * q_nope[i]).sum()).collect();
            let got_q = absorbed.a_t.forward(&c, &absorbed.key_b_t[head].forward(&c, &q_nope));
            let want_value: Vec<f32> = values.iter().map(|row| row.iter().zip(&latent).map(|(w, x)| w * x).sum()).collect();
            let got_value = absorbed.value_b[head].forward(&c, &a_matrix.forward(&c, &latent));
            for (got, want) in got_q.iter().zip(&want_q).chain(got_value.iter().zip(&want_value)) {
                assert!((got - want).abs() < 1e-5, "head {head}: {got_q:?} vs {want_q:?}, {got_value:?} vs {want_value:?}");
            }
        }
    }

    #[test]
    fn a_vision_language_models_text_layers_take_updates_and_its_vision_tower_does_not() {
        let modules = dense_modules(&config());
        for text_layers in ["model.language_model.layers", "language_model.model.layers", "model.text_model.layers"] {
            let updates = [(format!("{text_layers}.1.self_attn.k_proj"), (4, 8)), (format!("{text_layers}.0.mlp.down_proj"), (8, 12))];
            let loaded = load_over(adapter_of(&updates.iter().map(|(path, shape)| (path.as_str(), *shape)).collect::<Vec<_>>()), &modules).expect("it fits");
            assert_eq!((targets(&loaded, 0), targets(&loaded, 1)), (vec![LoraTarget::Down], vec![LoraTarget::K]), "{text_layers}");
        }
        for tower in [
            "model.vision_model.encoder.layers.0.self_attn.q_proj",
            "model.visual.blocks.0.mlp.gate_proj",
            "model.vision_tower.vision_model.encoder.layers.1.mlp.fc1",
        ] {
            match load_over(adapter_of(&[("model.language_model.layers.0.self_attn.k_proj", (4, 8)), (tower, (8, 8))]), &modules) {
                Err(EngineError::ModelLoad(message)) => {
                    assert!(message.contains(&format!("it updates the vision tower or its projector (base_model.model.{tower}.lora_")), "{message}")
                }
                _ => panic!("an adapter of the vision tower was not refused"),
            }
        }
    }

    /// A GGUF LoRA file as llama.cpp's convert_lora_to_gguf.py writes one with `metadata` over the
    /// adapter's: layer 0's k update (A `[r, 8]`, B `[4, r]` with its rows permuted as llama's k
    /// rows are) and layer 1's down update (A `[r, 12]`, B `[8, r]`), tensors of rank `r`.
    fn gguf_file(label: &str, r: usize, metadata: serde_json::Value) -> (crate::weights::tests::TempFile, Vec<f32>) {
        use crate::weights::tests::{gguf_with_metadata, interleave_heads, TempFile};
        let mut all = serde_json::json!({"general.architecture": "llama", "general.type": "adapter", "adapter.type": "lora", "adapter.lora.alpha": 6.0});
        all.as_object_mut().expect("an object").extend(metadata.as_object().expect("an object").clone());
        let values = |count: usize, first: f32| (0..count).map(|i| first + i as f32).collect::<Vec<f32>>();
        let bytes = |values: &[f32]| values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
        let k_b = values(4 * r, 100.0);
        let permuted: Vec<f32> = interleave_heads(&k_b.chunks(r).map(<[f32]>::to_vec).collect::<Vec<_>>(), 4).concat();
        let r64 = r as u64;
        let tensors = [
            ("blk.0.attn_k.weight.lora_a", vec![8, r64], 0, bytes(&values(8 * r, 0.0))),
            ("blk.0.attn_k.weight.lora_b", vec![r64, 4], 0, bytes(&permuted)),
            ("blk.1.ffn_down.weight.lora_a", vec![12, 2], 0, bytes(&values(12 * 2, 200.0))),
            ("blk.1.ffn_down.weight.lora_b", vec![2, 8], 0, bytes(&values(8 * 2, 300.0))),
        ];
        (TempFile::new(&format!("lora-{label}.gguf"), &gguf_with_metadata(all.as_object().expect("an object"), &tensors)), k_b)
    }

    fn gguf_refusal(file: &std::path::Path) -> String {
        match PeftAdapter::from_gguf("ad".into(), file, &config()) {
            Err(EngineError::ModelLoad(message)) => message,
            Err(other) => panic!("not a load error: {other:?}"),
            Ok(_) => panic!("the file was accepted"),
        }
    }

    #[test]
    fn a_gguf_lora_file_reads_as_the_peft_adapter_it_was_made_from() {
        let (file, k_b) = gguf_file("fits", 2, serde_json::json!({}));
        let adapter = PeftAdapter::from_gguf("ad".into(), &file.0, &config()).expect("a LoRA file for the model");
        let TargetModules::Names(targets) = &adapter.config.target_modules else { panic!("target modules by name") };
        assert_eq!((adapter.config.r, adapter.config.scaling(), &targets[..]), (2, 3.0, &["down_proj".to_string(), "k_proj".to_string()][..]));
        let k = "base_model.model.model.layers.0.self_attn.k_proj";
        assert_eq!(adapter.weights.shape(&format!("{k}.lora_A.weight")), Some(&[2, 8][..]));
        assert_eq!(adapter.weights.read(&format!("{k}.lora_B.weight")).expect("B"), k_b, "the k rows read back in order");
        let loaded = load(adapter, None).expect("it fits");
        let targets = |l: usize| LoraTarget::ALL.into_iter().filter(|&t| loaded.layer(0, l).pairs[t as usize].is_some()).collect::<Vec<_>>();
        assert_eq!((targets(0), targets(1)), (vec![LoraTarget::K], vec![LoraTarget::Down]));
        // llama.cpp scales an adapter with alpha 0 by 1.
        let (file, _) = gguf_file("no-alpha", 2, serde_json::json!({"adapter.lora.alpha": 0.0}));
        assert_eq!(PeftAdapter::from_gguf("ad".into(), &file.0, &config()).expect("it fits").config.scaling(), 1.0);
    }

    #[test]
    fn gguf_files_that_are_not_lora_adapters_for_the_model_are_refused_naming_the_file() {
        let cases = [
            ("model", 2, serde_json::json!({"general.type": "model"}), "is not a LoRA adapter but a \"model\" file"),
            ("control", 2, serde_json::json!({"adapter.type": "control_vector"}), "is not a LoRA adapter but a \"control_vector\" adapter"),
            ("qwen3", 2, serde_json::json!({"general.architecture": "qwen3"}), "was made for a \"qwen3\" model, but the base model is a llama"),
            ("ranks", 4, serde_json::json!({}), "several ranks ({2, 4})"),
            ("alora", 2, serde_json::json!({"adapter.alora.invocation_tokens": "1"}), "activated LoRA"),
        ];
        for (label, r, metadata, why) in cases {
            let (file, _) = gguf_file(label, r, metadata);
            let message = gguf_refusal(&file.0);
            assert!(message.starts_with(&format!("LoRA adapter \"ad\": {}", file.0.display())) && message.contains(why), "{message}");
        }
        let not_gguf = crate::weights::tests::TempFile::new("lora-not-gguf.gguf", b"not a GGUF file");
        assert!(gguf_refusal(&not_gguf.0).contains("not a GGUF file"));
    }
}
