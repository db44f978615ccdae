"""Loading a model's weights, config and tokenizer for the Rust core.

    model = load_model("path/to/hf-folder-or-file.gguf")  # None: the default model
    model.config.fields                                   # the model config the Rust core holds, as a dict
    store = model.open_weights()                          # the files, mapped by the Rust core
    for name, array in model.tensors(): ...               # Hugging Face names, float32, one at a time

Two formats: a Hugging Face folder (config.json + *.safetensors + tokenizer.json) and a GGUF file.
Both come out the same: a normalized config, and tensors under Hugging Face names. The Rust core
normalizes the config (over its table of architectures, `_core.architectures()`) into a
`_core.ModelConfig` the engine takes as it is, reads the tokenizer (`_core.Tokenizer`) and maps
the weight files itself (`WeightStore`); the engine packs each tensor straight from the mapping,
so no weight passes through Python when serving. `tensors()`
(float32 copies, one at a time) is for the converter and the tests.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypedDict

import numpy as np

from rsgl._core import ModelConfig, Tokenizer, WeightStore, architectures
from rsgl._typing import JsonObject
from rsgl.errors import InvalidRequestError, ModelLoadError

__all__ = ["LoadedModel", "ModelConfigFields", "load_model", "SUPPORTED_ARCHITECTURES"]

SUPPORTED_ARCHITECTURES = tuple(architecture["name"] for architecture in architectures())
# How each architecture's layers are put together (the Rust core's `model::archs`), by name.
_ASSEMBLIES = {architecture["name"]: architecture["assembly"] for architecture in architectures()}

# `dtype=` names (as in vLLM / SGLang) -> the weight precision the Rust core packs.
_DTYPE_ALIASES = {"float32": "float32", "float": "float32", "bfloat16": "bfloat16", "float16": "float16", "half": "float16"}
_ACCEPTED_DTYPES = ("auto", *_DTYPE_ALIASES)
# A weight every supported model has, whose storage type stands for the checkpoint's.
WEIGHT_DTYPE_PROBE = "model.layers.0.mlp.down_proj.weight"
# Quantizations a checkpoint brings with it, run as stored (a layer of a type without integer
# kernels in `dtype`); an explicit `dtype=` dequantizes the checkpoint instead.
STORED_QUANTIZATIONS = ("gguf", "awq", "gptq", "mxfp4")
# The storage type the core lists a Hugging Face MXFP4 tensor as (`{name}_blocks` with `{name}_scales`).
MXFP4 = "MXFP4"
# (shape, storage type) of each tensor of a checkpoint, by name.
Tensors = dict[str, tuple[tuple[int, ...], str]]


class LinearRopeScaling(TypedDict):
    """Positions divided by `factor` (Gemma 3's global layers)."""

    rope_type: Literal["linear"]
    factor: float


class Llama3RopeScaling(TypedDict):
    """Llama 3's RoPE scaling."""

    rope_type: Literal["llama3"]
    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: float


class LongRopeScaling(TypedDict):
    """Phi-3's LongRoPE: short factors below the original context, long ones from it on."""

    rope_type: Literal["longrope"]
    short_factor: list[float]
    long_factor: list[float]
    original_max_position_embeddings: int
    attention_factor: float


class YarnRopeScaling(TypedDict):
    """YaRN: frequencies blended between kept and divided by `factor` (bounds `beta_fast`, `beta_slow`,
    rounded out when `truncate`), cos and sin multiplied by `attention_factor`."""

    rope_type: Literal["yarn"]
    factor: float
    original_max_position_embeddings: int
    beta_fast: float
    beta_slow: float
    truncate: bool
    attention_factor: float


RopeScaling = LinearRopeScaling | Llama3RopeScaling | LongRopeScaling | YarnRopeScaling


class QueryTemperature(TypedDict):
    """q at position p multiplied by 1 + beta * ln(1 + floor(p / length)) (Ministral 3's `llama_4_scaling_beta`)."""

    beta: float
    length: int


class Scales(TypedDict):
    """Granite's multipliers, Gemma's scales and soft caps, Ministral 3's query temperature (1, and None for
    the optional ones, elsewhere)."""

    embedding: float
    residual: float
    attention: float | None
    logits_divisor: float
    attention_logit_cap: float | None
    final_logit_cap: float | None
    query_temperature: QueryTemperature | None


class SlidingWindow(TypedDict):
    """Layers that attend to the last `size` positions only, and their own rope base (Gemma's local layers)."""

    size: int
    layers: list[int]
    rope_theta: float | None


class ExpertGroups(TypedDict):
    """DeepSeek's group-limited routing: a token's experts come from its best groups only."""

    groups: int
    groups_per_token: int
    score: Literal["best", "best_two"]  # a group ranked by its best expert's score, or its best two's sum


class MoeConfig(TypedDict):
    """The sparse MLP of a mixture-of-experts model (every layer sparse but the first `dense_layers`)."""

    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    norm_topk_prob: bool
    shared_expert_intermediate_size: int | None
    scoring: Literal["softmax", "sigmoid"]
    expert_groups: ExpertGroups | None
    routed_scaling_factor: float
    dense_layers: int


class LatentAttention(TypedDict):
    """Multi-head latent attention's shape (DeepSeek-V2/V3): q through a rank `q_lora_rank` bottleneck (or
    directly), keys and values up-projected per head from a `kv_lora_rank` latent, beside a shared rope key."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


class GatedDeltaNet(TypedDict):
    """The Gated DeltaNet layers of a hybrid model (Qwen3.5, Qwen3-Next) and their shape."""

    layers: list[int]
    key_heads: int
    value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    value_head_order: Literal["grouped", "tiled"]  # tiled: llama.cpp's Qwen3.5 files (key heads cycling fastest)


class Mamba2(TypedDict):
    """The Mamba-2 layers of a hybrid model (Granite 4) and their shape."""

    layers: list[int]
    heads: int
    head_dim: int
    state_size: int
    groups: int  # groups of heads sharing B and C
    conv_kernel: int


class VisionConfig(TypedDict):
    """A SigLIP-style vision tower and its projector: SmolVLM's pixel shuffle or Gemma 3's average pool
    (rsgl._core.ModelConfig's `vision`)."""

    tower: Literal["siglip"]
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    image_size: int  # a tile's side, in pixels
    patch_size: int
    layer_norm_eps: float
    scale_factor: int  # the projector folds each square of scale_factor**2 neighbouring patches into one token
    projector: Literal["pixel_shuffle", "average_pool"]  # side by side then a linear layer, or averaged, normalized and projected
    image_token_id: int  # the prompt tokens an image's rows replace
    bidirectional_image_tokens: bool  # the language model attends both ways within each run of image tokens (Gemma 3)
    projector_norm_offset: float  # added to the projector's RMS norm weight as stored (Gemma 3's: 1 from config.json, 0 from a GGUF projector file)


class Qwen2_5VlVisionConfig(TypedDict):
    """Qwen2.5-VL's vision tower and patch merger (rsgl._core.ModelConfig's `vision`), and its language model's M-RoPE sections."""

    tower: Literal["qwen2_5_vl"]
    hidden_size: int
    intermediate_size: int
    depth: int
    num_heads: int
    patch_size: int
    temporal_patch_size: int  # frames a patch spans (a still image repeated)
    spatial_merge_size: int  # the merger folds spatial_merge_size**2 neighbouring patches into one token
    window_size: int  # in pixels: blocks other than fullatt_block_indexes attend within such windows
    fullatt_block_indexes: list[int]
    out_hidden_size: int
    rope_theta: float
    image_token_id: int
    mrope_section: tuple[int, int, int]  # the language model's rotary frequencies turned by (temporal, height, width) positions


class ModelConfigFields(TypedDict):
    """The fields of the config the Rust core normalizes a checkpoint's into (`_core.ModelConfig`:
    `from_hf`, `from_gguf`), as its `fields` gives them."""

    architecture: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    rotary_dim: int | None  # the dimensions of each head rope rotates, where not all (partial rotary)
    attention_bias: bool
    qk_norm: bool
    tie_word_embeddings: bool
    max_position_embeddings: int
    moe: MoeConfig | None
    pooling: Literal["last", "mean", "cls"] | None  # how an embedding is pooled, when the files say
    scales: Scales
    no_rope_layers: list[int]  # layers that leave q and k unrotated (SmolLM3's NoPE layers)
    sliding_window: SlidingWindow | None
    activation: Literal["silu", "gelu_tanh"]  # the gated MLP's
    norm_weight_offset: float  # added to every RMS norm weight as stored (Gemma's norms scale by 1 + w)
    gated_delta_net: GatedDeltaNet | None  # layers with a recurrent state in place of attention
    mamba2: Mamba2 | None  # layers with a recurrent state in place of attention (Granite 4)
    latent_attention: LatentAttention | None  # multi-head latent attention in every layer (DeepSeek)
    vision: VisionConfig | Qwen2_5VlVisionConfig | None  # a vision-language model's image encoder (SmolVLM, Qwen2.5-VL)


@dataclass
class TokenizerFields:
    """The `LoadedModel` fields a format's loader reads from its tokenizer files or metadata."""

    tokenizer: Tokenizer | None
    chat_template: str | None
    bos_token: str | None
    eos_token: str | None
    add_bos_token: bool
    bos_token_id: int | None
    eos_token_ids: list[int]
    generation_config: JsonObject


@dataclass
class LoadedModel(TokenizerFields):
    """Everything the engine needs from a model's files.

    Prompt ids are `([bos_token_id] if add_bos_token else []) + tokenizer.encode(text)`:
    `add_bos_token` is False when the tokenizer's own post-processor already adds BOS.
    """

    config: ModelConfig  # the core's; `config.fields` reads it
    open_weights: Callable[[], WeightStore]  # maps the weight files (cheap: only headers are read)
    source: str  # the path loaded
    model_name: str  # the name to serve it under
    # Weight precision: float32 for float32 checkpoints, else bfloat16, until
    # `load_model` applies `dtype=`.
    dtype: str
    # The quantization the engine runs the checkpoint in by default, packed as it is stored
    # ("w8a8_int8": int8 weights; "gguf": a GGUF file's quantized blocks; "awq", "gptq": 4-bit
    # groups; "mxfp4": MXFP4 blocks), or None (`dtype`).
    quantization: str | None = None
    # How the checkpoint stores its weights, whatever `dtype=` asked for (None: floats).
    stored_quantization: str | None = None
    # Why the weights run in another precision than the checkpoint's default (the start-up line says it).
    precision_note: str | None = None
    progress: bool = True  # a progress bar on stderr while the weights load
    # A GGUF vision-language model's projector file (llama.cpp's mmproj-*.gguf), whose metadata sets its image preprocessing.
    mmproj: str | None = None

    def tensors(self) -> Iterator[tuple[str, np.ndarray]]:
        """Every tensor the engine needs, (Hugging Face name, float32 C-contiguous array), one at
        a time (int8 weights scaled back to floats, 4-bit ones dequantized)."""
        store = self.open_weights()
        listed = store.tensors()
        shapes = {name: shape for name, shape, _ in listed}
        mxfp4 = {name for name, _, stored in listed if stored == MXFP4}
        for name in with_progress(list(expected_tensor_shapes(self.config.fields, shapes, mxfp4)), self.progress):
            yield name, np.frombuffer(store.read(name), dtype="<f4").reshape(shapes[name])


def load_model(
    model_path: str | os.PathLike[str] | None,
    *,
    dtype: str = "auto",
    revision: str | None = None,
    skip_tokenizer_init: bool = False,
    progress: bool = True,
    mmproj: str | os.PathLike[str] | None = None,
) -> LoadedModel:
    """Read a Hugging Face model folder or a .gguf file, or the model of a Hugging Face Hub id
    ("org/name", "org/name-GGUF:Q4_K_M"; see `rsgl.loader.hub`) at `revision`; None: the default
    model, SmolLM2-135M-Instruct. A GGUF vision-language model reads images through llama.cpp's
    separate projector file: `mmproj`, else an `mmproj-*.gguf` file beside the model.

    Only the config, the tokenizer and the weight files' headers are read here; the engine maps
    the weights when it starts. `dtype` picks the weight precision the engine computes with
    ("auto": float32 for float32 checkpoints, else bfloat16; a quantized GGUF file or an AWQ or
    GPTQ checkpoint then runs in its own quantization where rsgl has kernels for it, and any
    other dtype dequantizes it; the default model's "auto" is `default_model.QUANTIZATION`).
    """
    if dtype not in _ACCEPTED_DTYPES:
        raise InvalidRequestError(f"dtype must be one of {', '.join(_ACCEPTED_DTYPES)}; got {dtype!r}.")
    default_precision = None
    if model_path is None:
        from rsgl.loader import default_model

        model_path = default_model.default_model_path()
        if dtype == "auto":
            dtype, default_precision = default_model.DTYPE, (default_model.QUANTIZATION, default_model.PRECISION_NOTE)
    path, model_name = _local_path(str(model_path), revision)
    gguf_file = gguf_file_in(path)
    if gguf_file is not None:
        from rsgl.loader import gguf

        model = gguf.load(gguf_file, skip_tokenizer_init=skip_tokenizer_init, mmproj=mmproj)
    else:
        if mmproj is not None:
            raise InvalidRequestError(f"mmproj is a GGUF model's projector file; {path} is a Hugging Face folder, whose safetensors hold its vision tower.")
        from rsgl.loader import hf

        model = hf.load(path, skip_tokenizer_init=skip_tokenizer_init)
    model.model_name = model_name or model.model_name
    model.progress = progress
    model.stored_quantization = model.quantization
    if dtype != "auto":
        model.dtype = _DTYPE_ALIASES[dtype]
        if model.quantization in STORED_QUANTIZATIONS:
            # An explicit dtype asks for the file's quantized weights dequantized to it.
            model.quantization = None
    if default_precision is not None:
        model.quantization, model.precision_note = default_precision
    return model


def _local_path(model_path: str, revision: str | None) -> tuple[Path, str | None]:
    """(the local file or folder `model_path` names, the name to serve it under when it is a Hub
    id: the id as given, as SGLang and vLLM serve it)."""
    from rsgl.loader import hub

    path = Path(model_path).expanduser()
    hub_id = None if path.exists() else hub.parse_hub_id(model_path)
    if hub_id is not None:
        return hub.resolve(hub_id, revision), model_path
    if revision is not None:
        raise InvalidRequestError(f"revision={revision!r} picks a version of a Hugging Face Hub repo; {model_path} is a local path.")
    return path, None


def gguf_file_in(path: Path) -> Path | None:
    """The GGUF file `path` designates (the first shard of a split one), or None for a Hugging Face folder."""
    if not path.exists():
        raise ModelLoadError(f"no such file or directory: {path}; pass a Hugging Face model folder, a .gguf file, or a Hugging Face Hub id (org/name).")
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelLoadError(f"{path} is not a .gguf file; pass a Hugging Face model folder or a .gguf file.")
        return path
    from rsgl.loader.hub import gguf_models

    models = gguf_models([file.name for file in path.glob("*.gguf")])
    if not models or any(path.glob("*.safetensors")):
        return None
    if len(models) > 1:
        names = ", ".join(files[0] for files in models.values())
        raise ModelLoadError(f"{path} holds several GGUF models ({names}); pass the path of the one to load.")
    return path / next(iter(models.values()))[0]


# Projections some checkpoints fuse into one matrix (Phi-3): the fused name, and the parts it stacks.
_FUSED_PROJECTIONS = (
    ("self_attn.qkv_proj", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    ("mlp.gate_up_proj", ("mlp.gate_proj", "mlp.up_proj")),
)


def expected_tensor_shapes(config: ModelConfigFields, found: Iterable[str] = (), mxfp4: Collection[str] = ()) -> dict[str, tuple[int, ...]]:
    """Every tensor the Rust core needs for this config, by Hugging Face name, with its shape; the
    projections the checkpoint whose tensor names are `found` fuses, fused (`mxfp4`: those of
    them stored as MXFP4, see `_stacked_experts_where_stored`)."""
    found = set(found)
    hidden, ffn, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    assembly = _ASSEMBLIES[config["architecture"]]
    norms = [name for sublayer in ("attention", "mlp") for name in (assembly[sublayer]["pre"], assembly[sublayer]["post"]) if name]
    net, mamba = config.get("gated_delta_net"), config.get("mamba2")
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}."
        shapes.update({f"{prefix}{name}.weight": (hidden,) for name in norms})
        if net and layer in net["layers"]:
            shapes.update(_delta_net_shapes(prefix + "linear_attn.", net, hidden, found))
        elif mamba and layer in mamba["layers"]:
            shapes.update(_mamba2_shapes(prefix + "mamba.", mamba, hidden, found))
        elif latent := config.get("latent_attention"):
            shapes.update(_latent_attention_shapes(prefix + "self_attn.", latent, config, found))
        else:
            shapes.update(_attention_shapes(prefix + "self_attn.", config, assembly, found))
        if assembly["mlp_layout"] == "granite_shared":
            shapes.update(_granite_mlp_shapes(prefix, config))
        elif config["moe"] and layer >= config["moe"].get("dense_layers", 0):
            shapes.update(_moe_shapes(prefix, config["moe"], config, found))
        else:
            shapes.update(_swiglu_shapes(prefix + "mlp.", ("gate_proj", "up_proj", "down_proj"), hidden, ffn))
    shapes["model.norm.weight"] = (hidden,)
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (vocab, hidden)
    if vision := config.get("vision"):
        shapes.update(_qwen_vision_shapes(vision, hidden, found) if vision["tower"] == "qwen2_5_vl" else _vision_shapes(vision, hidden))
    return _stacked_experts_where_stored(_fused_where_stored(shapes, found), found, config, set(mxfp4))


def _vision_shapes(vision: VisionConfig, text_hidden: int) -> dict[str, tuple[int, ...]]:
    """A SigLIP vision tower's and its projector's tensors (Gemma 3's under the names the core gives them)."""
    width, inner, patch = vision["hidden_size"], vision["intermediate_size"], vision["patch_size"]
    tower = "model.vision_model."
    shapes: dict[str, tuple[int, ...]] = {
        tower + "embeddings.patch_embedding.weight": (width, 3, patch, patch),
        tower + "embeddings.patch_embedding.bias": (width,),
        tower + "embeddings.position_embedding.weight": ((vision["image_size"] // patch) ** 2, width),
        tower + "post_layernorm.weight": (width,),
        tower + "post_layernorm.bias": (width,),
    }
    if vision["projector"] == "average_pool":
        shapes["model.multi_modal_projector.mm_soft_emb_norm.weight"] = (width,)
        shapes["model.multi_modal_projector.mm_input_projection_weight"] = (width, text_hidden)  # multiplies from the right
    else:
        shapes["model.connector.modality_projection.proj.weight"] = (text_hidden, width * vision["scale_factor"] ** 2)
    for layer in range(vision["num_hidden_layers"]):
        prefix = f"{tower}encoder.layers.{layer}."
        for name, (rows, cols) in {"self_attn.q_proj": (width, width), "self_attn.k_proj": (width, width), "self_attn.v_proj": (width, width),
                                   "self_attn.out_proj": (width, width), "mlp.fc1": (inner, width), "mlp.fc2": (width, inner)}.items():  # fmt: skip
            shapes[f"{prefix}{name}.weight"], shapes[f"{prefix}{name}.bias"] = (rows, cols), (rows,)
        for norm in ("layer_norm1", "layer_norm2"):
            shapes[f"{prefix}{norm}.weight"], shapes[f"{prefix}{norm}.bias"] = (width,), (width,)
    return shapes


def _qwen_vision_shapes(vision: Qwen2_5VlVisionConfig, text_hidden: int, found: set[str]) -> dict[str, tuple[int, ...]]:
    """Qwen2.5-VL's vision tower's and merger's tensors; each block's q, k and v apart where `found` holds them so
    (llama.cpp's projector files)."""
    width, inner, patch = vision["hidden_size"], vision["intermediate_size"], vision["patch_size"]
    merged = width * vision["spatial_merge_size"] ** 2
    shapes: dict[str, tuple[int, ...]] = {
        "visual.patch_embed.proj.weight": (width, 3, vision["temporal_patch_size"], patch, patch),
        "visual.merger.ln_q.weight": (width,),
        "visual.merger.mlp.0.weight": (merged, merged),
        "visual.merger.mlp.0.bias": (merged,),
        "visual.merger.mlp.2.weight": (text_hidden, merged),
        "visual.merger.mlp.2.bias": (text_hidden,),
    }
    for layer in range(vision["depth"]):
        prefix = f"visual.blocks.{layer}."
        attention = {name: (width, width) for name in ("attn.q", "attn.k", "attn.v")} if f"{prefix}attn.q.weight" in found else {"attn.qkv": (3 * width, width)}
        for name, (rows, cols) in {**attention, "attn.proj": (width, width), "mlp.gate_proj": (inner, width),
                                   "mlp.up_proj": (inner, width), "mlp.down_proj": (width, inner)}.items():  # fmt: skip
            shapes[f"{prefix}{name}.weight"], shapes[f"{prefix}{name}.bias"] = (rows, cols), (rows,)
        shapes[f"{prefix}norm1.weight"], shapes[f"{prefix}norm2.weight"] = (width,), (width,)
    return shapes


def _attention_shapes(prefix: str, config: ModelConfigFields, assembly: dict[str, Any], found: set[str]) -> dict[str, tuple[int, ...]]:
    """An attention sublayer's tensors (`prefix`: `model.layers.{i}.self_attn.`)."""
    hidden, head_dim = config["hidden_size"], config["head_dim"]
    q_rows = config["num_attention_heads"] * head_dim
    kv_rows = config["num_key_value_heads"] * head_dim
    shapes: dict[str, tuple[int, ...]] = {}
    # With an output gate, q_proj gives each head's gate after its q.
    gated_q_rows = 2 * q_rows if assembly["attention_output_gate"] else q_rows
    for proj, rows in (("q", gated_q_rows), ("k", kv_rows), ("v", kv_rows)):
        shapes[prefix + f"{proj}_proj.weight"] = (rows, hidden)
        if config["attention_bias"]:
            shapes[prefix + f"{proj}_proj.bias"] = (rows,)
    shapes[prefix + "o_proj.weight"] = (hidden, q_rows)
    # Read where the checkpoint has them (gpt-oss): o_proj's bias and a sink logit per q head.
    optional = {prefix + "o_proj.bias": (hidden,), prefix + "sinks": (config["num_attention_heads"],)}
    shapes.update({name: shape for name, shape in optional.items() if name in found})
    qk_norm = {"per_head": (head_dim, head_dim), "all_heads": (q_rows, kv_rows)}.get(assembly["qk_norm"])
    if qk_norm and config["qk_norm"]:
        shapes[prefix + "q_norm.weight"] = (qk_norm[0],)
        shapes[prefix + "k_norm.weight"] = (qk_norm[1],)
    return shapes


def _latent_attention_shapes(prefix: str, latent: LatentAttention, config: ModelConfigFields, found: set[str]) -> dict[str, tuple[int, ...]]:
    """A latent attention sublayer's tensors (`prefix`: `model.layers.{i}.self_attn.`), with its key and value
    up-projections as one `kv_b_proj`, or apart as llama.cpp's files keep them (the keys' transposed per head)."""
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    rank, nope, rope, v = latent["kv_lora_rank"], latent["qk_nope_head_dim"], latent["qk_rope_head_dim"], latent["v_head_dim"]
    q_rows = heads * (nope + rope)
    q_lora = latent["q_lora_rank"]
    shapes: dict[str, tuple[int, ...]] = {
        prefix + "kv_a_proj_with_mqa.weight": (rank + rope, hidden),
        prefix + "kv_a_layernorm.weight": (rank,),
        prefix + "o_proj.weight": (hidden, heads * v),
    }
    if q_lora is None:
        shapes[prefix + "q_proj.weight"] = (q_rows, hidden)
    else:
        shapes.update({prefix + "q_a_proj.weight": (q_lora, hidden), prefix + "q_a_layernorm.weight": (q_lora,), prefix + "q_b_proj.weight": (q_rows, q_lora)})
    if prefix + "k_b_proj.weight" in found:
        shapes.update({prefix + "k_b_proj.weight": (heads, rank, nope), prefix + "v_b_proj.weight": (heads, v, rank)})
    else:
        shapes[prefix + "kv_b_proj.weight"] = (heads * (nope + v), rank)
    optional = {prefix + "q_a_proj.bias": (q_lora or 0,), prefix + "kv_a_proj_with_mqa.bias": (rank + rope,)}
    shapes.update({name: shape for name, shape in optional.items() if name in found})
    return shapes


def _delta_net_shapes(prefix: str, net: GatedDeltaNet, hidden: int, found: set[str]) -> dict[str, tuple[int, ...]]:
    """A Gated DeltaNet sublayer's tensors (`prefix`: `model.layers.{i}.linear_attn.`), with its input
    projections as Qwen3.5 stores them, or fused by key head as Qwen3-Next does (whose GGUF files keep
    only `in_proj_ba` fused), and its decay rates as `A_log` or, from GGUF files, `A = -exp(A_log)`."""
    keys, values, heads = net["key_heads"] * net["key_head_dim"], net["value_heads"] * net["value_head_dim"], net["value_heads"]
    channels = 2 * keys + values
    qkvz = {"in_proj_qkvz": channels + values} if prefix + "in_proj_qkvz.weight" in found else {"in_proj_qkv": channels, "in_proj_z": values}
    ba = {"in_proj_ba": 2 * heads} if prefix + "in_proj_ba.weight" in found else {"in_proj_b": heads, "in_proj_a": heads}
    shapes: dict[str, tuple[int, ...]] = {f"{prefix}{name}.weight": (rows, hidden) for name, rows in (qkvz | ba).items()}
    shapes.update(
        {
            prefix + "out_proj.weight": (hidden, values),
            prefix + "conv1d.weight": (channels, 1, net["conv_kernel"]),
            prefix + ("A" if prefix + "A" in found else "A_log"): (heads,),
            prefix + "dt_bias": (heads,),
            prefix + "norm.weight": (net["value_head_dim"],),
        }
    )
    return shapes


def _mamba2_shapes(prefix: str, mamba: Mamba2, hidden: int, found: set[str]) -> dict[str, tuple[int, ...]]:
    """A Mamba-2 sublayer's tensors (`prefix`: `model.layers.{i}.mamba.`), its biases where the
    checkpoint has them."""
    heads, inner = mamba["heads"], mamba["heads"] * mamba["head_dim"]
    channels = inner + 2 * mamba["groups"] * mamba["state_size"]
    shapes: dict[str, tuple[int, ...]] = {
        prefix + "in_proj.weight": (inner + channels + heads, hidden),
        prefix + "conv1d.weight": (channels, 1, mamba["conv_kernel"]),
        prefix + "A_log": (heads,),
        prefix + "dt_bias": (heads,),
        prefix + "D": (heads,),
        prefix + "norm.weight": (inner,),
        prefix + "out_proj.weight": (hidden, inner),
    }
    biases = {prefix + "in_proj.bias": (inner + channels + heads,), prefix + "conv1d.bias": (channels,), prefix + "out_proj.bias": (hidden,)}
    shapes.update({name: shape for name, shape in biases.items() if name in found})
    return shapes


def _granite_mlp_shapes(prefix: str, config: ModelConfigFields) -> dict[str, tuple[int, ...]]:
    """Granite 4's MLP tensors: the shared MLP (gate and up stacked), and the experts stacked
    (each one's gate and up rows, then their down matrices) with their router, where it has experts."""
    hidden, shared = config["hidden_size"], config["intermediate_size"]
    shapes: dict[str, tuple[int, ...]] = {
        prefix + "shared_mlp.input_linear.weight": (2 * shared, hidden),
        prefix + "shared_mlp.output_linear.weight": (hidden, shared),
    }
    moe = config["moe"]
    if moe:
        experts, inter = moe["num_experts"], moe["expert_intermediate_size"]
        block = prefix + "block_sparse_moe."
        shapes[block + "input_linear.weight"] = (experts, 2 * inter, hidden)
        shapes[block + "output_linear.weight"] = (experts, hidden, inter)
        shapes[block + "router.layer.weight"] = (experts, hidden)
    return shapes


def _fused_where_stored(shapes: dict[str, tuple[int, ...]], found: set[str]) -> dict[str, tuple[int, ...]]:
    """`shapes` with each layer's projections that `found` holds fused replaced by the fused matrix."""
    for name in [name for name in found if name.startswith("model.layers.")]:
        for fused, parts in _FUSED_PROJECTIONS:
            if name.endswith(f".{fused}.weight"):
                prefix = name.removesuffix(f"{fused}.weight")
                stacked = [shapes.pop(f"{prefix}{part}.weight") for part in parts]
                shapes[name] = (sum(rows for rows, _ in stacked), stacked[0][1])
    return shapes


def _stacked_experts_where_stored(
    shapes: dict[str, tuple[int, ...]], found: set[str], config: ModelConfigFields, mxfp4: set[str]
) -> dict[str, tuple[int, ...]]:
    """gpt-oss stores a layer's experts stacked and transposed (`mlp.experts.gate_up_proj`
    [E, hidden, 2 * inter], gate and up interleaved; `mlp.experts.down_proj` [E, inter, hidden]) and
    names its router `mlp.router`: where `found` has them, they replace the per-expert matrices.
    Its MXFP4 checkpoints store them as nn.Linear ([E, 2 * inter, hidden] with gate and up
    interleaved by row, [E, hidden, inter]), as `{name}_blocks` and `{name}_scales` the core lists
    as one tensor `{name}` stored as MXFP4 (those in `mxfp4`)."""
    moe = config["moe"]
    if moe is None:
        return shapes
    for name in [name for name in found if name.endswith(".mlp.experts.gate_up_proj")]:
        block = name.removesuffix("experts.gate_up_proj")
        experts, hidden, inter = moe["num_experts"], config["hidden_size"], moe["expert_intermediate_size"]
        for expert in range(experts):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                shapes.pop(f"{block}experts.{expert}.{proj}.weight", None)
        if name in mxfp4:
            shapes[name] = (experts, 2 * inter, hidden)
            shapes[f"{block}experts.down_proj"] = (experts, hidden, inter)
        else:
            shapes[name] = (experts, hidden, 2 * inter)
            shapes[f"{block}experts.down_proj"] = (experts, inter, hidden)
        if f"{block}router.weight" in found:
            shapes[f"{block}router.weight"] = shapes.pop(f"{block}gate.weight")
        biases = {f"{block}router.bias": (experts,), f"{name}_bias": (experts, 2 * inter), f"{block}experts.down_proj_bias": (experts, hidden)}
        shapes.update({bias: shape for bias, shape in biases.items() if bias in found})
    return shapes


def _swiglu_shapes(prefix: str, names: tuple[str, str, str], hidden: int, inner: int) -> dict[str, tuple[int, ...]]:
    gate, up, down = names
    return {f"{prefix}{gate}.weight": (inner, hidden), f"{prefix}{up}.weight": (inner, hidden), f"{prefix}{down}.weight": (hidden, inner)}


def _moe_shapes(prefix: str, moe: MoeConfig, config: ModelConfigFields, found: set[str]) -> dict[str, tuple[int, ...]]:
    """A sparse MLP's tensors, as Mixtral (`block_sparse_moe`, w1/w3/w2), Qwen MoE (`mlp`, gate/up/down_proj,
    and Qwen2-MoE's gated shared expert) or DeepSeek checkpoints (ungated `shared_experts`, and the router's
    choice bias) name them."""
    hidden = config["hidden_size"]
    mixtral = config["architecture"] == "mixtral"
    block, names = (prefix + "block_sparse_moe.", ("w1", "w3", "w2")) if mixtral else (prefix + "mlp.", ("gate_proj", "up_proj", "down_proj"))
    shapes: dict[str, tuple[int, ...]] = {block + "gate.weight": (moe["num_experts"], hidden)}
    if block + "gate.e_score_correction_bias" in found:
        shapes[block + "gate.e_score_correction_bias"] = (moe["num_experts"],)
    for expert in range(moe["num_experts"]):
        shapes.update(_swiglu_shapes(f"{block}experts.{expert}.", names, hidden, moe["expert_intermediate_size"]))
    if moe["shared_expert_intermediate_size"]:
        shared = "shared_experts." if block + "shared_experts.down_proj.weight" in found else "shared_expert."
        shapes.update(_swiglu_shapes(block + shared, names, hidden, moe["shared_expert_intermediate_size"]))
        if block + "shared_expert_gate.weight" in found:
            shapes[block + "shared_expert_gate.weight"] = (1, hidden)
    return shapes


def check_tensor_shapes(found: dict[str, tuple[int, ...]], config: ModelConfigFields, source: Path | str, mxfp4: Collection[str] = ()) -> None:
    """Fail before loading when the files lack a tensor the config needs, or hold it in another
    shape (`mxfp4`: the names of `found` stored as MXFP4)."""
    expected = expected_tensor_shapes(config, found, mxfp4)
    missing = [name for name in expected if name not in found]
    if missing:
        raise ModelLoadError(
            f"{source} lacks {len(missing)} tensor(s) its config needs, e.g. {', '.join(missing[:3])}; "
            "the download may be incomplete: download the model again."
        )
    for name, shape in expected.items():
        # Leading 1s do not change how values lie in memory; llama.cpp's quantizer drops them
        # (a [1, hidden] shared-expert gate becomes [hidden]).
        if _without_leading_ones(tuple(found[name])) != _without_leading_ones(shape):
            raise ModelLoadError(
                f"{source}: tensor {name} has shape {list(found[name])}, but its config implies {list(shape)}; "
                "the config does not match the weights: download the model again."
            )


def _without_leading_ones(shape: tuple[int, ...]) -> tuple[int, ...]:
    return shape[next((i for i, d in enumerate(shape) if d != 1), len(shape)) :]


def with_progress(names: list[str], enabled: bool) -> Iterable[str]:
    """`names`, with a progress bar on stderr while the tensors they name load."""
    from tqdm import tqdm

    bar: Iterable[str] = tqdm(names, desc="Loading weights", unit="tensor", file=sys.stderr, disable=not enabled)
    return bar


def unique_ints(*groups: int | list[int] | tuple[int, ...] | None) -> list[int]:
    """The ints in these values (each None, an int or a list of ints), once each, in order."""
    seen: list[int] = []
    for group in groups:
        for value in group if isinstance(group, (list, tuple)) else [group]:
            if value is not None and int(value) not in seen:
                seen.append(int(value))
    return seen


def read_json_object(path: Path) -> JsonObject:
    """The JSON object in a model file; ModelLoadError if it cannot be read or holds something else."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ModelLoadError(f"cannot read {path} ({error}); download it again.") from error
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} holds no JSON object; download it again.")
    return data


def read_optional_json_object(path: Path) -> JsonObject:
    """`read_json_object(path)`, or {} if there is no such file."""
    return read_json_object(path) if path.is_file() else {}
