//! A GGUF file's tensors as the Hugging Face checkpoint of the same model names and lays them
//! out: llama.cpp's names mapped back, its dimensions (innermost first) reversed, the stacked
//! experts of a mixture-of-experts layer split per expert, the rotary halves its converter
//! interleaves in llama q/k heads read back in order, and the multi-token prediction layers it
//! appends (Qwen3.5, Qwen3-Next), which rsgl does not read yet, left out. A projector file
//! (`mmproj-*.gguf`: a vision-language model's image encoder, which llama.cpp keeps apart) is
//! named as the Hugging Face checkpoint of its type names its vision tower and connector.

use super::ggml::GgmlType;
use super::gguf::{read_directory, GgufDirectory, GgufTensorInfo};
use super::mapped::MappedFile;
use crate::config::Architecture;
use crate::error::{EngineError, Result};
use crate::model::archs::Assembly;
use serde_json::{Map, Value};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// Architectures whose q/k rows llama.cpp's converter permutes: those its `LlamaModel` class
/// converts (SmolLM3, Granite and Ministral 3 subclass it); qwen, phi3, gemma and olmo2 files are
/// not permuted.
const INTERLEAVED_ARCHITECTURES: &[&str] = &["llama", "mistral", "mixtral", "smollm3", "granite", "ministral3"];

/// Architectures whose `ffn_up` stacks each gate's rows before the up projection's: the Hugging
/// Face checkpoint's `gate_up_proj`.
const FUSED_GATE_UP_ARCHITECTURES: &[&str] = &["phi3", "glm4"];

/// Architectures whose checkpoints name their (ungated) shared experts `shared_experts`, as PEFT
/// adapters of them do; the others' shared expert is `shared_expert`.
const SHARED_EXPERTS_ARCHITECTURES: &[&str] = &["deepseek_v2", "deepseek_v3", "glm4_moe"];

const GLOBAL_TENSORS: &[(&str, &str)] = &[("token_embd", "model.embed_tokens"), ("output_norm", "model.norm"), ("output", "lm_head")];
const LAYER_TENSORS: &[(&str, &str)] = &[
    ("attn_qkv", "self_attn.qkv_proj"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("attn_q_norm", "self_attn.q_norm"),
    ("attn_k_norm", "self_attn.k_norm"),
    // Latent attention (llama.cpp's deepseek2).
    ("attn_q_a", "self_attn.q_a_proj"),
    ("attn_q_a_norm", "self_attn.q_a_layernorm"),
    ("attn_q_b", "self_attn.q_b_proj"),
    ("attn_kv_a_mqa", "self_attn.kv_a_proj_with_mqa"),
    ("attn_kv_a_norm", "self_attn.kv_a_layernorm"),
    ("attn_kv_b", "self_attn.kv_b_proj"),
    ("attn_k_b", "self_attn.k_b_proj"),
    ("attn_v_b", "self_attn.v_b_proj"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
];
/// Stacked expert tensors (weights `[experts, rows, cols]`, biases `[experts, rows]`) and which
/// SwiGLU matrix each holds (0 gate, 1 up, 2 down).
const EXPERT_TENSORS: &[(&str, usize)] = &[("ffn_gate_exps", 0), ("ffn_up_exps", 1), ("ffn_down_exps", 2)];
/// Layer tensors that are parameters of a Hugging Face module, not modules with a weight, by
/// their GGUF names past `blk.N.`: the converter adds `.weight` to some, and stores Gated
/// DeltaNet's `A_log` as `ssm_a`, `-exp(A_log)`, which the layer reads as `A`, and DeepSeek's
/// router's choice bias as `exp_probs_b`.
const LAYER_PARAMETERS: &[(&str, &str)] = &[
    ("attn_sinks.weight", "self_attn.sinks"),
    ("ssm_a", "linear_attn.A"),
    ("ssm_dt.bias", "linear_attn.dt_bias"),
    ("exp_probs_b.bias", "mlp.gate.e_score_correction_bias"),
];
/// A Gated DeltaNet layer's modules (`linear_attn`). The converter splits Qwen3-Next's
/// `in_proj_qkvz` into Qwen3.5's `in_proj_qkv` and `in_proj_z` (`attn_qkv`, `attn_gate`: names
/// of attention modules elsewhere), and squeezes the convolution's weight to `[channels, taps]`.
const DELTA_NET_TENSORS: &[(&str, &str)] = &[
    ("attn_qkv", "in_proj_qkv"),
    ("attn_gate", "in_proj_z"),
    ("ssm_ba", "in_proj_ba"),
    ("ssm_beta", "in_proj_b"),
    ("ssm_alpha", "in_proj_a"),
    ("ssm_conv1d", "conv1d"),
    ("ssm_norm", "norm"),
    ("ssm_out", "out_proj"),
];
const SHARED_EXPERT_TENSORS: &[(&str, &str)] = &[
    ("ffn_gate_shexp", "shared_expert.gate_proj"),
    ("ffn_up_shexp", "shared_expert.up_proj"),
    ("ffn_down_shexp", "shared_expert.down_proj"),
    ("ffn_gate_inp_shexp", "shared_expert_gate"),
];

/// How llama.cpp's projector files of one type (`clip.projector_type`) name the tensors of the
/// Hugging Face checkpoint's vision tower and connector.
struct ProjectorNames {
    /// Tensors outside the layers, by their GGUF names up to the last `.`.
    outside: &'static [(&'static str, &'static str)],
    /// Where the checkpoint keeps layer N's modules (`v.blk.N.`): this, then N.
    layers: &'static str,
    /// A layer's modules, by their GGUF names past `v.blk.N.`.
    layer: &'static [(&'static str, &'static str)],
    /// Tensors that are parameters of a Hugging Face module, not modules with a weight, by their
    /// whole GGUF names.
    parameters: &'static [(&'static str, &'static str)],
    /// Tensors the converter cuts into pieces along one dimension: the checkpoint's name, the
    /// pieces' GGUF names, and the dimension they are stacked back along.
    stacked: &'static [(&'static str, &'static [&'static str], usize)],
}

