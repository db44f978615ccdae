"""GGUF files (llama.cpp's format): the Rust core reads the config from the metadata
(`rsgl._core.ModelConfig.from_gguf`) and maps the weights (`WeightStore.open_gguf`), naming and laying them
out as a Hugging Face checkpoint (GGUF lists dimensions innermost first; llama.cpp's converter
permutes the q/k rows of llama models and stacks the experts of mixture-of-experts layers) and
dequantizing them as it packs; it builds the tokenizer the metadata describes as llama.cpp does
(`Tokenizer.from_gguf`).

A vision-language model's image encoder is a separate file in llama.cpp's layout, its projector
(`convert_hf_to_gguf.py --mmproj` writes `mmproj-NAME.gguf`): given as `mmproj`, or found beside the
model. The core reads the tower's config from its `clip.vision.*` metadata and maps its tensors
under the Hugging Face checkpoint's names (SmolVLM's, Idefics3's, Gemma 3's, Qwen2.5-VL's).
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

from rsgl._core import ModelConfig, Tokenizer, WeightStore
from rsgl.errors import ModelLoadError, UnsupportedModelError
from rsgl.loader import (
    WEIGHT_DTYPE_PROBE,
    LoadedModel,
    Tensors,
    TokenizerFields,
    check_tensor_shapes,
    unique_ints,
)

_NATIVE_DTYPE = {"F32": "float32"}
# Storage types whose weights are not quantized (a file of these runs in `dtype`).
_FLOAT_TYPES = ("F32", "F16", "BF16")
# Tensors the config reads (Phi-3's LongRoPE factors).
_CONFIG_TENSORS = ("rope_factors_long.weight", "rope_factors_short.weight")
# Where a vision-language model keeps its image encoder's tensors (a projector file's, once mapped).
_VISION_TENSORS = ("model.vision_model.", "model.connector.", "model.multi_modal_projector.", "visual.")

logger = logging.getLogger(__name__)


def load(path: Path, *, skip_tokenizer_init: bool, mmproj: str | os.PathLike[str] | None = None) -> LoadedModel:
    config = ModelConfig.from_gguf(path)  # before anything else: an unsupported or broken file fails at once
    projector = projector_file(path, mmproj)
    if projector is not None:
        try:
            config = ModelConfig.from_gguf(path, projector)
        except UnsupportedModelError as error:
            if mmproj is not None:
                raise
            # A projector found beside the model, of a model whose images rsgl does not read yet: text still runs.
            logger.warning("%s; running %s on text only", error, path.name)
            projector = None
    fields = config.fields
    open_weights = functools.partial(
        WeightStore.open_gguf, path, fields["architecture"], fields["num_attention_heads"], fields["num_key_value_heads"], projector
    )
    tensors: Tensors = {name: (tuple(shape), stored) for name, shape, stored in open_weights().tensors()}
    shapes = {name: shape for name, (shape, _) in tensors.items()}
    check_tensor_shapes(shapes, fields, path if projector is None else f"{path} with {projector}")
    unknown = sorted(name for name in shapes if not name.startswith(("model.", "lm_head.", *_VISION_TENSORS)) and name not in _CONFIG_TENSORS)
    if unknown:
        raise UnsupportedModelError(f"{path} holds a tensor rsgl does not know ({unknown[0]}); this model variant is not supported.")
    probe = WEIGHT_DTYPE_PROBE if WEIGHT_DTYPE_PROBE in tensors else "model.embed_tokens.weight"
    # The language model's tensors say how the model runs; the image encoder packs its own in that dtype.
    text_types = [stored for name, (_, stored) in tensors.items() if not name.startswith(_VISION_TENSORS)]
    return LoadedModel(
        config=config,
        open_weights=open_weights,
        source=str(path),
        model_name=path.stem,
        mmproj=None if projector is None else str(projector),
        # float32 files compute in float32; F16, BF16 and quantized ones in bfloat16, the fast 16-bit
        # path on CPUs (vLLM's CPU backend casts float16 to bfloat16 too); dtype="float16" keeps F16.
        dtype=_NATIVE_DTYPE.get(tensors[probe][1], "bfloat16"),
        # A quantized file (any tensor quantized: a gpt-oss file's MXFP4 experts beside float
        # embeddings too) runs in its own quantization, as llama.cpp runs it: the core packs the
        # blocks it has integer kernels for as they are, the rest in `dtype`.
        quantization=None if all(stored in _FLOAT_TYPES for stored in text_types) else "gguf",
        **vars(_tokenizer_fields(path, fields["vocab_size"], skip_tokenizer_init)),
    )


def projector_file(model: Path, mmproj: str | os.PathLike[str] | None) -> Path | None:
    """The projector file of the GGUF model `model`: `mmproj` if given, else the one beside it (a .gguf file
    named with "mmproj", as llama.cpp's converter names them), or None. Raises ModelLoadError for a given file
    that does not exist, and for a folder holding several projector files."""
    if mmproj is not None:
        given = Path(mmproj).expanduser()
        if not given.is_file():
            raise ModelLoadError(f"no such projector file: {given}; pass the path of the model's mmproj-*.gguf (llama.cpp's convert_hf_to_gguf.py --mmproj)")
        return given
    beside = sorted(file for file in model.parent.glob("*.gguf") if "mmproj" in file.name.lower() and file != model)
    if len(beside) > 1:
        names = ", ".join(file.name for file in beside)
        raise ModelLoadError(f"{model.parent} holds several projector files ({names}); pass the one made for {model.name} as mmproj (--mmproj)")
    return beside[0] if beside else None


# Tokens that end a turn beside the file's one eos id, by their text, as llama.cpp adds them: harmony's
# (gpt-oss) `<|return|>` after an answer and `<|call|>` after a tool call (its Hugging Face
# generation_config lists both; its GGUF files keep only the first).
TURN_END_TEXTS = ("<|return|>", "<|call|>")


def _tokenizer_fields(path: Path, vocab_size: int, skip_tokenizer_init: bool) -> TokenizerFields:
    metadata = WeightStore.gguf_metadata(path)
    tokens = metadata.get("tokenizer.ggml.tokens")
    roles = ("bos", "eos", "eot", "unknown", "padding")
    ids = {role: metadata.get(f"tokenizer.ggml.{role}_token_id") for role in roles}
    turn_ends = [index for index, text in enumerate(tokens or ()) if text in TURN_END_TEXTS]
    model = metadata.get("tokenizer.ggml.model", "none")
    tokenizer = None if skip_tokenizer_init else Tokenizer.from_gguf(path, vocab_size)

    def text_of(token_id: int | None) -> str | None:
        return tokens[token_id] if tokens is not None and token_id is not None else None

    return TokenizerFields(
        tokenizer=tokenizer,
        chat_template=metadata.get("tokenizer.chat_template"),
        bos_token=text_of(ids["bos"]),
        eos_token=text_of(ids["eos"]),
        # llama.cpp adds BOS for SentencePiece vocabularies unless the file says otherwise.
        add_bos_token=bool(metadata.get("tokenizer.ggml.add_bos_token", model == "llama")),
        bos_token_id=ids["bos"],
        eos_token_ids=unique_ints(ids["eos"], ids["eot"], *turn_ends),
        generation_config={},
    )
