"""Hugging Face model folders: config.json, *.safetensors (one file or shards), tokenizer files.

The Rust core normalizes config.json (`rsgl._core.ModelConfig.from_hf`) and maps the safetensors
files (`rsgl._core.WeightStore`), checking every header against its file's size here, before
loading starts; their tensors never pass through Python when serving.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import TypedDict

from rsgl._core import ModelConfig, Tokenizer, WeightStore
from rsgl._typing import JsonObject
from rsgl.errors import ModelLoadError, UnsupportedModelError
from rsgl.loader import (
    MXFP4,
    WEIGHT_DTYPE_PROBE,
    LoadedModel,
    ModelConfigFields,
    Tensors,
    TokenizerFields,
    check_tensor_shapes,
    expected_tensor_shapes,
    read_json_object,
    read_optional_json_object,
    unique_ints,
)
from rsgl.loader.pooling import sentence_transformers_pooling

# Buffers some old checkpoints saved next to the weights; they are recomputed, not loaded.
_IGNORED_TENSOR_SUFFIXES = ("rotary_emb.inv_freq",)
# SigLIP's pooling head, which transformers saves with a tower (vision_use_head) and no vision-language model runs.
_IGNORED_TENSOR_PREFIXES = ("model.vision_model.head.",)

logger = logging.getLogger("rsgl")


def load(folder: Path, *, skip_tokenizer_init: bool) -> LoadedModel:
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(
            f"{folder} has no config.json; pass a complete Hugging Face model folder (config.json, *.safetensors, tokenizer.json) or a .gguf file."
        )
    raw_config = read_json_object(config_path)
    config = ModelConfig.from_hf(raw_config)  # before the weights: an unsupported model fails at once
    quantization, int4_layout = _quantization(raw_config, folder)
    open_weights = functools.partial(WeightStore.open_safetensors, _checkpoint_paths(folder), **int4_layout)
    tensors = {name: (tuple(shape), stored) for name, shape, stored in open_weights().tensors()}
    config = config.with_checkpoint(pooling=sentence_transformers_pooling(folder), has_lm_head="lm_head.weight" in tensors)
    fields = config.fields
    _check_tensors(tensors, fields, folder, quantization)
    if quantization in ("awq", "gptq"):
        _explain_float_layers(tensors, int4_layout["group_size"], folder)
    return LoadedModel(
        config=config,
        open_weights=open_weights,
        source=str(folder),
        model_name=folder.resolve().name,
        dtype=_checkpoint_dtype(tensors),
        quantization=quantization,
        **vars(_tokenizer_fields(folder, raw_config, fields["vocab_size"], skip_tokenizer_init)),
    )


# ---------------------------------------------------------------------------------------------
# safetensors
# ---------------------------------------------------------------------------------------------

# Quantization schemes whose checkpoints rsgl reads (`quantization_config.quant_method`).
_QUANT_METHODS = ("w8a8_int8", "w4a8", "awq", "gptq", "mxfp4")
# What the core lists a packed 4-bit checkpoint's layers as, by method, and how they are stored
# (GPTQ_ACT_ORDER: groups by g_idx, run in floats).
_PACKED_LAYERS = {
    "awq": (("AWQ",), "qweight, qzeros, scales"),
    "gptq": (("GPTQ", "GPTQ_ACT_ORDER"), "qweight, qzeros, scales"),
    "w4a8": (("Q4_1",), "uint8 rows of Q4_1 blocks"),
    "mxfp4": ((MXFP4,), "uint8 _blocks and _scales"),
}
# The checkpoint formats of GPTQ quantization_configs -> the core's packing names (v1 stores each
# zero point minus one, v2 as it is).
_GPTQ_FORMATS = {"gptq": "gptq", "gptq_v2": "gptq_v2"}
# Inputs per block of the W4A8 kernels: groups must be whole blocks to run as stored.
_INT4_BLOCK = 32
# Next to each int8 weight of a W8A8 checkpoint: its per-output-channel scales, [out, 1].
_SCALE_SUFFIX = "_scale"
# float16 checkpoints compute in bfloat16 unless dtype="float16" asks: it is the fast 16-bit path
# on CPUs (vLLM's CPU backend casts float16 to bfloat16 too).
_CHECKPOINT_DTYPE = {"F32": "float32", "F16": "bfloat16", "BF16": "bfloat16"}


class Int4Layout(TypedDict, total=False):
    """The keyword arguments of `WeightStore.open_safetensors` that read a packed 4-bit checkpoint."""

    packing: str
    group_size: int | None


def _checkpoint_paths(folder: Path) -> list[Path]:
    index_path = folder / "model.safetensors.index.json"
    if index_path.is_file():
        shards = sorted({folder / shard for shard in read_json_object(index_path).get("weight_map", {}).values()})
        missing = [shard.name for shard in shards if not shard.is_file()]
        if missing:
            raise ModelLoadError(f"{folder} lacks the shard(s) {', '.join(missing)} its index lists; download them.")
        return shards
    paths = sorted(folder.glob("*.safetensors"))
    if not paths:
        raise ModelLoadError(
            f"{folder} has no *.safetensors weights; rsgl reads safetensors or GGUF files "
            "(convert PyTorch .bin weights with transformers: model.save_pretrained(folder))."
        )
    return paths


def _checkpoint_dtype(tensors: Tensors) -> str:
    """The float type the checkpoint stores its weights in (a quantized one: its unquantized tensors)."""
    usable = WEIGHT_DTYPE_PROBE in tensors and tensors[WEIGHT_DTYPE_PROBE][1] in _CHECKPOINT_DTYPE
    probe = WEIGHT_DTYPE_PROBE if usable else "model.embed_tokens.weight"  # MoE layers have no mlp.down_proj
    return _CHECKPOINT_DTYPE[tensors[probe][1]]


def _quantization(raw_config: JsonObject, folder: Path) -> tuple[str | None, Int4Layout]:
    """The checkpoint's quantization method, and for a packed 4-bit one (AWQ, GPTQ, w4a8) the
    keyword arguments of `WeightStore.open_safetensors` that read its layers (`packing`,
    `group_size`), else {}."""
    quantization_config = raw_config.get("quantization_config") or {}
    method = quantization_config.get("quant_method")
    if method is not None and method not in _QUANT_METHODS:
        raise UnsupportedModelError(
            f"{folder} is quantized with {method!r}; rsgl reads {', '.join(_QUANT_METHODS)} checkpoints "
            "(make one with `python -m rsgl.quantize`) or unquantized ones."
        )
    if method in ("awq", "gptq"):
        return method, _int4_layout(quantization_config, method, folder)
    if method == "w4a8":
        return method, Int4Layout(packing="ggml_q4_1")
    return method, Int4Layout()


def _int4_layout(quantization_config: JsonObject, method: str, folder: Path) -> Int4Layout:
    """How an AWQ or GPTQ checkpoint packs its layers, from its quantization_config (keys missing
    take transformers' defaults; AutoAWQ's own names `w_bit` / `q_group_size` are read too)."""
    name = method.upper()
    bits = quantization_config.get("bits", quantization_config.get("w_bit", 4))
    if bits != 4:
        raise UnsupportedModelError(
            f"{folder} is a {bits}-bit {name} checkpoint; rsgl runs 4-bit AWQ and GPTQ checkpoints (bits 4) on its "
            "W4A8 kernels: load a 4-bit one, or the float model with quantization='w8a8_int8'."
        )
    group_size = quantization_config.get("group_size", quantization_config.get("q_group_size", 128))
    if not isinstance(group_size, int) or group_size == 0 or group_size < -1:
        raise ModelLoadError(f"{folder}: config.json's quantization_config has group_size {group_size!r}; it must be positive or -1. The config looks broken.")
    if method == "awq":
        version = str(quantization_config.get("version", "gemm")).lower()
        if version != "gemm":
            raise UnsupportedModelError(
                f"{folder} is an AWQ checkpoint in AutoAWQ's {version!r} layout; rsgl reads the 'gemm' layout "
                "(AutoAWQ's default, which vLLM and SGLang read too): quantize with version='gemm'."
            )
        if not quantization_config.get("zero_point", True):
            raise UnsupportedModelError(
                f"{folder} is an AWQ checkpoint without zero points (zero_point false); rsgl reads AWQ checkpoints "
                "with zero points (zero_point true, AutoAWQ's default)."
            )
        packing = "awq"
    else:
        checkpoint_format = quantization_config.get("checkpoint_format", "marlin" if quantization_config.get("is_marlin_format") else "gptq")
        if checkpoint_format not in _GPTQ_FORMATS:
            raise UnsupportedModelError(
                f"{folder} is a GPTQ checkpoint in the {checkpoint_format!r} format; rsgl reads the "
                f"{' and '.join(map(repr, _GPTQ_FORMATS))} formats (GPTQModel and AutoGPTQ save 'gptq' by default)."
            )
        packing = _GPTQ_FORMATS[checkpoint_format]
    return Int4Layout(packing=packing, group_size=None if group_size == -1 else group_size)


def _explain_float_layers(tensors: Tensors, group_size: int | None, folder: Path) -> None:
    """Says once why layers of a 4-bit checkpoint will run dequantized (in floats, slower and
    larger) rather than on the 4-bit kernels, and what to do about it."""
    act_order = [name for name, (_, stored) in tensors.items() if stored == "GPTQ_ACT_ORDER"]
    if act_order:
        logger.warning(
            "%s: %d GPTQ layer(s), e.g. %s, were quantized with act-order (desc_act): their groups are not runs of "
            "consecutive inputs, which the 4-bit kernels need, so they run dequantized to floats (slower, more memory). "
            "Re-quantize without desc_act (or with static_groups) to run them as 4-bit.",
            folder,
            len(act_order),
            act_order[0],
        )
    if group_size is not None and group_size % _INT4_BLOCK:
        logger.warning(
            "%s: groups of %d inputs are not whole blocks of %d, which the 4-bit kernels need, so its 4-bit layers run "
            "dequantized to floats (slower, more memory). Re-quantize with group_size 128 (or 32, 64) to run them as 4-bit.",
            folder,
            group_size,
            _INT4_BLOCK,
        )


def _past_the_last_layer(name: str, config: ModelConfigFields) -> bool:
    """A tensor of a layer after the model's last: DeepSeek-V3's and GLM-4.5's multi-token prediction layers, which
    transformers does not run either."""
    layer = name.removeprefix("model.layers.").split(".", 1)[0]
    return name.startswith("model.layers.") and layer.isdigit() and int(layer) >= config["num_hidden_layers"]


def _check_tensors(tensors: Tensors, config: ModelConfigFields, folder: Path, quantization: str | None) -> None:
    shapes = {name: shape for name, (shape, _) in tensors.items() if not name.endswith(_SCALE_SUFFIX)}
    mxfp4 = {name for name, (_, stored) in tensors.items() if stored == MXFP4}
    check_tensor_shapes(shapes, config, folder, mxfp4)
    expected = expected_tensor_shapes(config, shapes, mxfp4)
    if quantization in _PACKED_LAYERS and not any(tensors[name][1] in _PACKED_LAYERS[quantization][0] for name in expected):
        probe = WEIGHT_DTYPE_PROBE if WEIGHT_DTYPE_PROBE in expected else "model.layers.0.self_attn.q_proj.weight"
        raise UnsupportedModelError(
            f"{folder}'s config.json names {quantization!r} quantization, but no layer is stored that way "
            f"({_PACKED_LAYERS[quantization][1]}): {probe} is {tensors[probe][1]}. rsgl reads AWQ, GPTQ, MXFP4 and w4a8 4-bit "
            "checkpoints, w8a8_int8 ones and unquantized ones: fix config.json's quantization_config."
        )
    int8 = {name for name in expected if tensors[name][1] == "I8"}
    if int8 and not quantization:
        raise UnsupportedModelError(
            f"{folder} stores weights as int8 but its config.json names no quantization; rsgl reads float32, "
            "float16 and bfloat16 safetensors, w8a8_int8 checkpoints (or a GGUF file)."
        )
    for name in int8:
        scale = tensors.get(name + _SCALE_SUFFIX)
        if scale is None or scale[0] not in ((expected[name][0], 1), (expected[name][0],)):
            raise ModelLoadError(f"{folder}: the int8 weight {name} has no per-channel {name + _SCALE_SUFFIX}; the checkpoint is incomplete.")
    unused = [
        name
        for name in tensors
        if name not in expected
        and not name.endswith(_IGNORED_TENSOR_SUFFIXES)
        and not name.startswith(_IGNORED_TENSOR_PREFIXES)
        and not (name.endswith(_SCALE_SUFFIX) and name.removesuffix(_SCALE_SUFFIX) in int8)
        and not (name == "lm_head.weight" and config["tie_word_embeddings"])  # tied: transformers ignores it too
        and not _past_the_last_layer(name, config)
    ]
    if unused:
        raise UnsupportedModelError(
            f"{folder} holds tensors this {config['architecture']} variant does not have, e.g. "
            f"{', '.join(unused[:3])}; rsgl does not support this model variant."
        )


# ---------------------------------------------------------------------------------------------
# Tokenizer and generation settings
# ---------------------------------------------------------------------------------------------


def _tokenizer_fields(folder: Path, raw_config: JsonObject, vocab_size: int, skip_tokenizer_init: bool) -> TokenizerFields:
    tokenizer_config = read_optional_json_object(folder / "tokenizer_config.json")
    generation_config = read_optional_json_object(folder / "generation_config.json")
    tokenizer = None if skip_tokenizer_init else _read_tokenizer(folder / "tokenizer.json", vocab_size)
    bos_token = _token_text(tokenizer_config.get("bos_token"))
    eos_token = _token_text(tokenizer_config.get("eos_token"))
    bos_token_id = _token_id(tokenizer, bos_token, raw_config.get("bos_token_id"))
    eos_token_ids = unique_ints(generation_config.get("eos_token_id"), raw_config.get("eos_token_id"), _token_id(tokenizer, eos_token, None))
    if tokenizer is not None:  # a template may need the texts even when tokenizer_config.json lacks them
        bos_token = bos_token or _token_at(tokenizer, bos_token_id)
        eos_token = eos_token or _token_at(tokenizer, eos_token_ids[0] if eos_token_ids else None)
    # Whether the tokenizer's own post-processor already starts every encoding with BOS.
    tokenizer_adds_bos = tokenizer is not None and bos_token_id is not None and tokenizer.encode("a")[:1] == [bos_token_id]
    return TokenizerFields(
        tokenizer=tokenizer,
        chat_template=_chat_template(folder, tokenizer_config),
        bos_token=bos_token,
        eos_token=eos_token,
        add_bos_token=bool(tokenizer_config.get("add_bos_token", False)) and not tokenizer_adds_bos,
        bos_token_id=bos_token_id,
        eos_token_ids=eos_token_ids,
        generation_config=generation_config,
    )


def _read_tokenizer(path: Path, vocab_size: int) -> Tokenizer | None:
    if not path.is_file():
        return None
    try:
        return Tokenizer.from_str(path.read_text(encoding="utf-8"), vocab_size)
    except (OSError, UnicodeDecodeError, ModelLoadError) as error:
        raise ModelLoadError(f"cannot read {path} ({error}); download it again.") from error


def _chat_template(folder: Path, tokenizer_config: JsonObject) -> str | None:
    """transformers 5.x writes `chat_template.jinja`; older folders keep it in tokenizer_config.json,
    as a string or as a list of named templates, or (a vision-language model's processor) in
    `chat_template.json`."""
    template_file = folder / "chat_template.jinja"
    if template_file.is_file():
        return template_file.read_text(encoding="utf-8")
    processor_template = read_optional_json_object(folder / "chat_template.json").get("chat_template")
    template = tokenizer_config.get("chat_template") or processor_template
    if isinstance(template, list):
        return {entry["name"]: entry["template"] for entry in template}.get("default")
    return template


def _token_text(value: str | JsonObject | None) -> str | None:
    """tokenizer_config.json spells a special token as a string or as {"content": ...}."""
    return value.get("content") if isinstance(value, dict) else value


def _token_id(tokenizer: Tokenizer | None, text: str | None, fallback: int | list[int] | None) -> int | None:
    if tokenizer is not None and text is not None and tokenizer.token_to_id(text) is not None:
        return tokenizer.token_to_id(text)
    ids = unique_ints(fallback)
    return ids[0] if ids else None


def _token_at(tokenizer: Tokenizer, token_id: int | None) -> str | None:
    return None if token_id is None else tokenizer.id_to_token(token_id)
