"""`rsgl.Engine`: the offline engine, shaped like `sglang.Engine`.

    with rsgl.Engine() as llm:                       # the default model
        out = llm.generate("The capital of France is", {"temperature": 0, "max_new_tokens": 8})
        print(out["text"], out["meta_info"]["finish_reason"])

The model runs in Rust on its own thread; every call that waits releases the GIL, so several
Python threads (or an asyncio loop) can submit at once and their requests are batched together.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import secrets
import threading
import time
import uuid
import weakref
from collections.abc import AsyncGenerator, Callable, Generator, Iterator, Sequence
from typing import Any, Literal, TypedDict, Unpack, cast, get_args, overload

import orjson

from rsgl import _core
from rsgl._typing import JsonObject
from rsgl.chat_template import render_chat
from rsgl.core_types import EmbedRequest, GenerateRequest, ImageInput, Output, SamplingParams, TokenLogprob
from rsgl.embeddings import EmbedInput, embed_requests, embedding_result
from rsgl.engine_options import DEFAULTS, EngineKeywords, EngineOptions, KvCacheDtype, Quantization
from rsgl.errors import InvalidRequestError, ModelLoadError
from rsgl.loader import load_model
from rsgl.loader.lora import read_lora_adapter, read_lora_adapters
from rsgl.vision.images import ImageSource
from rsgl.vision.prompt_images import prompt_images_for

# Seconds a blocked call waits in Rust before returning to Python (to notice Ctrl-C).
_POLL_SECONDS = 0.2

logger = logging.getLogger("rsgl")

# OpenAI's upper bound on `n`; the default of `max_n`.
DEFAULT_MAX_N = 128
# Sequences one call may start (prompts times n), so a single request cannot fill the server.
DEFAULT_MAX_SEQUENCES_PER_CALL = 1024

# Enough prompt tokens to hold a think-end token and the whitespace a template puts after it.
THINK_END_TAIL_TOKENS = 16

# The sampling_params that constrain the output (at most one per request).
_GRAMMAR_KEYS = ("json_schema", "regex", "ebnf", "choices")

# Defaults a model's generation_config.json may set, as SGLang applies them.
_MODEL_SAMPLING_DEFAULTS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")

# SGLang sampling params with nothing to do here: SGLang's frontend sends spaces_between_special_tokens
# with every gen, and it only affects slow (Python) tokenizers' decoding, which rsgl never uses.
_IGNORED_SAMPLING_KEYS = ("spaces_between_special_tokens",)

# SGLang-shaped results: {"text", "output_ids", "meta_info"}; one per prompt and sample.
Result = JsonObject
# What `sampling_params` takes: SGLang's keys, plus `n` (checked and taken off by the engine).
SamplingArgument = JsonObject | list[JsonObject] | None


class GenerateOptions(TypedDict, total=False):
    """`generate`'s keyword options after `prompt` and `sampling_params` (see `generate`)."""

    input_ids: list[int] | list[list[int]] | None
    return_logprob: bool
    top_logprobs_num: int
    rid: str | list[str] | None
    return_prompt_logits: bool
    logprob_start_len: int | None
    json_schema: JsonObject | str | None
    regex: str | None
    ebnf: str | None
    choices: list[str] | None
    # Images for a text prompt's image placeholders (a vision-language model's): one list per prompt, or one list
    # (or one image) for a single prompt; each bytes, a data URL, base64 text or a PIL image.
    image_data: ImageSource | list[ImageSource] | list[list[ImageSource]] | None
    # The LoRA adapter (a name of lora_paths, or one loaded since) each prompt generates with: one for all, or one per prompt (None: the base model).
    lora_path: str | list[str | None] | None