/// SmolVLM's and Idefics3's (`idefics3`) and Gemma 3's (`gemma3`; rsgl names its SigLIP tower
/// as SmolVLM's), with their projectors'.
const SIGLIP_NAMES: ProjectorNames = ProjectorNames {
    outside: &[
        ("v.patch_embd", "model.vision_model.embeddings.patch_embedding"),
        ("v.position_embd", "model.vision_model.embeddings.position_embedding"),
        ("v.post_ln", "model.vision_model.post_layernorm"),
        ("mm.model.fc", "model.connector.modality_projection.proj"),
        ("mm.soft_emb_norm", "model.multi_modal_projector.mm_soft_emb_norm"),
    ],
    layers: "model.vision_model.encoder.layers.",
    layer: &[
        ("attn_q", "self_attn.q_proj"),
        ("attn_k", "self_attn.k_proj"),
        ("attn_v", "self_attn.v_proj"),
        ("attn_out", "self_attn.out_proj"),
        ("ln1", "layer_norm1"),
        ("ln2", "layer_norm2"),
        ("ffn_up", "mlp.fc1"),
        ("ffn_down", "mlp.fc2"),
    ],
    parameters: &[("mm.input_projection.weight", "model.multi_modal_projector.mm_input_projection_weight")],
    stacked: &[],
};

/// Qwen2.5-VL's (`qwen2.5vl_merger`). The converter cuts the 3D patch convolution into the 2D
/// ones of its two frames, and each block's fused `attn.qkv` into q, k and v (which the tower
/// also takes apart, under llama.cpp's names for them).
const QWEN2_5_VL_NAMES: ProjectorNames = ProjectorNames {
    outside: &[("v.post_ln", "visual.merger.ln_q"), ("mm.0", "visual.merger.mlp.0"), ("mm.2", "visual.merger.mlp.2")],
    layers: "visual.blocks.",
    layer: &[
        ("attn_q", "attn.q"),
        ("attn_k", "attn.k"),
        ("attn_v", "attn.v"),
        ("attn_out", "attn.proj"),
        ("ln1", "norm1"),
        ("ln2", "norm2"),
        ("ffn_gate", "mlp.gate_proj"),
        ("ffn_up", "mlp.up_proj"),
        ("ffn_down", "mlp.down_proj"),
    ],
    parameters: &[],
    stacked: &[("visual.patch_embed.proj.weight", &["v.patch_embd.weight", "v.patch_embd.weight.1"], 2)],
};

