"""Embedding endpoints of a server started with --is-embedding: OpenAI's /v1/embeddings and
SGLang's native /encode."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rsgl._typing import JsonObject
from rsgl.embeddings import EmbedInput
from rsgl.engine import Engine
from rsgl.server.engine_calls import engine_of
from rsgl.server.errors import APIError, bad_request
from rsgl.server.native_api import json_response
from rsgl.server.openai_api import check_model
from rsgl.server.request_body import is_text, is_token_ids, optional_int, read_json_object

ENCODING_FORMATS = ("float", "base64")


async def create_embedding(request: Request) -> Response:
    """OpenAI's embeddings: `input` a text, a list of texts, a list of token ids or a list of
    token-id lists; `encoding_format` float or base64 (little-endian float32, as OpenAI sends)."""
    body = await read_json_object(request)
    if check_model(body, request) is not None:
        raise bad_request("embeddings run on the base model: name it, not a LoRA adapter", "model")
    engine = embedding_engine(request)
    encoding_format = body.get("encoding_format") or "float"
    if encoding_format not in ENCODING_FORMATS:
        raise bad_request(f"encoding_format must be one of {', '.join(ENCODING_FORMATS)}", "encoding_format")
    check_dimensions(optional_int(body, "dimensions", minimum=1), engine)
    results = await encode(engine, embedding_input(body.get("input"), "input"))
    data = [{"object": "embedding", "index": i, "embedding": encoded(vector(r), encoding_format)} for i, r in enumerate(results)]
    tokens = sum(r["meta_info"]["prompt_tokens"] for r in results)
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return json_response({"object": "list", "data": data, "model": engine.served_model_name, "usage": usage})


async def encode_native(request: Request) -> Response:
    """SGLang's /encode: `text` (a string or a list) or `input_ids` -> `{"embedding", "meta_info"}`
    per input (a list for a list)."""
    body = await read_json_object(request)
    engine = embedding_engine(request)
    name = "input_ids" if "input_ids" in body else "text"
    prompt = embedding_input(body.get(name), name)
    results = await encode(engine, prompt)
    for result in results:
        vector(result)  # a 503 for an aborted one
    single = isinstance(prompt, str) or (bool(prompt) and isinstance(prompt[0], int))
    return json_response(results[0] if single else results)


def embedding_engine(request: Request) -> Engine:
    engine = engine_of(request)
    if not engine.is_embedding:
        raise bad_request(
            "This server generates text; embeddings need a model served for them: start the server with --is-embedding "
            "(python -m rsgl.server --model-path MODEL --is-embedding)."
        )
    return engine


def embedding_input(value: Any, param: str) -> EmbedInput:
    if value is None or value == [] or value == "":
        raise bad_request(f"{param} is empty: give a text, a list of texts, a list of token ids or a list of token-id lists", param)
    if is_text(value) or is_token_ids(value):
        return value
    raise bad_request(f"{param} must be a string, a list of strings, a list of token ids or a list of such lists", param)


def check_dimensions(dimensions: int | None, engine: Engine) -> None:
    """Only the model's own width: truncating suits only models trained for it (Matryoshka)."""
    hidden_size = engine.model_config["hidden_size"]
    if dimensions is not None and dimensions != hidden_size:
        raise bad_request(f"dimensions must be the model's embedding size, {hidden_size}; this server does not truncate embeddings", "dimensions")


async def encode(engine: Engine, prompt: EmbedInput) -> list[JsonObject]:
    results = await engine.async_encode(prompt)
    return results if isinstance(results, list) else [results]


def vector(result: JsonObject) -> list[float]:
    """The result's embedding; a 503 when the request was aborted (the engine shut down)."""
    embedding: list[float] | None = result["embedding"]
    if embedding is None:
        reason = result["meta_info"]["finish_reason"].get("message", "aborted")
        raise APIError(503, f"The embedding was not computed: {reason}.", type="service_unavailable")
    return embedding


def encoded(embedding: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(embedding, dtype="<f4").tobytes()).decode()
    return embedding


ROUTES = [
    Route("/v1/embeddings", create_embedding, methods=["POST"]),
    Route("/encode", encode_native, methods=["POST"]),
]
