"""SGLang's native endpoints (/health, /generate, /tokenize, /metrics...), and the JSON responses
every endpoint answers with."""

from __future__ import annotations

import asyncio
import datetime
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rsgl._typing import JsonObject
from rsgl.engine import Engine
from rsgl.errors import InvalidRequestError, ModelLoadError
from rsgl.server.engine_calls import EngineStream, GenerateArguments, engine_of, generate_whole, metrics_of
from rsgl.server.errors import APIError, LoraUpdateError, bad_request
from rsgl.server.events import EventStreamResponse
from rsgl.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from rsgl.server.metrics import kv_pages_used, kv_usage
from rsgl.server.request_body import is_str_list, is_text, is_token_ids, optional_bool, optional_int, read_json_object
from rsgl.server.request_images import generate_images, load_request_images

logger = logging.getLogger("rsgl.server")
# A probe must not hang on a stuck engine (SGLang's /health_generate gives up after 20 s too).
HEALTH_GENERATE_TIMEOUT_SECONDS = 20


def json_response(content: Any) -> Response:
    return Response(orjson.dumps(content), media_type="application/json")


# ---- endpoints ----------------------------------------------------------------------------------


async def health(request: Request) -> Response:
    return Response(status_code=200)


async def get_model_info(request: Request) -> Response:
    engine = engine_of(request)
    model = engine.model
    # The chat template, its special tokens and whether the engine adds BOS itself let clients (rsgl.lang)
    # render role blocks as the server would.
    return json_response(
        {
            "model_path": model.source,
            "served_model_name": engine.served_model_name,
            "is_generation": not engine.is_embedding,
            "chat_template": model.chat_template,
            "bos_token": model.bos_token,
            "eos_token": model.eos_token,
            "add_bos_token": model.add_bos_token,
        }
    )


async def get_server_info(request: Request) -> Response:
    return json_response(engine_of(request).get_server_info())


async def loads(request: Request) -> Response:
    """SGLang's /v1/loads, which routers poll to balance workers: the load of this server's one
    data-parallel rank."""
    info = engine_of(request).get_server_info()
    used_tokens = kv_pages_used(info) * info["page_size"]
    load = {
        "dp_rank": 0,
        "num_running_reqs": info["running_requests"],
        "num_waiting_reqs": info["waiting_requests"],
        "num_total_reqs": info["running_requests"] + info["waiting_requests"],
        "num_used_tokens": used_tokens,
        "max_total_num_tokens": info["max_total_tokens"],
        "token_usage": kv_usage(info),
        "cache_hit_rate": info["cache_hit_rate"],
    }
    timestamp = datetime.datetime.now(datetime.UTC).isoformat()
    return json_response({"timestamp": timestamp, "dp_rank_count": 1, "loads": [load]})


async def flush_cache(request: Request) -> Response:
    """Empties the prefix cache; refused while requests are in flight (as SGLang does)."""
    if not await asyncio.to_thread(engine_of(request).flush_cache):
        raise bad_request("The cache was not flushed: requests are running or waiting; retry when the server is idle.")
    return Response("Cache flushed.\n", media_type="text/plain")


async def load_lora_adapter(request: Request) -> Response:
    """SGLang's /load_lora_adapter: {"lora_name", "lora_path" (a PEFT folder on the server)} ->
    {"success", "error_message", "loaded_adapters": {name: path}}; a 400 when refused."""
    body = await read_json_object(request)
    engine = engine_of(request)
    name, path = lora_name(body, engine), body.get("lora_path")
    if not isinstance(path, str) or not path:
        raise LoraUpdateError("lora_path must be the path of the adapter's PEFT folder on the server, a non-empty string", engine.lora_paths, "lora_path")
    response = await lora_update(engine, partial(engine.load_lora_adapter, name, path))
    logger.info("LoRA adapter %r loaded from %s", name, path)
    return response


async def unload_lora_adapter(request: Request) -> Response:
    """SGLang's /unload_lora_adapter: {"lora_name"} -> the same result as /load_lora_adapter; a 400
    for an adapter not loaded, or one that running or waiting requests use."""
    body = await read_json_object(request)
    engine = engine_of(request)
    name = lora_name(body, engine)
    response = await lora_update(engine, partial(engine.unload_lora_adapter, name))
    logger.info("LoRA adapter %r unloaded", name)
    return response


def lora_name(body: JsonObject, engine: Engine) -> str:
    name = body.get("lora_name")
    if not isinstance(name, str) or not name:
        raise LoraUpdateError("lora_name must be the adapter's name, a non-empty string", engine.lora_paths, "lora_name")
    return name