/// The names of the projector type `kind`; None for a type rsgl does not read.
fn projector_names(kind: &str) -> Option<&'static ProjectorNames> {
    match kind {
        "idefics3" | "gemma3" => Some(&SIGLIP_NAMES),
        "qwen2.5vl_merger" => Some(&QWEN2_5_VL_NAMES),
        _ => None,
    }
}

/// The Hugging Face name of a layer's norm llama.cpp calls `base`, by where it sits: `ffn_norm`
/// is a Llama's `post_attention_layernorm` and a Gemma's `pre_feedforward_layernorm`;
/// `post_attention_norm` follows the attention, as its output's norm (Gemma, OLMo 2) or, in a
/// block without one, as the MLP's pre-norm (llama.cpp's name for gpt-oss's).
fn norm_name(assembly: &Assembly, base: &str) -> Option<&'static str> {
    match base {
        "attn_norm" => assembly.attention.pre,
        "post_attention_norm" => assembly.attention.post.or(assembly.mlp.pre),
        "ffn_norm" => assembly.mlp.pre,
        "post_ffw_norm" => assembly.mlp.post,
        _ => None,
    }
}

/// One tensor in Hugging Face terms.
pub struct HfTensor {
    pub name: String,
    /// Outermost first.
    pub shape: Vec<usize>,
    pub kind: GgmlType,
    /// Byte offset of its first row in the file.
    pub offset: usize,
    /// Set for q/k projections whose heads interleave their rotary halves.
    pub interleaved_head_dim: Option<usize>,
}

/// The tensor directory and metadata of a mapped GGUF file.
pub fn directory(file: &MappedFile) -> Result<GgufDirectory> {
    read_directory(file.bytes())
        .map_err(|e| EngineError::ModelLoad(format!("{} is corrupt, truncated or not a GGUF file ({e}); download it again", file.path.display())))
}

/// The files of one model: `[path]` for a whole file; every shard in order for a file llama.cpp's
/// gguf-split cut into `NAME-00001-of-00003.gguf`, `NAME-00002-of-00003.gguf`, ..., whichever
/// shard `path` names (the first holds the metadata).
pub fn shard_paths(path: &Path) -> Result<Vec<PathBuf>> {
    let Some((stem, count)) = path.file_name().and_then(|name| name.to_str()).and_then(shard_name) else {
        return Ok(vec![path.to_path_buf()]);
    };
    let shards: Vec<PathBuf> = (1..=count).map(|index| path.with_file_name(format!("{stem}-{index:05}-of-{count:05}.gguf"))).collect();
    if let Some(missing) = shards.iter().find(|shard| !shard.is_file()) {
        return Err(EngineError::ModelLoad(format!(
            "{} is one of {count} shards, but {} is not beside it; download every shard of the model",
            path.display(),
            missing.display()
        )));
    }
    Ok(shards)
}

/// The module of a layer's MLP block that the shared-expert tensor `base` (`ffn_up_shexp`, ...)
/// belongs to, as `architecture`'s checkpoints name it; None for other tensors.
fn shared_expert_module(base: &str, architecture: &str) -> Option<String> {
    let module = lookup(SHARED_EXPERT_TENSORS, base)?;
    Some(match module.strip_prefix("shared_expert.").filter(|_| SHARED_EXPERTS_ARCHITECTURES.contains(&architecture)) {
        Some(projection) => format!("shared_experts.{projection}"),
        None => module.to_string(),
    })
}

/// "NAME-00002-of-00003.gguf" -> ("NAME", 3); None for a name of another form.
fn shard_name(name: &str) -> Option<(&str, usize)> {
    let (rest, count) = name.strip_suffix(".gguf")?.rsplit_once("-of-")?;
    let (stem, index) = rest.rsplit_once('-')?;
    let number = |text: &str| text.len().eq(&5).then(|| text.parse::<usize>().ok()).flatten();
    let (index, count) = (number(index)?, number(count)?);
    (1..=count).contains(&index).then_some((stem, count))
}