class Engine:
    """Loads a model and serves generation requests in-process.

    `model_path` is a Hugging Face model folder, a .gguf file, or a Hugging Face Hub id ("org/name",
    or "org/name-GGUF:Q4_K_M" for one quantization of a repo of GGUF files) fetched into the
    Hugging Face cache, at `revision` (a branch, tag or commit; default main); None serves the
    default model, SmolLM2-135M-Instruct, its weights requantized to W8A8 int8 (the precision that
    answers best for it) unless `dtype` or `quantization` say otherwise.

    Options are named after SGLang's server arguments. The engine's are keyword arguments typed by
    `rsgl.engine_options.EngineKeywords` (`page_size`, `max_running_requests`, `threads`,
    `is_embedding`, `speculative_algorithm`, ...), generated from the Rust engine's options with
    their help and defaults (also in docs/engine.md#options and `python -m rsgl.server --help`).
    This class resolves a few engine options itself: `dtype` ("auto": float32 for float32
    checkpoints, else bfloat16; "float32", "bfloat16", "float16"), `kv_cache_dtype` (None: int8
    for 16-bit and int8 weights, float32 otherwise: `default_kv_cache_dtype`), `quantization`
    (None: the checkpoint's, a quantized GGUF, AWQ, GPTQ or MXFP4 file running as stored),
    `random_seed` (seeds every request that gives no `seed`; None draws one at start-up, logged,
    so two engines do not replay the same samples) and `hicache_dir` (the prefix cache's disk
    tier's folder; a path object too). Its own: `revision`, `mmproj` (a GGUF vision-language
    model's projector file, llama.cpp's `mmproj-*.gguf`; None: the one beside the model, if any),
    `max_n` (the largest `n`),
    `max_sequences_per_call` (prompts times `n` of one call), `skip_tokenizer_init` (token ids in
    and out), `served_model_name`, `progress` (loading progress bar), `think_end_token` (for
    reasoning models, e.g. "</think>": a grammar applies only after the output contains it, so
    the model thinks freely first; at once if the prompt ends with it, as templates with thinking
    turned off close it there), `strict_json_schema` (refuse a JSON schema with keywords the
    grammar relaxes, instead of reporting them in `meta_info`'s `json_schema_warnings`; a
    request's own `strict_json_schema` sampling param overrides it).

    Structured output: `generate(..., json_schema=..., regex=..., ebnf=..., choices=...)` (or the
    same keys in `sampling_params`, as SGLang takes them) constrains the output; `select` ranks
    given continuations by log-probability; `check_grammar` reports a bad grammar at once.
    """

    def __init__(
        self,
        model_path: str | None = None,
        *,
        revision: str | None = None,
        mmproj: str | os.PathLike[str] | None = None,
        dtype: str = "auto",
        kv_cache_dtype: KvCacheDtype | None = None,
        quantization: Quantization | None = None,
        random_seed: int | None = None,
        hicache_dir: str | os.PathLike[str] | None = None,
        max_n: int = DEFAULT_MAX_N,
        max_sequences_per_call: int = DEFAULT_MAX_SEQUENCES_PER_CALL,
        skip_tokenizer_init: bool = False,
        served_model_name: str | None = None,
        progress: bool = True,
        think_end_token: str | None = None,
        strict_json_schema: bool = False,
        **options: Unpack[EngineKeywords],
    ) -> None:
        unknown = options.keys() - EngineKeywords.__optional_keys__
        if unknown:
            raise TypeError(f"Engine() got unexpected keyword arguments {sorted(unknown)}; the engine's options are in docs/engine.md#options")
        for name, value, supported in (("quantization", quantization, get_args(Quantization)), ("kv_cache_dtype", kv_cache_dtype, get_args(KvCacheDtype))):
            # Before the model loads, which can take long.
            if value is not None and value not in supported:
                raise InvalidRequestError(f"{name}={value!r} is not supported; use one of {supported} or None")
        if random_seed is None:
            random_seed = secrets.randbits(63)
            logger.info("random_seed %d drawn at start-up (pass random_seed to reproduce a run)", random_seed)
        self.random_seed = random_seed
        self.max_n = max_n
        self.max_sequences_per_call = max_sequences_per_call
        self.model = load_model(model_path, dtype=dtype, revision=revision, skip_tokenizer_init=skip_tokenizer_init, progress=progress, mmproj=mmproj)
        if quantization is not None:
            self.model.precision_note = None  # the precision asked for, not the default model's
        stored = self.model.stored_quantization
        if quantization in ("awq", "gptq", "mxfp4") and quantization != stored:
            raise InvalidRequestError(
                f"quantization={quantization!r} runs {quantization.upper()} checkpoints as they are stored, and "
                f"{self.model.source} holds {f'{stored} weights' if stored else 'float weights'}. A 4-bit AWQ, GPTQ or MXFP4 "
                "checkpoint runs as stored without the option; to quantize float weights at load use 'w4a8' (4-bit) or 'w8a8_int8'."
            )
        self.tokenizer = self.model.tokenizer
        self.model_config = self.model.config.fields  # read only: the engine runs on the core's own config
        self._text_only_because = ""
        try:
            self._prompt_images = prompt_images_for(self.model)
        except ModelLoadError as error:  # a folder without its image processor's files still runs on text
            self._prompt_images, self._text_only_because = None, f" ({error})"
            logger.warning("%s reads text only: its image processor could not be read: %s", self.model.source, error)
        self.served_model_name = served_model_name or self.model.model_name
        self.is_embedding = options.get("is_embedding", DEFAULTS["is_embedding"])
        # A W8A8, AWQ or GPTQ checkpoint runs as stored without being asked.
        quantization = quantization or cast(Quantization | None, self.model.quantization)
        resolved = {
            "dtype": self.model.dtype,
            "quantization": quantization,
            "kv_cache_dtype": kv_cache_dtype or default_kv_cache_dtype(self.model.dtype, quantization),
            "random_seed": random_seed,
            "hicache_dir": None if hicache_dir is None else os.fspath(hicache_dir),
        }
        # Folders as text for the engine (path objects are taken too).
        self.lora_paths = {name: os.fspath(path) for name, path in (options.get("lora_paths") or {}).items()}
        adapters = read_lora_adapters(self.lora_paths, self.model.config)
        # Serializes run-time loads and unloads, so lora_paths follows the engine's adapters.
        self._lora_lock = threading.Lock()
        store = self.model.open_weights()
        store.show_progress(progress)
        self._core = _core.Engine(
            self.model.config,
            store,
            cast(EngineOptions, {**options, **resolved, "lora_paths": self.lora_paths}),  # checked by the engine, which names a bad value
            self.model.eos_token_ids,
            tokenizer=self.tokenizer,
            adapters=adapters,
        )
        self._loop_wakeups: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWakeups] = weakref.WeakKeyDictionary()
        self._think_end_token = think_end_token if self.tokenizer else None
        self._think_end_ids = self.tokenizer.encode(think_end_token, add_special_tokens=False) if think_end_token and self.tokenizer else None
        self._sampling_defaults = {k: v for k, v in self.model.generation_config.items() if k in _MODEL_SAMPLING_DEFAULTS and v is not None}
        self.strict_json_schema = strict_json_schema
        if strict_json_schema:
            # A server-wide default; a request's own strict_json_schema overrides it.
            self._sampling_defaults["strict_json_schema"] = True

    # ---- generation -------------------------------------------------------------------------

    @overload
    def generate(
        self, prompt: str | list[str] | None = None, sampling_params: SamplingArgument = None, *, stream: Literal[True], **options: Unpack[GenerateOptions]
    ) -> Generator[Result, None, None]: ...

    @overload
    def generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: SamplingArgument = None,
        *,
        stream: Literal[False] = False,
        **options: Unpack[GenerateOptions],
    ) -> Result | list[Result]: ...

    def generate(
        self, prompt: str | list[str] | None = None, sampling_params: SamplingArgument = None, *, stream: bool = False, **options: Unpack[GenerateOptions]
    ) -> Result | list[Result] | Generator[Result, None, None]:
        """Generates for one prompt (a dict back) or a list of prompts (a list back, run as one
        batch). `stream=True` (single prompt) returns an iterator of chunks whose `text` and
        `output_ids` grow, the last one with `finish_reason` set, as SGLang does.
        `return_prompt_logits` adds the logits after the last prompt token to `meta_info`;
        `logprob_start_len` (with `return_logprob`) fills `input_token_logprobs`, SGLang's
        `(logprob, token_id, None)` for each prompt token from that position (None for position 0;
        empty without it), and with `top_logprobs_num` `input_top_logprobs`, the best alternatives
        at each.
        `json_schema` (a dict or JSON text), `regex`, `ebnf` (a Lark grammar) or `choices`
        constrain the output of every prompt; an invalid one raises InvalidRequestError."""
        requests, single = self._build_requests(prompt, sampling_params, options)
        if stream:
            return self._stream(self._stream_request(requests))
        started = time.perf_counter()
        handles = [self._submit(r) for r in requests]
        results = [self._collect(r, h, started) for r, h in zip(requests, handles)]
        return results[0] if single else results

    def _generate_deltas(
        self, prompt: str | list[str] | None = None, sampling_params: SamplingArgument = None, **options: Unpack[GenerateOptions]
    ) -> Generator[Result, None, None]:
        """`generate(stream=True)` whose chunks hold only what each adds (see `_async_generate_deltas`)."""
        return self._stream(self._stream_request(self._build_requests(prompt, sampling_params, options)[0]), deltas=True)

    def _stream_request(self, requests: list[GenerateRequest]) -> GenerateRequest:
        """The one request (one prompt, n=1) of a stream, its grammar compiled now so a bad one
        raises before the caller starts reading the stream."""
        request = self._only(requests)
        self.check_grammar(request["sampling_params"])
        return request

    @overload
    async def async_generate(
        self, prompt: str | list[str] | None = None, sampling_params: SamplingArgument = None, *, stream: Literal[True], **options: Unpack[GenerateOptions]
    ) -> AsyncGenerator[Result, None]: ...

    @overload
    async def async_generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: SamplingArgument = None,
        *,
        stream: Literal[False] = False,
        **options: Unpack[GenerateOptions],
    ) -> Result | list[Result]: ...

    async def async_generate(
        self, prompt: str | list[str] | None = None, sampling_params: SamplingArgument = None, *, stream: bool = False, **options: Unpack[GenerateOptions]
    ) -> Result | list[Result] | AsyncGenerator[Result, None]:
        """`generate` for asyncio code: waits without blocking the event loop; with
        `stream=True`, returns an async iterator of chunks."""
        requests, single = await self._abuild_requests(prompt, sampling_params, options)
        if stream:
            return self._astream(*await self._astart_stream(requests))
        wakeups = self._wakeups()
        started = time.perf_counter()
        handles = [wakeups.submit(functools.partial(self._core.submit, r)) for r in requests]
        results = await asyncio.gather(*(self._acollect(r, h, started) for r, h in zip(requests, handles)))
        return results[0] if single else list(results)

    async def _async_generate_deltas(
        self, prompt: str | list[str] | None = None, sampling_params: SamplingArgument = None, **options: Unpack[GenerateOptions]
    ) -> AsyncGenerator[Result, None]:
        """`async_generate(stream=True)` whose chunks hold only what each adds (SGLang's
        incremental streaming shape): its `text`, `output_ids` and their log-probabilities, with
        `meta_info`'s counts and finish reason as whole chunks have them. The server's OpenAI,
        Anthropic and Responses streams read these, so no chunk costs more as the answer grows."""
        return self._astream(*await self._astart_stream((await self._abuild_requests(prompt, sampling_params, options))[0]), deltas=True)

    async def _astart_stream(self, requests: list[GenerateRequest]) -> tuple[GenerateRequest, _AsyncHandle]:
        """Submits a streamed request (one prompt, n=1); a bad grammar or a request the engine
        refuses raises here, before any chunk is awaited."""
        request = self._only(requests)
        if _has_grammar(request["sampling_params"]):
            # Compiled off the loop, so a bad grammar fails the request before it streams.
            await asyncio.to_thread(self.check_grammar, request["sampling_params"])
        return request, self._wakeups().submit(functools.partial(self._core.submit, request))

    # ---- embeddings ----------------------------------------------------------------------------

    def encode(self, prompt: EmbedInput) -> Result | list[Result]:
        """SGLang's `Engine.encode` (an engine started with `is_embedding=True`): the embedding of a
        text or a list of token ids (a dict back), or of each of a list of them (a list back, run
        as one batch): `{"embedding": [...], "meta_info": {...}}`, pooled as the model's config
        says (last token by default) and L2-normalized."""
        requests, single = embed_requests(prompt, self.tokenize, self.max_sequences_per_call)
        started = time.perf_counter()
        handles = [self._core.embed(r) for r in requests]
        results = [embedding_result(r, self._final_output(r, h), started) for r, h in zip(requests, handles)]
        return results[0] if single else results

    async def async_encode(self, prompt: EmbedInput) -> Result | list[Result]:
        """`encode` for asyncio code: waits without blocking the event loop."""
        requests, single = embed_requests(prompt, self.tokenize, self.max_sequences_per_call)
        wakeups = self._wakeups()
        started = time.perf_counter()
        handles = [wakeups.submit(functools.partial(self._core.embed, r)) for r in requests]
        outputs = await asyncio.gather(*(self._afinal_output(r, h) for r, h in zip(requests, handles)))
        results = [embedding_result(r, out, started) for r, out in zip(requests, outputs)]
        return results[0] if single else results

    def select(self, prompt: str, choices: Sequence[str], normalize: bool = True) -> JsonObject:
        """Which of `choices` the model finds likeliest after `prompt`, as SGLang's `select`: each
        continuation is scored by its tokens' log-probabilities (their mean, or with
        `normalize=False` their sum), all scored in one batch sharing the prompt's cached KV.
        Returns `{"text", "index", "logprobs", "normalized_logprobs"}` (one score per choice)."""
        check_choices(prompt, choices)
        prompt_ids = self.tokenize(prompt)
        requests: list[GenerateRequest] = []
        for choice in choices:
            ids = self.tokenize(prompt + choice)
            sampling = {"max_new_tokens": 0, "temperature": 0}
            scoring: GenerateOptions = {"input_ids": ids, "return_logprob": True, "logprob_start_len": continuation_start(prompt_ids, ids)}
            requests += self._build_requests(None, sampling, scoring)[0]
        started = time.perf_counter()
        handles = [self._submit(r) for r in requests]
        results = [self._collect(r, h, started) for r, h in zip(requests, handles)]
        return rank_choices(choices, [[lp for lp, _, _ in r["meta_info"]["input_token_logprobs"]] for r in results], normalize)

    def check_grammar(self, sampling_params: SamplingParams | JsonObject) -> None:
        """Compiles the grammar in `sampling_params` (regex, json_schema, ebnf or choices) now,
        raising InvalidRequestError with the grammar backend's message if it is invalid. The
        compiled grammar is cached, so a request using it next starts without compiling."""
        self._core.check_grammar(cast(SamplingParams, sampling_params))

    def chat(self, messages: list[JsonObject], sampling_params: JsonObject | None = None, **kwargs: Any) -> Result | list[Result] | Iterator[Result]:
        """Generates a reply to `messages` rendered with the model's chat template."""
        return self.generate(prompt=self.apply_chat_template(messages), sampling_params=sampling_params, **kwargs)  # type: ignore[no-any-return]

    def apply_chat_template(self, messages: list[JsonObject], add_generation_prompt: bool = True, **extra: Any) -> str:
        self._need_tokenizer("chat")
        return render_chat(
            self.model.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.model.bos_token,
            eos_token=self.model.eos_token,
            **extra,
        )

    def tokenize(self, text: str) -> list[int]:
        """A text's prompt ids, BOS first when the model wants one."""
        return self._with_bos(self._need_tokenizer("text prompts").encode(text))

    def tokenize_batch(self, texts: list[str]) -> list[list[int]]:
        """Each text's prompt ids as `tokenize` gives them, encoded in parallel without the GIL."""
        return [self._with_bos(ids) for ids in self._need_tokenizer("text prompts").encode_batch(texts)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._need_tokenizer("decoding").decode(list(ids), skip_special_tokens=skip_special_tokens)

    def abort_request(self, rid: str) -> None:
        """Aborts a request (for n > 1, every sample of it) wherever it is."""
        self._core.abort(rid)

    def flush_cache(self) -> bool:
        """Empties the prefix cache. Returns False, doing nothing, while requests are in flight."""
        return self._core.flush_cache()

    # ---- LoRA adapters -------------------------------------------------------------------------

    @property
    def lora_names(self) -> list[str]:
        """The names of the LoRA adapters requests may name now."""
        return sorted(self.lora_paths)

    def load_lora_adapter(self, lora_name: str, lora_path: str | os.PathLike[str]) -> JsonObject:
        """Loads the PEFT adapter in the folder `lora_path` under `lora_name`, as SGLang's
        `Engine.load_lora_adapter` does: requests may name it from then on. It is read and checked
        on the calling thread, and the engine adds it between two steps. Returns SGLang's result,
        `{"success": True, "error_message": "", "loaded_adapters": {name: path}}`. A name already
        loaded raises InvalidRequestError; an adapter that does not fit the model or max_lora_rank,
        ModelLoadError (UnsupportedModelError for a model that takes no adapters)."""
        path = os.fspath(lora_path)
        adapter = read_lora_adapter(lora_name, path, self.model.config)
        with self._lora_lock:
            self._core.load_lora_adapter(*adapter)
            # A new dict, not an update: readers on other threads may be iterating the old one.
            self.lora_paths = {**self.lora_paths, lora_name: path}
            return self._lora_update_result()

    def unload_lora_adapter(self, lora_name: str) -> JsonObject:
        """Unloads the LoRA adapter `lora_name`, as SGLang's `Engine.unload_lora_adapter` does;
        returns the same result as `load_lora_adapter`. Raises InvalidRequestError, naming it, for
        an adapter not loaded or one that running or waiting requests use (and saying how many)."""
        with self._lora_lock:
            self._core.unload_lora_adapter(lora_name)
            self.lora_paths = {name: path for name, path in self.lora_paths.items() if name != lora_name}
            return self._lora_update_result()

    def _lora_update_result(self) -> JsonObject:
        return {"success": True, "error_message": "", "loaded_adapters": dict(self.lora_paths)}

    # ---- information and life cycle ------------------------------------------------------------

    def get_server_info(self) -> JsonObject:
        stats = self._core.stats()
        model = {"model_path": self.model.source, "mmproj": self.model.mmproj, "served_model_name": self.served_model_name, "lora_paths": self.lora_paths}
        return {**model, "precision_note": self.model.precision_note, **stats}

    def shutdown(self) -> None:
        self._core.shutdown()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ---- internals ------------------------------------------------------------------------------

    def _with_bos(self, ids: list[int]) -> list[int]:
        bos = self.model.bos_token_id
        if self.model.add_bos_token and bos is not None and ids[:1] != [bos]:
            return [bos, *ids]
        return ids

    def _need_tokenizer(self, what: str) -> _core.Tokenizer:
        if self.tokenizer is None:
            raise InvalidRequestError(f"{what} need a tokenizer; this engine has none (skip_tokenizer_init or no tokenizer.json): pass input_ids")
        return self.tokenizer

    async def _abuild_requests(
        self, prompt: str | list[str] | None, sampling_params: SamplingArgument, options: GenerateOptions
    ) -> tuple[list[GenerateRequest], bool]:
        """`_build_requests`, on a worker thread when images come (decoding and resizing them takes a while)."""
        if options.get("image_data") is None:
            return self._build_requests(prompt, sampling_params, options)
        return await asyncio.to_thread(self._build_requests, prompt, sampling_params, options)

    def _build_requests(
        self, prompt: str | list[str] | None, sampling_params: SamplingArgument, options: GenerateOptions
    ) -> tuple[list[GenerateRequest], bool]:
        unknown = set(options) - set(GenerateOptions.__annotations__)
        if unknown:
            raise TypeError(f"generate() got unexpected keyword arguments: {', '.join(sorted(unknown))}")
        input_ids, rid = options.get("input_ids"), options.get("rid")
        return_logprob, logprob_start_len = options.get("return_logprob", False), options.get("logprob_start_len")
        grammar: JsonObject = {key: options.get(key) for key in ("json_schema", "regex", "ebnf", "choices")}
        if (prompt is None) == (input_ids is None):
            raise InvalidRequestError("give exactly one of prompt or input_ids")
        batch = prompt if prompt is not None else input_ids
        if isinstance(batch, list) and len(batch) > self.max_sequences_per_call and not isinstance(batch[0], int):
            raise self._too_many_sequences()
        id_lists: list[list[int]]
        if prompt is not None:
            single = isinstance(prompt, str)
            prompts: list[str] = [prompt] if isinstance(prompt, str) else list(prompt)
            if not all(isinstance(p, str) for p in prompts):
                raise InvalidRequestError("prompt must be a string or a list of strings")
            images = self._prompts_images(prompts, options.get("image_data"), single)
            prompts = [text for text, _ in images] if images else prompts
            id_lists = self.tokenize_batch(prompts)
        else:
            assert input_ids is not None
            if options.get("image_data") is not None:
                raise InvalidRequestError(
                    "image_data goes with a text prompt (its image placeholders are written out as the model's image tokens), not with input_ids"
                )
            images = []
            single = not input_ids or isinstance(input_ids[0], int)
            id_lists = [cast(list[int], list(input_ids))] if single else [list(cast(list[int], ids)) for ids in input_ids]
            if not all(isinstance(t, int) and not isinstance(t, bool) for ids in id_lists for t in ids):
                raise InvalidRequestError("input_ids must be a list of ints or a list of lists of ints")
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(id_lists)
        if len(params) != len(id_lists):
            raise InvalidRequestError("sampling_params must be one dict or one per prompt")
        rids = rid if isinstance(rid, list) else [rid] * len(id_lists)
        lora_path = options.get("lora_path")
        loras = lora_path if isinstance(lora_path, list) else [lora_path] * len(id_lists)
        if len(loras) != len(id_lists) or not all(lora is None or isinstance(lora, str) for lora in loras):
            raise InvalidRequestError("lora_path must be an adapter's name, or a list of one name (or None) per prompt")
        requests: list[GenerateRequest] = []
        image_inputs = [inputs for _, inputs in images] if images else [[] for _ in id_lists]
        for ids, p, r, prompt_images, lora in zip(id_lists, params, rids, image_inputs, loras):
            p = self._normalize_params(p, grammar)
            n = p.pop("n", 1)
            if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= self.max_n:
                raise InvalidRequestError(f"sampling_params: n must be an integer from 1 to {self.max_n} (the server's max_n)")
            if len(requests) + n > self.max_sequences_per_call:
                raise self._too_many_sequences()
            base = r or uuid.uuid4().hex
            # Every sample of a prompt shares its grammar, and so whether it waits for the thinking to end.
            think_end_ids = self._think_end_ids if _has_grammar(p) and not self._prompt_ends_thinking(ids) else None
            for i in range(n):
                sample = dict(p)
                if n > 1 and sample.get("seed") is not None:
                    sample["seed"] += i  # distinct but reproducible samples
                requests.append(
                    {
                        "rid": base if n == 1 else f"{base}-{i}",
                        "group": None if n == 1 else base,
                        "input_ids": ids,
                        "sampling_params": cast(SamplingParams, sample),
                        "return_logprob": bool(return_logprob),
                        "top_logprobs_num": int(options.get("top_logprobs_num") or 0),
                        "return_prompt_logits": bool(options.get("return_prompt_logits", False)),
                        # SGLang's -1 (and no return_logprob) means no prompt log-probabilities.
                        "logprob_start_len": logprob_start_len if return_logprob and (logprob_start_len or 0) >= 0 else None,
                        "think_end_token_ids": think_end_ids,
                        "images": prompt_images,
                        "lora_path": lora,
                    }
                )
        return requests, single and len(requests) == 1

    def _prompts_images(self, prompts: list[str], image_data: Any, single: bool) -> list[tuple[str, list[ImageInput]]]:
        """Each prompt with its image placeholders written out, and its images (none without image_data)."""
        if image_data is None:
            return []
        if self._prompt_images is None:
            raise InvalidRequestError(f"image_data: {self.served_model_name} reads text only{self._text_only_because}; send no images")
        per_prompt = [image_data if isinstance(image_data, list) else [image_data]] if single else image_data
        if not isinstance(per_prompt, list) or len(per_prompt) != len(prompts) or not all(isinstance(images, list) for images in per_prompt):
            raise InvalidRequestError("image_data: give one list of images per prompt")
        prepare = self._prompt_images.prepare
        return [prepare(text, images, "image_data" if single else f"image_data[{i}]") for i, (text, images) in enumerate(zip(prompts, per_prompt))]

    def _prompt_ends_thinking(self, ids: list[int]) -> bool:
        """Whether the prompt ends with the think-end token (then whitespace). Compared as text:
        inside a prompt the token's text may be split into tokens differently than on its own."""
        if not self._think_end_token:
            return False
        tail = self.decode(ids[-THINK_END_TAIL_TOKENS:], skip_special_tokens=False)
        return tail.rstrip().endswith(self._think_end_token)

    def _too_many_sequences(self) -> InvalidRequestError:
        return InvalidRequestError(f"one call may start at most {self.max_sequences_per_call} sequences (prompts times n); split the batch")

    def _normalize_params(self, params: JsonObject | None, grammar: JsonObject | None = None) -> JsonObject:
        if params is not None and not isinstance(params, dict):
            raise InvalidRequestError("sampling_params must be a dict")
        # None means "default", as in SGLang: the model's or the server's if it sets one.
        p = {**self._sampling_defaults, **_given(params), **_given(grammar)}
        for key in _IGNORED_SAMPLING_KEYS:
            p.pop(key, None)
        if p.pop("stop_regex", None):  # SGLang's frontend sends an empty one with every gen
            raise InvalidRequestError("sampling_params.stop_regex is not supported: give stop strings, or constrain the output with regex")
        if isinstance(p.get("stop"), str):
            p["stop"] = [p["stop"]]
        if isinstance(p.get("json_schema"), dict):
            p["json_schema"] = orjson.dumps(p["json_schema"]).decode()
        return p

    def _submit(self, request: GenerateRequest) -> _core.RequestStream:
        return self._core.submit(request)

    @staticmethod
    def _only(requests: list[GenerateRequest]) -> GenerateRequest:
        if len(requests) != 1:
            raise InvalidRequestError("stream=True takes one prompt with n=1")
        return requests[0]

    def _outputs(self, request: GenerateRequest | EmbedRequest, handle: _core.RequestStream) -> Generator[Output, None, None]:
        """The engine's outputs for `request`; a caller that stops early aborts it (freeing its KV)."""
        try:
            while True:
                out = handle.next(_POLL_SECONDS)
                if out is not None:
                    yield out
                    if handle.done:
                        return
        finally:
            if not handle.done:
                self._core.abort(request["rid"])

    async def _aoutputs(self, request: GenerateRequest | EmbedRequest, handle: _AsyncHandle) -> AsyncGenerator[Output, None]:
        """`_outputs` for asyncio: waits on the event loop, with no thread; a cancelled waiter
        aborts the request too."""
        try:
            while True:
                yield await handle.next()
                if handle.stream.done:
                    return
        finally:
            if not handle.stream.done:
                self._core.abort(request["rid"])

    def _final_output(self, request: EmbedRequest, handle: _core.RequestStream) -> Output:
        *_, last = self._outputs(request, handle)
        return last

    async def _afinal_output(self, request: EmbedRequest, handle: _AsyncHandle) -> Output:
        async for out in self._aoutputs(request, handle):
            last = out
        return last

    def _wakeups(self) -> _LoopWakeups:
        loop = asyncio.get_running_loop()
        wakeups = self._loop_wakeups.get(loop)
        if wakeups is None:
            wakeups = self._loop_wakeups[loop] = _LoopWakeups(loop)
        return wakeups

    def _stream(self, request: GenerateRequest, deltas: bool = False) -> Generator[Result, None, None]:
        result = _Result(request, deltas=deltas)
        with contextlib.closing(self._outputs(request, self._submit(request))) as outputs:
            for out in outputs:
                yield result.chunk(out)

    async def _astream(self, request: GenerateRequest, handle: _AsyncHandle, deltas: bool = False) -> AsyncGenerator[Result, None]:
        result = _Result(request, deltas=deltas)
        async with contextlib.aclosing(self._aoutputs(request, handle)) as outputs:
            async for out in outputs:
                yield result.chunk(out)

    def _collect(self, request: GenerateRequest, handle: _core.RequestStream, started: float) -> Result:
        result = _Result(request, started)
        for out in self._outputs(request, handle):
            result.add(out)
        return result.snapshot()

    async def _acollect(self, request: GenerateRequest, handle: _AsyncHandle, started: float) -> Result:
        result = _Result(request, started)
        async for out in self._aoutputs(request, handle):
            result.add(out)
        return result.snapshot()


def default_kv_cache_dtype(weight_dtype: str, quantization: str | None) -> str:
    """The KV cache's element type when none is asked for: int8 for 16-bit and int8 weights (the
    fastest, 1.38x bfloat16's decode at 4,096 tokens, within 0.2% of its perplexity:
    docs/performance.md, "KV cache dtypes"); float32 for float32 weights (precision was asked
    for) and 4-bit ones (their 8-bit activations move prompt log-probabilities past the int8
    test's bounds with any narrower pages, even bfloat16: docs/performance.md, "int8 pages for
    4-bit weights?")."""
    sixteen_bit = weight_dtype in ("bfloat16", "float16") and quantization is None
    return "int8" if sixteen_bit or quantization == "w8a8_int8" else "float32"


@functools.lru_cache(maxsize=512)
def json_schema_warnings(schema: str) -> tuple[dict[str, str], ...]:
    """What the grammar relaxes in `schema` (JSON text): `{"keyword", "pointer", "action"}` each,
    logged once per schema while it stays in this cache (the engine caches as many grammars)."""
    _, relaxations = _core.relax_json_schema(schema)
    warnings = tuple(relaxations)
    for w in warnings:
        logger.warning("json_schema: `%s` at %s: %s", w["keyword"], w["pointer"] or "the root", w["action"])
    return warnings


def _top_triples(scored: TokenLogprob) -> list[tuple[float, int, None]]:
    return [(top["logprob"], top["token_id"], None) for top in scored["top"]]


def _given(params: JsonObject | None) -> JsonObject:
    return {key: value for key, value in (params or {}).items() if value is not None}


def _has_grammar(params: SamplingParams | JsonObject) -> bool:
    """Whether normalized sampling params (None values dropped) constrain the output."""
    return any(key in params for key in _GRAMMAR_KEYS)


class _LoopWakeups:
    """Wakes an event loop's waiting requests: the engine pushes a request's key onto a Notifier
    whose socket the loop watches, so a waiting request costs an Event, not a thread or a poll."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._notifier = _core.Notifier()
        # Weak: a request's entry goes with its handle, however its reader ended (or never started).
        self._ready: weakref.WeakValueDictionary[int, asyncio.Event] = weakref.WeakValueDictionary()
        self._keys = itertools.count()
        # The loop holds this object while it watches the socket, so the socket (closed with the
        # Notifier) outlives the watch; the engine forgets the loop once it is gone.
        loop.add_reader(self._notifier.fileno(), self._wake)

    def submit(self, start: Callable[[_core.Notifier, int], _core.RequestStream]) -> _AsyncHandle:
        """Starts a request by `start(notifier, key)` (the core's `submit` or `embed`)."""
        key = next(self._keys)
        stream = start(self._notifier, key)
        ready = self._ready[key] = asyncio.Event()
        return _AsyncHandle(stream, ready)

    def _wake(self) -> None:
        for key in self._notifier.take_ready():
            if (ready := self._ready.get(key)) is not None:
                ready.set()


class _AsyncHandle:
    """A request's stream and the Event its outputs set."""

    def __init__(self, stream: _core.RequestStream, ready: asyncio.Event) -> None:
        self.stream = stream
        self._ready = ready

    async def next(self) -> Output:
        while (out := self.stream.try_next()) is None:
            # No await between the empty read and clear(): a wake-up cannot fall in between.
            self._ready.clear()
            await self._ready.wait()
        return out


class _Result:
    """Folds a request's outputs into SGLang's result shape: the whole output so far, or with
    `deltas` each output's own part (`chunk`)."""

    def __init__(self, request: GenerateRequest, started: float | None = None, deltas: bool = False) -> None:
        self.request = request
        self.deltas = deltas
        # From submission: requests of one batch are collected one after another.
        self.started = time.perf_counter() if started is None else started
        self.text_pieces: list[str] = []  # joined when read, so folding a long output costs no copies
        self.ids: list[int] = []
        self.completion_tokens = 0
        # SGLang's (logprob, token_id, text) triples; text is None (not detokenized per token).
        self.logprobs: list[tuple[float, int, None]] = []
        self.top_logprobs: list[list[tuple[float, int, None]]] = []
        self.prompt_logits: list[float] | None = None
        self.input_logprobs: list[tuple[float | None, int, None]] = []
        self.input_top_logprobs: list[list[tuple[float, int, None]] | None] = []
        self.finished: JsonObject = {}
        schema = request["sampling_params"].get("json_schema")
        self.schema_warnings = json_schema_warnings(schema) if isinstance(schema, str) else ()

    def chunk(self, out: Output) -> Result:
        """The streamed chunk of `out`: what it adds, or with `deltas` off the result so far."""
        if self.deltas:
            logprobs, top_logprobs = self._take(out)
            return self._shaped(out["text"], out["token_ids"], logprobs, top_logprobs)
        self.add(out)
        return self.snapshot()

    def add(self, out: Output) -> None:
        logprobs, top_logprobs = self._take(out)
        self.text_pieces.append(out["text"])
        self.ids.extend(out["token_ids"])
        self.logprobs += logprobs
        self.top_logprobs += top_logprobs

    def snapshot(self) -> Result:
        """The result so far, in lists of its own: a chunk a caller keeps does not change under it."""
        text = "".join(self.text_pieces)
        self.text_pieces = [text]
        return self._shaped(text, list(self.ids), list(self.logprobs), list(self.top_logprobs))

    def _take(self, out: Output) -> tuple[list[tuple[float, int, None]], list[list[tuple[float, int, None]]]]:
        """Notes what `out` tells of the whole request; returns its tokens' log-probabilities and
        top alternatives as SGLang lists them."""
        self.completion_tokens += len(out["token_ids"])
        scored = out.get("logprobs", [])
        self.prompt_logits = out.get("prompt_logits", self.prompt_logits)
        if "input_token_logprobs" in out:
            prompt_scored = out["input_token_logprobs"]
            # Position 0 has no log-probability; SGLang lists it with None.
            first: list[tuple[float | None, int, None]] = [(None, self.request["input_ids"][0], None)] if not self.request.get("logprob_start_len") else []
            self.input_logprobs = first + [(lp["logprob"], lp["token_id"], None) for lp in prompt_scored]
            self.input_top_logprobs = [None] * len(first) + [_top_triples(lp) for lp in prompt_scored]
        self.finished = dict(out.get("finished", {}))
        return [(lp["logprob"], lp["token_id"], None) for lp in scored], [_top_triples(lp) for lp in scored]

    def _shaped(self, text: str, ids: list[int], logprobs: list[tuple[float, int, None]], top_logprobs: list[list[tuple[float, int, None]]]) -> Result:
        meta = {
            "id": self.request["rid"],
            "prompt_tokens": len(self.request["input_ids"]),
            "completion_tokens": self.completion_tokens,
            "cached_tokens": 0,
            "finish_reason": None,
            "e2e_latency": time.perf_counter() - self.started,
            **self.finished,
        }
        if self.request.get("return_logprob"):
            meta["output_token_logprobs"] = logprobs
            meta["output_top_logprobs"] = top_logprobs
            # Empty without logprob_start_len, as SGLang answers (its frontend reads the key). The
            # prompt's lists come whole with one output and are never extended: chunks share them.
            meta["input_token_logprobs"] = self.input_logprobs
            if self.request.get("top_logprobs_num"):
                meta["input_top_logprobs"] = self.input_top_logprobs
        if self.prompt_logits is not None:
            meta["prompt_logits"] = self.prompt_logits
        if self.schema_warnings:
            meta["json_schema_warnings"] = [dict(w) for w in self.schema_warnings]
        return {"text": text, "output_ids": ids, "meta_info": meta}


# ---- choosing a continuation by log-probability (Engine.select, rsgl.lang's backends) ------------


def check_choices(prompt: Any, choices: Sequence[str]) -> None:
    if not isinstance(prompt, str) or not choices or not all(isinstance(c, str) and c for c in choices):
        raise InvalidRequestError("select takes a prompt string and a non-empty list of non-empty choice strings")


def continuation_start(prompt_ids: list[int], ids: list[int]) -> int:
    """Where a choice's tokens start in `ids` (the prompt followed by the choice): the prompt's
    last tokens may merge with the choice's first characters, so from the first token that differs
    from the prompt's own tokenization (at least 1: position 0 has no log-probability)."""
    start = next((i for i, (a, b) in enumerate(zip(ids, prompt_ids)) if a != b), len(prompt_ids))
    return min(max(start, 1), len(ids) - 1)


def rank_choices(choices: Sequence[str], token_logprobs: list[list[float]], normalize: bool = True) -> JsonObject:
    """`{"text", "index", "logprobs", "normalized_logprobs"}`: the best choice by the mean (or,
    without `normalize`, the sum) of its tokens' log-probabilities, and every choice's scores."""
    sums = [sum(lps) for lps in token_logprobs]
    means = [total / len(lps) for total, lps in zip(sums, token_logprobs)]
    scores = means if normalize else sums
    best = max(range(len(choices)), key=scores.__getitem__)
    return {"text": choices[best], "index": best, "logprobs": sums, "normalized_logprobs": means}
