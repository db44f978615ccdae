"""The values that cross between Python and the Rust core (`rsgl._core`), as the engine's serde
types read and build them: plain dicts whose keys these TypedDicts name.
`tests/unit/test_core_stubs.py` checks them against the engine (an unknown key is refused there, and
the refusal lists the known ones; outputs and statistics carry no key left out here). The engine's
options, `EngineOptions`, are generated from the Rust struct into `rsgl.engine_options`."""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

from rsgl.engine_options import EngineOptions as EngineOptions


class SamplingParams(TypedDict, total=False):
    """SGLang's `sampling_params`; every key is optional."""

    max_new_tokens: int
    min_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repetition_penalty: float
    frequency_penalty: float
    presence_penalty: float
    stop: list[str]
    stop_token_ids: list[int]
    ignore_eos: bool
    skip_special_tokens: bool
    no_stop_trim: bool
    seed: int | None
    # Token id (an int, or a string of digits as JSON keys are) -> bias added to its logit, in [-100, 100].
    logit_bias: dict[int, float] | dict[str, float] | None
    regex: str | None
    json_schema: str | dict[str, Any] | None
    ebnf: str | None
    choices: list[str] | None
    # Refuse (400) a json_schema the grammar would relax, instead of reporting the relaxations.
    strict_json_schema: bool


class GenerateRequest(TypedDict):
    rid: str
    input_ids: list[int]
    sampling_params: NotRequired[SamplingParams]
    return_logprob: NotRequired[bool]
    top_logprobs_num: NotRequired[int]
    return_prompt_logits: NotRequired[bool]
    logprob_start_len: NotRequired[int | None]
    cache_salt: NotRequired[str | None]
    group: NotRequired[str | None]
    think_end_token_ids: NotRequired[list[int] | None]
    images: NotRequired[list[ImageInput]]
    lora_path: NotRequired[str | None]  # a LoRA adapter's name (one of the engine's lora_paths)


class ImageInput(TypedDict):
    """An image of a prompt, preprocessed: its tiles' (or patches') float32 pixel values and a hash of the picture."""

    hash: str
    pixel_values: bytes
    grid_thw: NotRequired[list[int]]  # Qwen2.5-VL's patch grid: frames, rows, columns


class EmbedRequest(TypedDict):
    """A prompt to embed, on an engine started with `is_embedding`."""

    rid: str
    input_ids: list[int]


class TopLogprob(TypedDict):
    token_id: int
    logprob: float


class TokenLogprob(TypedDict):
    token_id: int
    logprob: float
    top: list[TopLogprob]


class FinishReason(TypedDict):
    """SGLang's `meta_info.finish_reason`: "stop" carries `matched` (a token id, a stop string,
    or None when a grammar completed), "length" `length`, "abort" `message`."""

    type: Literal["stop", "length", "abort"]
    matched: NotRequired[int | str | None]
    length: NotRequired[int]
    message: NotRequired[str]


class Finished(TypedDict):
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    decode_steps: int
    spec_verify_ct: int
    spec_draft_tokens: int
    spec_accepted_tokens: int
    queue_time: float


class Output(TypedDict):
    """One step's worth of a request's output; the last one carries `finished`."""

    token_ids: list[int]
    text: str
    logprobs: NotRequired[list[TokenLogprob]]
    prompt_logits: NotRequired[list[float]]
    input_token_logprobs: NotRequired[list[TokenLogprob]]
    embedding: NotRequired[list[float]]  # an embedding request's pooled, L2-normalized vector
    finished: NotRequired[Finished]


class GrammarStats(TypedDict):
    compiled: int
    cache_hits: int
    compile_seconds: float


class HiCacheStats(TypedDict):
    """The disk tier of the prefix cache (`hicache_dir`): its file, what it holds and what it did."""

    path: str
    capacity_pages: int
    used_pages: int
    hit_tokens: int  # the part of cache_hit_tokens read back from disk
    read_pages: int
    read_bytes: int
    written_pages: int
    written_bytes: int
    dropped_pages: int  # not written: the writer was too far behind, or its write failed
    rejected_pages: int  # failed their checks when read: recomputed
    recovered_pages: int  # indexed at start-up
    ignored_records: int  # truncated or corrupt at start-up
    startup: str


class EngineStats(TypedDict):
    """Counters the engine publishes after every step."""

    kernels: str
    int8_kernels: str
    threads: int
    tp_size: int
    dtype: str
    quantization: str | None
    activation_bits: int
    running_requests: int
    waiting_requests: int
    kv_cache_dtype: Literal["float32", "bfloat16", "int8"]
    kv_pages_total: int
    kv_pages_free: int
    page_size: int
    max_total_tokens: int
    context_length: int
    radix_cache: bool
    cached_pages: int
    kv_window_pages_total: int
    kv_window_pages_free: int
    window_cached_pages: int
    sliding_window: int
    state_slots_total: int
    state_slots_free: int
    state_snapshots: int
    state_slot_bytes: int
    prompt_tokens: int
    cache_hit_tokens: int
    cache_hit_rate: float
    hicache: HiCacheStats | None
    computed_prompt_tokens: int
    generated_tokens: int
    retracted_requests: int
    grammar_waiting_requests: int
    forced_tokens: int
    spec_verify_steps: int
    spec_draft_tokens: int
    spec_accepted_tokens: int
    spec_step_fixed_seconds: float
    spec_step_row_seconds: float
    spec_step_key_seconds: float
    grammar: GrammarStats | None
    steps: int
    last_step_tokens: int
    schedule_seconds: float
    forward_seconds: float
    sample_seconds: float
    grammar_seconds: float
    last_step_seconds: float
