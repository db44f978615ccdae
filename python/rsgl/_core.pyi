"""Type stubs of the Rust extension `rsgl._core` (thin bindings of the rsgl-engine crate)."""

import os
from collections.abc import Sequence

__version__: str

def kernel_isa() -> str:
    """The kernel path chosen for this CPU: "avx512", "avx512-bf16", "avx2", "neon", "neon-bf16", "sve-bf16" or "portable"."""

class WeightStore:
    """A checkpoint's tensors, mapped by the core under Hugging Face names; an Engine takes them
    when it starts (the files are unmapped then)."""

    @staticmethod
    def open_safetensors(paths: Sequence[str | os.PathLike], packing: str | None = None, group_size: int | None = None) -> WeightStore:
        """Maps the safetensors files of a Hugging Face checkpoint (one file or its shards). A grouped
        4-bit checkpoint names its `packing` ("awq", "gptq" or "gptq_v2") and `group_size` (None: one
        group over all of a layer's inputs); each layer's qweight, qzeros, scales and g_idx are then
        listed as one tensor `X.weight` ("AWQ", "GPTQ" or "GPTQ_ACT_ORDER"), read dequantized.
        `packing="ggml_q4_1"` reads rsgl's w4a8 checkpoints: uint8 rows of Q4_1 blocks, listed as
        "Q4_1" tensors `[out, in]`."""
    @staticmethod
    def open_gguf(path: str | os.PathLike, architecture: str, heads: int, kv_heads: int) -> WeightStore:
        """Maps a GGUF file, its tensors named and laid out as in a Hugging Face checkpoint."""
    @staticmethod
    def gguf_metadata_json(path: str | os.PathLike) -> str:
        """A GGUF file's metadata as a JSON object (key -> value)."""
    def tensors(self) -> list[tuple[str, list[int], str]]:
        """(name, shape, storage type such as "BF16", "Q4_K", "I8" or "AWQ") of every tensor."""
    def read(self, name: str) -> bytes:
        """One tensor as little-endian float32 bytes, in Hugging Face layout."""
    def show_progress(self, show: bool) -> None:
        """Whether the engine draws a progress bar of the bytes it packs while loading."""
    def __len__(self) -> int: ...

class Engine:
    """The engine thread. Raises rsgl.errors exceptions on bad models, options or requests."""

    def __init__(
        self,
        config_json: str,
        weights: WeightStore,
        options_json: str,
        eos_token_ids: list[int],
        token_bytes: list[bytes] | None = None,
        special_token_ids: list[int] = ...,
        tokenizer_json: str | None = None,
    ) -> None: ...
    def submit(self, request_json: str, notifier: Notifier | None = None, key: int = 0) -> RequestStream:
        """Queues {"rid", "input_ids", "sampling_params", "return_logprob", "top_logprobs_num",
        "return_prompt_logits", "logprob_start_len", "cache_salt", "group", "think_end_token_ids"}; request errors are raised here.
        With a `notifier`, each of the request's outputs pushes `key` onto it."""
    def check_grammar(self, sampling_params_json: str) -> None:
        """Compiles the grammar of the sampling params (regex, json_schema, ebnf or choices) now;
        raises InvalidRequestError with the backend's message if it is invalid."""
    def abort(self, rid: str) -> None:
        """Aborts the request `rid` and every request whose "group" is `rid`."""
    def flush_cache(self) -> bool:
        """Empties the prefix cache; False (nothing done) while requests are in flight."""
    def stats_json(self) -> str: ...
    def is_running(self) -> bool: ...
    def shutdown(self) -> None: ...

class RequestStream:
    """The outputs of one request, in order."""

    @property
    def rid(self) -> str: ...
    @property
    def done(self) -> bool: ...
    def next_json(self, timeout: float) -> str | None:
        """The next output as JSON ({"token_ids", "text", "logprobs"?, "prompt_logits"?,
        "finished"?}), or None when `timeout` seconds passed first."""
    def try_next_json(self) -> str | None:
        """The next output as JSON if there is one now, else None (for callers woken by a Notifier)."""

class Notifier:
    """Keys of requests with new outputs, and a socket that becomes readable when there are some:
    an event loop watches `fileno()` and calls `take_ready()`, so no thread waits per request."""

    def __init__(self) -> None: ...
    def fileno(self) -> int:
        """The file descriptor that becomes readable when keys are ready."""
    def take_ready(self) -> list[int]:
        """The keys pushed since the last call (a key may appear more than once)."""
