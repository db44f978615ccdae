"""Type stubs of the Rust extension `rsgl._core` (thin bindings of the rsgl-engine crate),
checked against the built module by `python -m mypy.stubtest rsgl._core` in CI. Structured
values cross as plain Python objects read and built by the engine's serde types; their keys
are named in rsgl.core_types (the model config's in rsgl.loader)."""

import os
from collections.abc import Mapping, Sequence
from typing import Any, Literal, final

from rsgl.core_types import EmbedRequest, EngineOptions, EngineStats, GenerateRequest, Output, SamplingParams
from rsgl.loader import ModelConfigFields

__all__ = [
    "WeightStore",
    "ModelConfig",
    "Tokenizer",
    "Engine",
    "RequestStream",
    "Notifier",
    "kernel_isa",
    "architectures",
    "engine_options_schema",
    "relax_json_schema",
    "profile_steps",
    "decode_profile",
    "__version__",
]

__version__: str

def kernel_isa() -> str:
    """The kernel path chosen for this CPU: "avx512", "avx512-bf16", "avx2", "neon", "neon-bf16", "sve-bf16" or "portable"."""

def relax_json_schema(schema: str) -> tuple[str, list[dict[str, str]]]:
    """A JSON schema (JSON text) as the grammar enforces it: rewritten by the schema policy (JSON
    text), and what it relaxes, one `{"keyword", "pointer", "action"}` dict each (none when it is
    enforced as written); raises InvalidRequestError on invalid JSON."""

def profile_steps(on: bool) -> None:
    """Counts engine steps' time by phase from now, zeroing the counters (`on`), or stops counting.
    Process-wide: profile one engine at a time (`benches/compare.py` does, for batch-1 decode)."""

def decode_profile() -> tuple[int, list[dict[str, Any]]]:
    """The decode steps counted since `profile_steps(True)` and each phase's totals over them, one
    dict each: `phase` (its name), `seconds`, `regions` (parallel regions: synchronization
    points), `wait_seconds` (the stepping thread's wait at their ends) and `bytes` (weights and KV
    pages read)."""

def engine_options_schema() -> dict[str, Any]:
    """The engine options' JSON Schema: each option's type, default and help (the Rust doc
    comment), from which `scripts/gen_options.py` writes `rsgl.engine_options` and the docs'
    option table."""

def architectures() -> list[dict[str, Any]]:
    """The architectures the engine runs, one dict each: `name` (rsgl's, the transformers
    model_type), `hf_class`, `gguf_name` (None: no GGUF support yet), `assembly` (where its layers'
    norms sit: `attention` and `mlp`, each `{"pre", "post"}` norm names or None, and `qk_norm`:
    "none", "per_head" or "all_heads"), `attention_bias`, `sliding_window` and `moe` (None for
    dense MLPs)."""

@final
class WeightStore:
    """A checkpoint's tensors, mapped by the core under Hugging Face names; an Engine takes them
    when it starts (the files are unmapped then)."""

    @staticmethod
    def open_safetensors(paths: Sequence[str | os.PathLike[str]], packing: str | None = None, group_size: int | None = None) -> WeightStore:
        """Maps the safetensors files of a Hugging Face checkpoint (one file or its shards). A grouped
        4-bit checkpoint names its `packing` ("awq", "gptq" or "gptq_v2") and `group_size` (None: one
        group over all of a layer's inputs); each layer's qweight, qzeros, scales and g_idx are then
        listed as one tensor `X.weight` ("AWQ", "GPTQ" or "GPTQ_ACT_ORDER"), read dequantized.
        `packing="ggml_q4_1"` reads rsgl's w4a8 checkpoints: uint8 rows of Q4_1 blocks, listed as
        "Q4_1" tensors `[out, in]`."""
    @staticmethod
    def open_gguf(path: str | os.PathLike[str], architecture: str, heads: int, kv_heads: int, mmproj: str | os.PathLike[str] | None = None) -> WeightStore:
        """Maps a GGUF file, its tensors named and laid out as in a Hugging Face checkpoint, with llama.cpp's
        separate projector file (`mmproj`) of a vision-language model's images."""
    @staticmethod
    def open_gguf_lora(name: str, path: str | os.PathLike[str], config: ModelConfig) -> tuple[dict[str, Any], WeightStore]:
        """The GGUF LoRA adapter file `path` (llama.cpp's convert_lora_to_gguf.py) named `name`, for the base
        model of `config`, as the PEFT adapter it was made from: the adapter_config.json it stands for, and
        its tensors under PEFT's names. ModelLoadError for a file that is not a LoRA adapter, or was made
        for another architecture."""
    @staticmethod
    def gguf_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
        """A GGUF file's metadata (key -> value)."""
    def tensors(self) -> list[tuple[str, list[int], str]]:
        """(name, shape, storage type such as "BF16", "Q4_K", "I8" or "AWQ") of every tensor."""
    def read(self, name: str) -> bytes:
        """One tensor as little-endian float32 bytes, in Hugging Face layout."""
    def show_progress(self, show: bool) -> None:
        """Whether the engine draws a progress bar of the bytes it packs while loading."""
    def __len__(self) -> int: ...

