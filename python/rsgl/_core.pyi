"""Type stubs of the Rust extension `rsgl._core` (thin bindings of the rsgl-engine crate)."""

from collections.abc import Sequence
from typing import Any

__version__: str

def kernel_isa() -> str:
    """The kernel path chosen for this CPU: "avx2", "neon" or "portable"."""

class WeightStore:
    """Tensors handed to the engine one at a time; an Engine takes them all."""

    def __init__(self) -> None: ...
    def add(self, name: str, shape: Sequence[int], data: Any) -> None:
        """Copies a C-contiguous float32 buffer (e.g. a numpy array) under `name`."""
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
    def submit(self, request_json: str) -> RequestStream:
        """Queues {"rid", "input_ids", "sampling_params", "return_logprob", "top_logprobs_num",
        "return_prompt_logits", "logprob_start_len", "cache_salt", "group", "think_end_token_ids"}; request errors are raised here."""
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