async def lora_update(engine: Engine, update: Callable[[], JsonObject]) -> Response:
    """Runs a load or unload off the event loop (reading and packing an adapter takes a while)."""
    try:
        return json_response(await asyncio.to_thread(update))
    except (InvalidRequestError, ModelLoadError) as exc:
        raise LoraUpdateError(str(exc), engine.lora_paths) from None
    except OSError as exc:  # a lora_path the system cannot look up (a name too long...)
        raise LoraUpdateError(f"lora_path: {exc.strerror or exc}", engine.lora_paths, "lora_path") from None


async def health_generate(request: Request) -> Response:
    """200 when the engine generates a token, 503 otherwise: unlike /health, this exercises the model."""
    engine = engine_of(request)
    try:
        if engine.is_embedding:
            probe = engine.async_encode([0])
        else:
            probe = engine.async_generate(input_ids=[0], sampling_params={"max_new_tokens": 1, "temperature": 0}, rid=f"health-generate-{uuid.uuid4().hex}")
        await asyncio.wait_for(probe, HEALTH_GENERATE_TIMEOUT_SECONDS)
    except Exception as exc:
        logger.warning("/health_generate failed: %r", exc)
        raise APIError(503, "The engine did not generate a token; see the server log.", type="service_unavailable") from None
    return Response(status_code=200)


async def tokenize(request: Request) -> Response:
    """SGLang's /tokenize: {"prompt" (or "text"): a string or a list of them} -> their token ids and counts."""
    body = await read_json_object(request)
    text = body.get("prompt", body.get("text"))
    if not is_text(text):
        raise bad_request("prompt (or text) must be a string or a list of strings", "prompt")
    engine = engine_of(request)
    rows = await asyncio.to_thread(engine.tokenize_batch, [text] if isinstance(text, str) else text)
    counted: JsonObject = {"tokens": rows[0], "count": len(rows[0])} if isinstance(text, str) else {"tokens": rows, "count": [len(row) for row in rows]}
    return json_response({**counted, "max_model_len": engine.get_server_info()["context_length"]})


async def detokenize(request: Request) -> Response:
    """SGLang's /detokenize: {"tokens": token ids or a list of them} -> {"text": their text (or texts)}."""
    body = await read_json_object(request)
    engine = engine_of(request)
    tokens = body.get("tokens")
    vocab_size = engine.model_config["vocab_size"]
    if not is_token_ids(tokens) or not all(0 <= t < vocab_size for row in token_rows(tokens) for t in row):
        raise bad_request(f"tokens must be a non-empty list of token ids from 0 to {vocab_size - 1}, or a list of such lists", "tokens")
    decode = partial(engine.decode, skip_special_tokens=optional_bool(body, "skip_special_tokens", True))
    return json_response({"text": await one_or_each(decode, tokens, single=isinstance(tokens[0], int))})


async def one_or_each(function: Callable[[Any], Any], value: Any, single: bool) -> Any:
    """`function(value)`, or `function` of each item when `value` is a batch, run off the event loop."""
    results = await asyncio.to_thread(lambda: [function(item) for item in ([value] if single else value)])
    return results[0] if single else results


async def abort_request(request: Request) -> Response:
    """Aborts the request with this id (its stream ends with finish_reason abort); unknown ids are ignored."""
    body = await read_json_object(request)
    rid = body.get("rid")
    if not isinstance(rid, str) or not rid:
        raise bad_request("rid must be the id of a request, a non-empty string", "rid")
    engine_of(request).abort_request(rid)
    return Response(status_code=200)


async def metrics(request: Request) -> Response:
    text = metrics_of(request).exposition(engine_of(request).get_server_info())
    return Response(text, media_type=METRICS_CONTENT_TYPE)


async def generate(request: Request) -> Response:
    """SGLang's /generate: the response is what `Engine.generate` returns; streaming sends its
    chunks (cumulative text) as server-sent events. `return_text_in_logprobs` fills in the text of
    each log-probability's token."""
    body = await read_json_object(request)
    arguments = generate_arguments(body)
    if body.get("image_data") is not None:
        if body.get("text") is None:
            raise bad_request("image_data goes with text (its image placeholders become the model's image tokens), not with input_ids", "image_data")
        prompts = None if isinstance(body["text"], str) else len(body["text"])
        per_prompt = generate_images(body["image_data"], prompts)
        loaded = [await load_request_images(images, request.app.state.image_limits) for images in per_prompt]
        arguments["image_data"] = loaded[0] if prompts is None else loaded
    texts = LogprobTexts(engine_of(request)) if optional_bool(body, "return_text_in_logprobs") else None
    if optional_bool(body, "stream"):
        stream = await EngineStream.start(request, arguments, cumulative=True)
        return EventStreamResponse(stream if texts is None else texts.each(stream), stream)
    outputs = await generate_whole(request, arguments)
    if texts is not None:
        outputs = [texts.fill(output) for output in outputs] if isinstance(outputs, list) else texts.fill(outputs)
    return json_response(outputs)