@final
class ModelConfig:
    """A model's normalized config, held by the core: the loader reads a copy of its `fields`, and
    the engine takes the config itself. The constructors raise UnsupportedModelError for a model
    rsgl does not run, ModelLoadError for a broken config."""

    @staticmethod
    def from_hf(config: Mapping[str, Any]) -> ModelConfig:
        """The normalized config of a transformers config.json (4.x or 5.x layout)."""
    @staticmethod
    def from_gguf(path: str | os.PathLike[str], mmproj: str | os.PathLike[str] | None = None) -> ModelConfig:
        """The normalized config of a GGUF file, from its metadata and tensors; with llama.cpp's separate
        projector file (`mmproj`), its vision config too (UnsupportedModelError for a projector type rsgl
        does not run)."""
    def with_checkpoint(self, pooling: Literal["last", "mean", "cls"] | None = None, has_lm_head: bool = True) -> ModelConfig:
        """This config with what a folder's other files say: the pooling sentence-transformers
        declares, and whether there is an `lm_head` (tied to the embedding without one)."""
    @property
    def fields(self) -> ModelConfigFields:
        """The config's fields, as a new dict."""

@final
class Tokenizer:
    """The model's tokenizer (a `tokenizer.json`), shared with the engine: prompts are encoded,
    texts decoded and structured output's forced text tokenized by this one instance. Raises
    ModelLoadError for text that is no tokenizer, UnsupportedModelError for a decoder rsgl
    cannot detokenize with (neither byte-level BPE nor SentencePiece style)."""

    @staticmethod
    def from_str(json: str, vocab_size: int | None = None) -> Tokenizer:
        """`vocab_size` is the model's (ids past the tokenizer's own vocabulary decode to nothing);
        None for the tokenizer's own."""
    @staticmethod
    def from_gguf(path: str | os.PathLike[str], vocab_size: int | None = None) -> Tokenizer | None:
        """The tokenizer a GGUF file's metadata describes, as llama.cpp builds it; None for a file
        without a vocabulary."""
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...
    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        """Encodes texts in parallel, without the GIL."""
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...
    def token_to_id(self, token: str) -> int | None: ...
    def id_to_token(self, id: int) -> str | None: ...
    def token_bytes(self, id: int) -> bytes:
        """The bytes a token adds to text, as the engine's detokenizer writes them."""
    def is_special(self, id: int) -> bool:
        """Whether a token is special (left out of text decoded with skip_special_tokens)."""
    @property
    def vocab_size(self) -> int:
        """The model's vocabulary size (the token table's length)."""
    def to_str(self) -> str:
        """The tokenizer as `tokenizer.json` text."""

@final
class Engine:
    """The engine thread. Raises rsgl.errors exceptions on bad models, options or requests."""

    def __new__(
        cls,
        config: ModelConfig,
        weights: WeightStore,
        options: EngineOptions,
        eos_token_ids: list[int],
        tokenizer: Tokenizer | None = None,
        adapters: Sequence[tuple[str, Mapping[str, Any], WeightStore]] = ...,
    ) -> Engine:
        """`tokenizer` read with the config's vocab_size; `adapters` the LoRA adapters
        `options["lora_paths"]` names: (name, adapter_config.json's object, its weights)."""
    def submit(self, request: GenerateRequest, notifier: Notifier | None = None, key: int = 0) -> RequestStream:
        """Queues a request; request errors are raised here. With a `notifier`, each of the
        request's outputs pushes `key` onto it."""
    def embed(self, request: EmbedRequest, notifier: Notifier | None = None, key: int = 0) -> RequestStream:
        """Queues a prompt to embed on an engine started with `is_embedding` (InvalidRequestError
        otherwise); its one output carries `embedding`. `notifier` as in `submit`."""
    def check_grammar(self, sampling_params: SamplingParams) -> None:
        """Compiles the grammar of the sampling params (regex, json_schema, ebnf or choices) now;
        raises InvalidRequestError with the backend's message if it is invalid."""
    def abort(self, rid: str) -> None:
        """Aborts the request `rid` and every request whose "group" is `rid`."""
    def load_lora_adapter(self, name: str, adapter_config: Mapping[str, Any], weights: WeightStore) -> None:
        """Loads a LoRA adapter requests may name from then on (taken as `adapters` are); a name
        already loaded raises InvalidRequestError, an adapter that does not fit ModelLoadError."""
    def unload_lora_adapter(self, name: str) -> None:
        """Unloads the LoRA adapter `name`; InvalidRequestError while requests use it, or for a
        name not loaded."""
    def lora_adapters(self) -> list[str]:
        """The names of the LoRA adapters loaded."""
    def flush_cache(self) -> bool:
        """Empties the prefix cache; False (nothing done) while requests are in flight."""
    def stats(self) -> EngineStats:
        """Engine counters."""
    def is_running(self) -> bool: ...
    def shutdown(self) -> None:
        """Stops the engine thread; requests in flight end with an abort."""

@final
class RequestStream:
    """The outputs of one request, in order."""

    @property
    def rid(self) -> str: ...
    @property
    def done(self) -> bool: ...
    def next(self, timeout: float) -> Output | None:
        """The next output, or None when `timeout` seconds passed first."""
    def try_next(self) -> Output | None:
        """The next output if there is one now, else None (for callers woken by a Notifier)."""

@final
class Notifier:
    """Keys of requests with new outputs, and a socket that becomes readable when there are some:
    an event loop watches `fileno()` and calls `take_ready()`, so no thread waits per request."""

    def __new__(cls) -> Notifier: ...
    def fileno(self) -> int:
        """The file descriptor that becomes readable when keys are ready."""
    def take_ready(self) -> list[int]:
        """The keys pushed since the last call (a key may appear more than once)."""
