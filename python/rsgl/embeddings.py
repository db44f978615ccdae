"""Embedding requests and results in SGLang's `Engine.encode` shape: what a prompt argument may be,
and `{"embedding": [...], "meta_info": {...}}` per prompt. The vector itself is pooled and
L2-normalized by the Rust core."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any, TypeGuard

from rsgl._typing import JsonObject
from rsgl.core_types import EmbedRequest, Output
from rsgl.errors import InvalidRequestError

# A text, a list of texts, a list of token ids, or a list of token-id lists.
EmbedInput = str | list[str] | list[int] | list[list[int]]


def embed_requests(prompt: EmbedInput, tokenize: Callable[[str], list[int]], max_prompts: int) -> tuple[list[EmbedRequest], bool]:
    """One request per prompt of `prompt`, and whether it was a single one."""
    single = isinstance(prompt, str) or (isinstance(prompt, list) and bool(prompt) and is_token_id(prompt[0]))
    prompts: list[Any] = [prompt] if single else list(prompt) if isinstance(prompt, list) else []
    if not prompts:
        raise InvalidRequestError("the input is empty: give a text, a list of texts, a list of token ids or a list of token-id lists")
    if len(prompts) > max_prompts:
        raise InvalidRequestError(f"one call may embed at most {max_prompts} inputs; split the batch")
    return [{"rid": uuid.uuid4().hex, "input_ids": input_ids(p, tokenize)} for p in prompts], single


def input_ids(prompt: Any, tokenize: Callable[[str], list[int]]) -> list[int]:
    if isinstance(prompt, str):
        return tokenize(prompt)
    if isinstance(prompt, list) and all(is_token_id(t) for t in prompt):
        return prompt
    raise InvalidRequestError("each input must be a text or a list of token ids")


def is_token_id(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def embedding_result(request: EmbedRequest, out: Output, started: float) -> JsonObject:
    """SGLang's encode result for a request's final output."""
    meta = {
        "id": request["rid"],
        "prompt_tokens": len(request["input_ids"]),
        "completion_tokens": 0,
        "cached_tokens": 0,
        "finish_reason": None,
        "e2e_latency": time.perf_counter() - started,
        **out.get("finished", {}),
    }
    # None when the request was aborted (meta_info's finish_reason says why).
    return {"embedding": out.get("embedding"), "meta_info": meta}