class LogprobTexts:
    """Fills the text of SGLang's (logprob, token_id, text) entries in results' meta_info: each
    token decoded alone with its special tokens kept, as SGLang does (its frontend's select compares
    a token's text with the prompt's end). A token is decoded once per request."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._texts: dict[int, str] = {}

    def fill(self, output: JsonObject) -> JsonObject:
        meta = output["meta_info"]
        for key in ("input_token_logprobs", "output_token_logprobs"):
            if key in meta:
                meta[key] = [self._with_text(entry) for entry in meta[key]]
        if "output_top_logprobs" in meta:
            meta["output_top_logprobs"] = [[self._with_text(entry) for entry in top] for top in meta["output_top_logprobs"]]
        return output

    async def each(self, chunks: AsyncIterator[JsonObject]) -> AsyncIterator[JsonObject]:
        async for chunk in chunks:
            yield self.fill(chunk)

    def _with_text(self, entry: tuple[float | None, int, str | None]) -> tuple[float | None, int, str]:
        logprob, token_id, _ = entry
        if token_id not in self._texts:
            self._texts[token_id] = self._engine.decode([token_id], skip_special_tokens=False)
        return logprob, token_id, self._texts[token_id]


def generate_arguments(body: JsonObject) -> GenerateArguments:
    """`Engine.generate` keyword arguments from a /generate body, type-checked (values by the engine)."""
    text, input_ids = body.get("text"), body.get("input_ids")
    if (text is None) == (input_ids is None):
        raise bad_request("Give exactly one of text or input_ids.")
    if text is not None and not is_text(text):
        raise bad_request("text must be a string or a list of strings", "text")
    if input_ids is not None and not is_token_ids(input_ids):
        raise bad_request("input_ids must be a list of token ids or a list of such lists", "input_ids")
    sampling_params = body.get("sampling_params")
    if not (sampling_params is None or isinstance(sampling_params, dict) or _is_dict_list(sampling_params)):
        raise bad_request("sampling_params must be an object, or a list of objects (one per prompt)", "sampling_params")
    rid = body.get("rid")
    if not (rid is None or isinstance(rid, str) or is_str_list(rid)):
        raise bad_request("rid must be a string or a list of strings (one per prompt)", "rid")
    lora_path = body.get("lora_path")
    if not (lora_path is None or isinstance(lora_path, str) or (isinstance(lora_path, list) and all(p is None or isinstance(p, str) for p in lora_path))):
        raise bad_request("lora_path must be a LoRA adapter's name, or a list of names (or nulls) one per prompt", "lora_path")
    return GenerateArguments(
        prompt=text,
        input_ids=input_ids,
        sampling_params=sampling_params,
        return_logprob=optional_bool(body, "return_logprob"),
        top_logprobs_num=optional_int(body, "top_logprobs_num", 0, minimum=0),
        logprob_start_len=optional_int(body, "logprob_start_len", None, minimum=-1),
        rid=rid,
        lora_path=lora_path,
    )


def _is_dict_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, dict) for v in value)


def token_rows(token_ids: list[Any]) -> list[list[int]]:
    """One prompt's token ids or a batch of them (as checked by is_token_ids), as a batch."""
    return token_ids if isinstance(token_ids[0], list) else [token_ids]


ROUTES = [
    Route("/health", health, methods=["GET"]),
    Route("/health_generate", health_generate, methods=["GET"]),
    Route("/get_model_info", get_model_info, methods=["GET"]),
    Route("/model_info", get_model_info, methods=["GET"]),  # SGLang's newer name, which routers ask first
    Route("/get_server_info", get_server_info, methods=["GET"]),
    # SGLang's newer name for /get_server_info (its RuntimeEndpoint.get_server_info reads this one).
    Route("/server_info", get_server_info, methods=["GET"]),
    Route("/generate", generate, methods=["POST"]),
    Route("/flush_cache", flush_cache, methods=["GET", "POST"]),
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/detokenize", detokenize, methods=["POST"]),
    Route("/abort_request", abort_request, methods=["POST"]),
    Route("/load_lora_adapter", load_lora_adapter, methods=["POST"]),
    Route("/unload_lora_adapter", unload_lora_adapter, methods=["POST"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/v1/loads", loads, methods=["GET"]),
]