pub fn hf_tensors(file: &MappedFile, architecture: &str, heads: usize, kv_heads: usize) -> Result<Vec<HfTensor>> {
    let path = file.path.display();
    let directory = directory(file)?;
    let assembly = Architecture::named(architecture).expect("a GGUF file's architecture is a known one").assembly;
    let interleaved = INTERLEAVED_ARCHITECTURES.contains(&architecture);
    let mixtral = architecture == "mixtral";
    let fused_gate_up = FUSED_GATE_UP_ARCHITECTURES.contains(&architecture);
    let layers = model_layers(&directory.metadata);
    // Layers with `ssm_*` tensors are Gated DeltaNet layers.
    let delta_net_layers: HashSet<usize> =
        directory.tensors.iter().filter_map(split_name).filter(|(_, base, _)| base.starts_with("ssm_")).filter_map(|(layer, _, _)| layer).collect();
    let mut tensors = Vec::new();
    for info in &directory.tensors {
        let kind = known_type(file, info)?;
        // The directory checked that rows are whole blocks.
        let mut shape: Vec<usize> = info.dims.iter().rev().map(|&d| d as usize).collect();
        let tensor =
            |name: String, shape: Vec<usize>, offset: usize, head_dim: Option<usize>| HfTensor { name, shape, kind, offset, interleaved_head_dim: head_dim };
        let Some((layer, base, suffix)) = split_name(info) else {
            tensors.push(tensor(info.name.clone(), shape, info.data.start, None));
            continue;
        };
        let Some(layer) = layer else {
            let name = lookup(GLOBAL_TENSORS, base).map_or_else(|| info.name.clone(), |hf| format!("{hf}.{suffix}"));
            tensors.push(tensor(name, shape, info.data.start, None));
            continue;
        };
        if layers.is_some_and(|layers| layer >= layers) {
            continue;
        }
        let block = format!("model.layers.{layer}.{}", if mixtral { "block_sparse_moe" } else { "mlp" });
        if let Some(&(_, matrix)) = EXPERT_TENSORS.iter().find(|(gguf, _)| *gguf == base) {
            let names = if mixtral { ["w1", "w3", "w2"] } else { ["gate_proj", "up_proj", "down_proj"] };
            let (&experts, each) = shape.split_first().filter(|(_, each)| matches!(each.len(), 1 | 2)).ok_or_else(|| {
                EngineError::ModelLoad(format!("{path}: expert tensor {} has shape {shape:?}, not [experts, rows, cols] or [experts, rows]", info.name))
            })?;
            let (&cols, rows) = each.split_last().expect("one or two dimensions");
            let expert_bytes = rows.iter().product::<usize>() * kind.row_bytes(cols).expect("whole blocks");
            for expert in 0..experts {
                let name = format!("{block}.experts.{expert}.{}.{suffix}", names[matrix]);
                tensors.push(tensor(name, each.to_vec(), info.data.start + expert * expert_bytes, None));
            }
            continue;
        }
        let tail = if suffix.is_empty() { base.to_string() } else { format!("{base}.{suffix}") };
        if let Some(parameter) = lookup(LAYER_PARAMETERS, &tail) {
            tensors.push(tensor(format!("model.layers.{layer}.{parameter}"), shape, info.data.start, None));
            continue;
        }
        if base == "ssm_in" && delta_net_layers.contains(&layer) {
            return Err(EngineError::UnsupportedModel(format!(
                "{path}: {} holds a Gated DeltaNet's input projections in one tensor, a layout of earlier llama.cpp converters that rsgl does not read; convert the model again with a current convert_hf_to_gguf.py, or load its Hugging Face folder",
                info.name
            )));
        }
        if let Some(module) = lookup(DELTA_NET_TENSORS, base).filter(|_| delta_net_layers.contains(&layer)) {
            if let [channels, taps] = shape[..] {
                if module == "conv1d" {
                    shape = vec![channels, 1, taps];
                }
            }
            tensors.push(tensor(format!("model.layers.{layer}.linear_attn.{module}.{suffix}"), shape, info.data.start, None));
            continue;
        }
        let module = match base {
            "ffn_gate_inp" => Some(format!("{block}.gate")),
            "ffn_up" if fused_gate_up => Some(format!("{block}.gate_up_proj")),
            _ => shared_expert_module(base, architecture)
                .map(|m| format!("{block}.{m}"))
                .or_else(|| lookup(LAYER_TENSORS, base).or_else(|| norm_name(&assembly, base)).map(|m| format!("model.layers.{layer}.{m}"))),
        };
        let Some(module) = module else {
            tensors.push(tensor(info.name.clone(), shape, info.data.start, None));
            continue;
        };
        let head_count = match base {
            "attn_q" if interleaved => Some(heads),
            "attn_k" if interleaved => Some(kv_heads),
            _ => None,
        };
        let head_dim = head_count.filter(|_| suffix == "weight").map(|h| shape[0] / h.max(1));
        tensors.push(tensor(format!("{module}.{suffix}"), shape, info.data.start, head_dim));
    }
    Ok(tensors)
}

/// The tensors of a GGUF LoRA adapter file (llama.cpp's `convert_lora_to_gguf.py`), named as the
/// PEFT adapter it was made from names them: a layer's `blk.N.attn_q.weight.lora_a` and
/// `.lora_b` are `base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight` and
/// `.lora_B.weight`, A `[r, in]` and B `[out, r]` once the dimensions (innermost first) are
/// reversed. The converter permutes the B rows of llama q/k updates as it does the base model's
/// q/k rows; they are read back in order as those are. Other tensors keep their GGUF names.
pub fn lora_tensors(file: &MappedFile, architecture: &str, heads: usize, kv_heads: usize) -> Result<Vec<HfTensor>> {
    let directory = directory(file)?;
    let interleaved = INTERLEAVED_ARCHITECTURES.contains(&architecture);
    let fused_gate_up = FUSED_GATE_UP_ARCHITECTURES.contains(&architecture);
    let mut tensors = Vec::new();
    for info in &directory.tensors {
        let mut tensor = hf_tensor(file, info, info.name.clone())?;
        let Some((layer, base, matrix)) = lora_name(&info.name) else {
            tensors.push(tensor);
            continue;
        };
        let module = match base {
            "ffn_up" if fused_gate_up => Some("mlp.gate_up_proj".to_string()),
            _ => shared_expert_module(base, architecture).map(|m| format!("mlp.{m}")).or_else(|| lookup(LAYER_TENSORS, base).map(str::to_string)),
        };
        let Some(module) = module else {
            tensors.push(tensor);
            continue;
        };
        tensor.name = format!("base_model.model.model.layers.{layer}.{module}.lora_{matrix}.weight");
        let head_count = match base {
            "attn_q" if interleaved => Some(heads),
            "attn_k" if interleaved => Some(kv_heads),
            _ => None,
        };
        tensor.interleaved_head_dim = head_count.filter(|_| matrix == "B").map(|h| tensor.shape[0] / h.max(1));
        tensors.push(tensor);
    }
    Ok(tensors)
}

/// "blk.3.attn_q.weight.lora_a" -> (3, "attn_q", "A"); None for names of another form.
fn lora_name(name: &str) -> Option<(usize, &str, &str)> {
    let (module, matrix) = name.strip_prefix("blk.")?.rsplit_once(".weight.lora_")?;
    let (layer, base) = module.split_once('.')?;
    let matrix = match matrix {
        "a" => "A",
        "b" => "B",
        _ => return None,
    };
    Some((layer.parse().ok()?, base, matrix))
}

/// A projector file's tensors in Hugging Face terms.
pub struct ProjectorTensors {
    /// Under Hugging Face names (those of a type rsgl does not read, or of another name, keep
    /// theirs).
    pub tensors: Vec<HfTensor>,
    /// Tensors to stack back from pieces.
    pub stacked: Vec<StackedTensor>,
}

/// A checkpoint's tensor the converter cut into `pieces`, each of one shape, to be stacked along
/// a new dimension `dim` of theirs (at most their number of dimensions).
pub struct StackedTensor {
    pub name: String,
    pub pieces: Vec<HfTensor>,
    pub dim: usize,
}

/// A projector file's tensors under the Hugging Face names of its type's checkpoint (dimensions
/// outermost first).
pub fn projector_tensors(file: &MappedFile) -> Result<ProjectorTensors> {
    let directory = directory(file)?;
    let kind = directory.metadata.get("clip.projector_type").and_then(Value::as_str).unwrap_or_default();
    let Some(names) = projector_names(kind) else {
        let tensors = directory.tensors.iter().map(|info| hf_tensor(file, info, info.name.clone())).collect::<Result<_>>()?;
        return Ok(ProjectorTensors { tensors, stacked: Vec::new() });
    };
    let is_piece = |name: &str| names.stacked.iter().any(|(_, pieces, _)| pieces.contains(&name));
    let (mut tensors, mut pieces) = (Vec::new(), Vec::new());
    for info in &directory.tensors {
        if is_piece(&info.name) {
            pieces.push(hf_tensor(file, info, info.name.clone())?);
            continue;
        }
        let (module, suffix) = info.name.rsplit_once('.').unwrap_or((&info.name, ""));
        let layer = module.strip_prefix("v.blk.").and_then(|rest| rest.split_once('.'));
        let hf_module = match layer {
            Some((layer, base)) => lookup(names.layer, base).map(|m| format!("{}{layer}.{m}", names.layers)),
            None => lookup(names.outside, module).map(str::to_string),
        };
        let name = match lookup(names.parameters, &info.name) {
            Some(parameter) => parameter.to_string(),
            None => hf_module.map_or_else(|| info.name.clone(), |m| format!("{m}.{suffix}")),
        };
        tensors.push(hf_tensor(file, info, name)?);
    }
    let mut stacked = Vec::new();
    for &(name, piece_names, dim) in names.stacked {
        if !pieces.iter().any(|piece| piece_names.contains(&piece.name.as_str())) {
            continue; // the tower then says it is missing
        }
        let mut in_order = Vec::new();
        for piece_name in piece_names {
            let at = pieces.iter().position(|piece| piece.name == *piece_name).ok_or_else(|| {
                EngineError::ModelLoad(format!(
                    "{}: the converter cuts {name} into {}, but {piece_name} is missing; the file looks broken: download it again",
                    file.path.display(),
                    piece_names.join(" and ")
                ))
            })?;
            in_order.push(pieces.swap_remove(at));
        }
        let first = &in_order[0];
        if let Some(other) = in_order.iter().find(|piece| piece.shape != first.shape || dim > piece.shape.len()) {
            return Err(EngineError::ModelLoad(format!(
                "{}: {} has shape {:?}, which does not stack with {}'s {:?} into {name} along dimension {dim}; the file looks broken: download it again",
                file.path.display(),
                other.name,
                other.shape,
                first.name,
                first.shape
            )));
        }
        stacked.push(StackedTensor { name: name.to_string(), pieces: in_order, dim });
    }
    Ok(ProjectorTensors { tensors, stacked })
}

/// The tensor `info` of a file whose tensors are not renamed as a model's, named `name`.
fn hf_tensor(file: &MappedFile, info: &GgufTensorInfo, name: String) -> Result<HfTensor> {
    let shape = info.dims.iter().rev().map(|&d| d as usize).collect();
    Ok(HfTensor { name, shape, kind: known_type(file, info)?, offset: info.data.start, interleaved_head_dim: None })
}

/// The storage type of `info`, refused by name where rsgl does not read it.
fn known_type(file: &MappedFile, info: &GgufTensorInfo) -> Result<GgmlType> {
    GgmlType::from_id(info.type_id).ok_or_else(|| {
        EngineError::UnsupportedModel(format!(
            "{}: tensor {} is stored as {}, which rsgl does not read; use a file in F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 or a K-quant (Q2_K to Q6_K)",
            file.path.display(),
            info.name,
            GgmlType::id_name(info.type_id)
        ))
    })
}

fn lookup<'a>(table: &[(&str, &'a str)], key: &str) -> Option<&'a str> {
    table.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
}

/// "blk.3.attn_q.weight" -> (Some(3), "attn_q", "weight"); "blk.3.ssm_a" -> (Some(3), "ssm_a",
/// ""); "output_norm.weight" -> (None, "output_norm", "weight"); None for names of another form.
fn split_name(info: &GgufTensorInfo) -> Option<(Option<usize>, &str, &str)> {
    match info.name.strip_prefix("blk.") {
        Some(rest) => {
            let (layer, tensor) = rest.split_once('.')?;
            let (module, suffix) = tensor.rsplit_once('.').unwrap_or((tensor, ""));
            Some((Some(layer.parse().ok()?), module, suffix))
        }
        None => {
            let (base, suffix) = info.name.rsplit_once('.')?;
            Some((None, base, suffix))
        }
    }
}

/// How many layers the model has, where the metadata says: llama.cpp's converter counts the
/// multi-token prediction layers it appends in `block_count` and `nextn_predict_layers`.
fn model_layers(metadata: &Map<String, Value>) -> Option<usize> {
    let architecture = metadata.get("general.architecture")?.as_str()?;
    let count = |key: &str| metadata.get(&format!("{architecture}.{key}")).and_then(Value::as_u64).map(|n| n as usize);
    Some(count("block_count")?.saturating_sub(count("nextn_predict_layers").unwrap_or(0)))
}
