"""OpenAI-compatible endpoints: /v1/models, /v1/completions and /v1/chat/completions."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rsgl._typing import JsonObject
from rsgl.engine import Engine, json_schema_warnings
from rsgl.server.chat_reader import ChatReader
from rsgl.server.chat_tools import ChatParsers, PreparedChat, prepare_chat
from rsgl.server.engine_calls import EngineStream, GenerateArguments, engine_of, generate_whole
from rsgl.server.errors import APIError, bad_request
from rsgl.server.events import EventStreamResponse
from rsgl.server.native_api import json_response
from rsgl.server.request_body import is_text, is_token_ids, optional_bool, optional_dict, optional_float, optional_int, optional_stop, read_json_object
from rsgl.server.request_images import RequestImage, image_url, is_image_part, load_request_images, template_part
from rsgl.server.tool_request import check_past_calls, modern_message, tool_request

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_TOP_LOGPROBS = 20
MAX_LOGIT_BIAS = 100  # OpenAI's bound: a bias of ±100 bans or forces a token
DEFAULT_MODEL_NAME = "default"  # accepted whatever the served model's name, as SGLang does
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool", "function")  # "function": the deprecated "tool"
GRAMMAR_FIELDS = ("regex", "ebnf", "json_schema")
TEMPLATE_VARIABLES = frozenset(("messages", "tools", "add_generation_prompt", "bos_token", "eos_token"))
REASONING_EFFORTS = ("low", "medium", "high")  # the ones gpt-oss was trained with
# Sampling fields the Messages and Responses APIs lack but take here, as chat completions does.
EXTRA_SAMPLING_FIELDS = ("top_k", "min_p", "seed", "logit_bias", "repetition_penalty")


# ---- endpoints ----------------------------------------------------------------------------------


async def list_models(request: Request) -> Response:
    created = request.app.state.created
    # SGLang's value: routers (smg, sglang-router) tell an SGLang worker by it.
    models = [{"id": name, "object": "model", "created": created, "owned_by": "sglang"} for name in served_model_names(request)]
    base = engine_of(request).served_model_name
    adapters = [{"id": name, "object": "model", "created": created, "owned_by": "sglang", "parent": base} for name in engine_of(request).lora_names]
    return json_response({"object": "list", "data": models + adapters})


async def create_completion(request: Request) -> Response:
    body = await read_json_object(request)
    reject_unsupported(body, ("suffix",))
    logprobs = optional_int(body, "logprobs", minimum=0, maximum=MAX_TOP_LOGPROBS)
    echo = optional_bool(body, "echo")
    params = sampling_params(body, optional_int(body, "max_tokens", COMPLETION_DEFAULT_MAX_TOKENS, minimum=0), engine_of(request))
    arguments = GenerateArguments(**prompt_arguments(body), sampling_params=params, return_logprob=logprobs is not None, top_logprobs_num=logprobs or 0)
    if echo and logprobs is not None:
        arguments["logprob_start_len"] = 0  # the prompt's tokens' log-probabilities, echoed before the completion's
    return await respond(request, body, COMPLETION, arguments, params["n"], echo)


async def create_chat_completion(request: Request) -> Response:
    body = await read_json_object(request)
    call = await chat_request(request, body)
    return await respond(request, body, chat_shape(call.chat.reader), call.arguments, call.samples)


@dataclass(frozen=True)
class ChatCall:
    arguments: GenerateArguments
    chat: PreparedChat  # its reader reads the answer back
    samples: int  # n


async def chat_request(request: Request, body: JsonObject) -> ChatCall:
    """The engine call for a chat request in OpenAI's shape: what /v1/chat/completions runs, and
    the Messages and Responses APIs once their requests are translated to this shape."""
    return_logprob = optional_bool(body, "logprobs")
    top_logprobs = optional_int(body, "top_logprobs", 0, minimum=0, maximum=MAX_TOP_LOGPROBS)
    if top_logprobs and not return_logprob:
        raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
    # max_completion_tokens is OpenAI's newer name; None lets the engine pick its default.
    max_tokens = optional_int(body, "max_completion_tokens", optional_int(body, "max_tokens", minimum=0), minimum=0)
    params = sampling_params(body, max_tokens, engine_of(request))
    tools = tool_request(body)
    if tools.forced is not None and any(name in params for name in GRAMMAR_FIELDS):
        raise bad_request("a forced tool call (tool_choice) cannot be combined with response_format, regex, ebnf or json_schema", "tool_choice")
    messages = chat_messages(body)
    images = chat_images(body)
    if images and engine_of(request).model_config["vision"] is None:
        raise bad_request(f"{engine_of(request).served_model_name} reads text only; send no image parts", images[0].param)
    chat = await prepare_chat(engine_of(request), messages, tools, chat_parsers(request), chat_template_kwargs(body))
    arguments = GenerateArguments(
        prompt=chat.prompt,
        sampling_params={**params, **chat.constraint, **chat.sampling_overrides},
        return_logprob=return_logprob,
        top_logprobs_num=top_logprobs,
    )
    if images:
        arguments["image_data"] = await load_request_images(images, request.app.state.image_limits)
    return ChatCall(arguments, chat, params["n"])


def chat_parsers(request: Request) -> ChatParsers:
    parsers: ChatParsers = request.app.state.chat_parsers
    return parsers


ROUTES = [
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/v1/completions", create_completion, methods=["POST"]),
    Route("/v1/chat/completions", create_chat_completion, methods=["POST"]),
]


# ---- request parsing ----------------------------------------------------------------------------


def chat_template_kwargs(body: JsonObject) -> JsonObject:
    """SGLang's and vLLM's `chat_template_kwargs`: more variables for the chat template (such as
    Qwen3's `enable_thinking`), which may not replace the ones the server sets."""
    kwargs = optional_dict(body, "chat_template_kwargs")
    if taken := sorted(TEMPLATE_VARIABLES.intersection(kwargs)):
        raise bad_request(f"chat_template_kwargs cannot set {', '.join(taken)}: the server sets them from the request", "chat_template_kwargs")
    return {**kwargs, **reasoning_effort(body, kwargs)}


def reasoning_effort(body: JsonObject, template_kwargs: JsonObject) -> JsonObject:
    """OpenAI's `reasoning_effort`, for the chat template's variable of that name (gpt-oss's
    template writes it in the system message; templates that do not read it ignore it)."""
    effort = body.get("reasoning_effort")
    if effort is None:
        return {}
    if effort not in REASONING_EFFORTS:
        raise bad_request(f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}, got {effort!r}", "reasoning_effort")
    if template_kwargs.get("reasoning_effort", effort) != effort:
        raise bad_request("reasoning_effort and chat_template_kwargs.reasoning_effort differ: give one of them", "reasoning_effort")
    return {"reasoning_effort": effort}


def reject_unsupported(body: JsonObject, names: tuple[str, ...]) -> None:
    for name in names:
        if body.get(name):  # absent, null, false or empty all mean "not used"
            raise bad_request(f"{name} is not supported by this server yet", name)


def structured_output(body: JsonObject) -> JsonObject:
    """The grammar sampling_params for OpenAI's `response_format` (text, json_object, json_schema)
    or SGLang's extra fields `regex`, `ebnf` and `json_schema` (JSON text); at most one of them."""
    grammar = {name: body[name] for name in GRAMMAR_FIELDS if body.get(name) is not None}
    for name, value in grammar.items():
        if not isinstance(value, str):
            raise bad_request(f"{name} must be a string", name)
    response_format = body.get("response_format")
    if response_format is None:
        return grammar
    if not isinstance(response_format, dict):
        raise bad_request('response_format must be an object such as {"type": "json_object"}', "response_format")
    kind = response_format.get("type", "text")
    if kind == "text":
        return grammar
    if grammar:
        raise bad_request(f"give either response_format or {', '.join(grammar)}, not both", "response_format")
    if kind == "json_object":
        return {"json_schema": '{"type": "object"}'}
    if kind == "json_schema":
        # `strict` or not, the output follows the schema: constrained decoding costs nothing extra.
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict | bool):
            raise bad_request("response_format.json_schema must be an object with a `schema` object (and a `name`)", "response_format")
        return {"json_schema": orjson.dumps(spec.get("schema", {})).decode()}
    raise bad_request(f"response_format type {kind!r} is not supported; use text, json_object or json_schema", "response_format")


def served_model_names(request: Request) -> list[str]:
    """The names /v1/models lists: the engine's served model name, then its aliases."""
    return [engine_of(request).served_model_name, *request.app.state.model_aliases]


def check_model(body: JsonObject, request: Request) -> str | None:
    """A request may name the served model, an alias, or "default" (as SGLang takes it), or one of
    the engine's LoRA adapters as "NAME" or "BASE:NAME" (BASE one of those): returns the adapter's
    name then. Other names get a 404."""
    model = body.get("model")
    accepted = [*served_model_names(request), DEFAULT_MODEL_NAME]
    adapters = engine_of(request).lora_names
    if model is None or model in accepted:
        return None
    if isinstance(model, str) and model in adapters:
        return model
    base, colon, adapter = model.partition(":") if isinstance(model, str) else ("", "", "")
    if colon and base in accepted and adapter in adapters:
        return adapter
    names = ", ".join(repr(name) for name in [*accepted, *adapters])
    message = f"The model {model!r} does not exist; this server's model answers to {names} (see GET /v1/models)."
    raise APIError(404, message, param="model", code="model_not_found")


def prompt_arguments(body: JsonObject) -> GenerateArguments:
    prompt = body.get("prompt")
    if is_text(prompt):
        return GenerateArguments(prompt=prompt)
    if is_token_ids(prompt):
        return GenerateArguments(input_ids=prompt)
    raise bad_request("prompt must be a string, a list of strings, a list of token ids or a list of such lists", "prompt")


def sampling_params(body: JsonObject, max_tokens: int | None, engine: Engine) -> JsonObject:
    """The engine's sampling_params from OpenAI's fields (plus SGLang's extras: top_k, min_p,
    repetition_penalty, ignore_eos). Types are checked here, most value ranges by the engine."""
    return {
        "max_new_tokens": max_tokens,
        "temperature": optional_float(body, "temperature", 1.0),  # OpenAI's default, not the model's
        "top_p": optional_float(body, "top_p"),
        "top_k": optional_int(body, "top_k"),
        "min_p": optional_float(body, "min_p"),
        "frequency_penalty": optional_float(body, "frequency_penalty"),
        "presence_penalty": optional_float(body, "presence_penalty"),
        "repetition_penalty": optional_float(body, "repetition_penalty"),
        "seed": optional_int(body, "seed", minimum=0),
        "stop": optional_stop(body),
        "ignore_eos": optional_bool(body, "ignore_eos"),
        "n": optional_int(body, "n", 1, minimum=1),
        "logit_bias": logit_bias(body, engine.model_config["vocab_size"]),
        "strict_json_schema": optional_bool(body, "strict_json_schema", None),  # None: the server's --strict-json-schema
        **structured_output(body),
    }


def logit_bias(body: JsonObject, vocab_size: int) -> dict[int, float] | None:
    """OpenAI's `logit_bias`: token ids (as JSON object keys, so strings) to biases in [-100, 100]."""
    bias = optional_dict(body, "logit_bias")
    parsed = {}
    for key, value in bias.items():
        token = int(key) if key.isdecimal() else -1
        if not 0 <= token < vocab_size:
            raise bad_request(f"logit_bias: {key!r} is not a token id of this model (0 to {vocab_size - 1})", "logit_bias")
        if not isinstance(value, int | float) or isinstance(value, bool) or not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
            raise bad_request(f"logit_bias: the bias of token {key} must be a number from -100 to 100, got {value!r}", "logit_bias")
        parsed[token] = float(value)
    return parsed or None


def chat_messages(body: JsonObject) -> list[JsonObject]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list", "messages")
    return [chat_message(message, f"messages[{i}]") for i, message in enumerate(messages)]


def chat_message(message: Any, param: str) -> JsonObject:
    if not isinstance(message, dict) or message.get("role") not in CHAT_ROLES:
        raise bad_request(f"{param} must be an object whose role is one of {', '.join(CHAT_ROLES)}", param)
    message = modern_message(message, param)
    role = "system" if message["role"] == "developer" else message["role"]  # "developer" is OpenAI's newer "system"
    check_past_calls(message, param)
    return {**message, **past_reasoning(message, param), "role": role, "content": message_text(message.get("content"), f"{param}.content")}


def past_reasoning(message: JsonObject, param: str) -> JsonObject:
    """An assistant turn's `reasoning_content`, as this server answers it, also under the name some
    templates read it by (`thinking`: gpt-oss's keeps the reasoning that led to a call)."""
    reasoning = message.get("reasoning_content")
    if reasoning is None or "thinking" in message:
        return {}
    if not isinstance(reasoning, str):
        raise bad_request(f"{param}.reasoning_content must be a string", param)
    return {"thinking": reasoning}


def message_text(content: Any, param: str) -> str | list[JsonObject]:
    """A message's content for the chat template: text, or (with images) its parts, each image a placeholder part."""
    if content is None:
        return ""  # an assistant turn that only called tools
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(is_text_part(part) for part in content):
        return "\n".join(part["text"] for part in content)
    if isinstance(content, list) and all(is_text_part(part) or is_image_part(part) for part in content):
        return [template_part(part) for part in content]
    raise bad_request(f"{param} must be a string or a list of text and image_url parts", param)


def chat_images(body: JsonObject) -> list[RequestImage]:
    """The messages' image parts, in order (after chat_messages checked the messages)."""
    return [
        image_url(part, f"messages[{i}].content[{j}]")
        for i, message in enumerate(body["messages"])
        if isinstance(message.get("content"), list)
        for j, part in enumerate(message["content"])
        if is_image_part(part)
    ]


def is_text_part(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)


# ---- response shapes ----------------------------------------------------------------------------


def completion_choice(index: int, text: str, logprobs: JsonObject | None, finish_reason: str | None) -> JsonObject:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


def token_text(engine: Engine, token_id: int) -> str:
    return engine.decode([token_id], skip_special_tokens=False)


def completion_logprobs(engine: Engine, scores: TokenScores, text_offset: int) -> JsonObject:
    """Tokens' logprobs in /v1/completions' shape; `text_offset` is where the first of them begins
    in the generated text."""
    tokens = [token_text(engine, token_id) for _, token_id, _ in scores.chosen]
    offsets = []
    for token in tokens:
        offsets.append(text_offset)
        text_offset += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": [logprob for logprob, _, _ in scores.chosen],
        "top_logprobs": [None if top is None else {token_text(engine, t): lp for lp, t, _ in top} for top in scores.top],
        "text_offset": offsets,
    }


def chat_logprobs(engine: Engine, scores: TokenScores, text_offset: int) -> JsonObject:
    """Tokens' logprobs in /v1/chat/completions' shape (`text_offset` is unused)."""
    return {
        "content": [
            {**chat_token(engine, logprob, token_id), "top_logprobs": [chat_token(engine, lp, t) for lp, t, _ in top]}
            for (logprob, token_id, _), top in zip(scores.chosen, scores.top)
        ]
    }


def chat_token(engine: Engine, logprob: float, token_id: int) -> JsonObject:
    token = token_text(engine, token_id)
    return {"token": token, "logprob": logprob, "bytes": list(token.encode())}


@dataclass(frozen=True)
class TokenScores:
    """Some output tokens' SGLang (logprob, token_id, text) triples, and each one's top
    alternatives (None for an echoed prompt's first token)."""

    chosen: list[Any]
    top: list[Any]

    @classmethod
    def of(cls, meta: JsonObject) -> TokenScores:
        """The scores in a result's or a chunk's meta_info (none without return_logprob)."""
        return cls(meta.get("output_token_logprobs", []), meta.get("output_top_logprobs", []))


@dataclass(frozen=True)
class ResponseShape:
    """How one OpenAI endpoint lays out its answers; choice builders take (index, text, logprobs, finish_reason)."""

    id_prefix: str
    object: str
    chunk_object: str
    choice: Callable[..., JsonObject]
    chunk_choice: Callable[..., JsonObject]
    logprobs: Callable[[Engine, TokenScores, int], JsonObject]
    opening_chunk_choice: JsonObject | None = None  # sent before any text when streaming


COMPLETION = ResponseShape("cmpl-", "text_completion", "text_completion", completion_choice, completion_choice, completion_logprobs)


def chat_shape(reader: ChatReader) -> ResponseShape:
    """Chat's layout for one request: `reader` turns its text into message fields (a stream is one choice)."""
    return ResponseShape(
        "chatcmpl-",
        "chat.completion",
        "chat.completion.chunk",
        reader.choice,
        reader.deltas().chunk_choice,
        chat_logprobs,
        opening_chunk_choice={"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None},
    )


def finish_reason_of(meta: JsonObject) -> str | None:
    finish = meta["finish_reason"]
    if finish is None:
        return None
    if finish["type"] == "abort":  # OpenAI has no such finish reason: it is an error
        raise APIError(503, f"The request was aborted: {finish.get('message', 'no reason given')}", type="service_unavailable")
    return "length" if finish["type"] == "length" else "stop"


def usage_of(outputs: list[JsonObject], n: int) -> JsonObject:
    prompt_tokens = sum(out["meta_info"]["prompt_tokens"] for out in outputs[::n])  # each prompt once, not once per sample
    completion_tokens = sum(out["meta_info"]["completion_tokens"] for out in outputs)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}


# ---- answering ----------------------------------------------------------------------------------


async def respond(request: Request, body: JsonObject, shape: ResponseShape, arguments: GenerateArguments, n: int, echo: bool = False) -> Response:
    """Runs `arguments` (Engine.generate's, `n` samples per prompt) and answers in `shape`, streamed
    or whole; with `echo`, each answer starts with its prompt (decoded once the engine has
    accepted the request, so token ids are known to be valid)."""
    engine = engine_of(request)
    arguments["lora_path"] = check_model(body, request)
    header = {
        "id": shape.id_prefix + uuid.uuid4().hex,
        "object": shape.object,
        "created": int(time.time()),
        "model": engine.served_model_name,
    }
    return_logprob = arguments.get("return_logprob", False)
    if optional_bool(body, "stream"):
        include_usage = optional_bool(optional_dict(body, "stream_options"), "include_usage")
        stream = await EngineStream.start(request, arguments)
        chunks = echo_stream(stream, echoed_prompts(engine, arguments)[0]) if echo else stream
        return with_schema_warnings(EventStreamResponse(stream_chunks(engine, chunks, shape, header, return_logprob, include_usage), stream), arguments)
    whole = await generate_whole(request, arguments)
    outputs = whole if isinstance(whole, list) else [whole]
    if echo:
        prompts = echoed_prompts(engine, arguments)
        outputs = [with_prompt(output, prompts[i // n]) for i, output in enumerate(outputs)]
    choices = [whole_choice(engine, shape, i, out, return_logprob) for i, out in enumerate(outputs)]
    return with_schema_warnings(json_response({**header, "choices": choices, "usage": usage_of(outputs, n)}), arguments)


def with_schema_warnings(response: Response, arguments: GenerateArguments) -> Response:
    """Adds the `x-rsgl-schema-warnings` header, a JSON list of what the grammar relaxes in the
    request's json_schema (`{"keyword", "pointer", "action"}` each), when it relaxes anything."""
    params = arguments.get("sampling_params")
    schema = params.get("json_schema") if isinstance(params, dict) else None
    if isinstance(schema, str) and (warnings := json_schema_warnings(schema)):
        response.headers["x-rsgl-schema-warnings"] = json.dumps(warnings)  # ASCII-escaped, as headers must be
    return response


def echoed_prompts(engine: Engine, arguments: GenerateArguments) -> list[str]:
    """The text of each prompt, for `echo` (token-id prompts decoded)."""
    prompt, input_ids = arguments.get("prompt"), arguments.get("input_ids")
    if prompt is not None:
        return [prompt] if isinstance(prompt, str) else prompt
    assert input_ids is not None
    return [engine.decode(ids) for ids in (input_ids if isinstance(input_ids[0], list) else [input_ids])]


def with_prompt(output: JsonObject, prompt: str) -> JsonObject:
    """`output` as if its prompt had been generated too (OpenAI's `echo`): the prompt's text first,
    and, with logprobs, its tokens' log-probabilities and top alternatives first (the first token
    has none). Token counts keep to what was generated."""
    meta = dict(output["meta_info"])
    echoed = {**output, "text": prompt + output["text"], "meta_info": meta}
    prompt_logprobs = meta.get("input_token_logprobs")
    if prompt_logprobs is not None:
        echoed["output_ids"] = [token_id for _, token_id, _ in prompt_logprobs] + output["output_ids"]
        meta["output_token_logprobs"] = prompt_logprobs + meta["output_token_logprobs"]
        meta["output_top_logprobs"] = meta.get("input_top_logprobs", [None] * len(prompt_logprobs)) + meta["output_top_logprobs"]
    return echoed


async def echo_stream(stream: EngineStream, prompt: str) -> AsyncIterator[JsonObject]:
    """A stream of engine deltas whose first chunk brings the prompt first."""
    echoed = False
    async for chunk in stream:
        yield chunk if echoed else with_prompt(chunk, prompt)
        echoed = True


def whole_choice(engine: Engine, shape: ResponseShape, index: int, output: JsonObject, return_logprob: bool) -> JsonObject:
    meta = output["meta_info"]
    logprobs = shape.logprobs(engine, TokenScores.of(meta), 0) if return_logprob else None
    return shape.choice(index, output["text"], logprobs, finish_reason_of(meta))


@dataclass(frozen=True)
class TextStep:
    """What one step of a stream sends: its new text, the finish reason once there is one, the
    last engine chunk behind it (whose meta_info counts the tokens so far), the scores of the tokens
    behind its text, and how many characters were sent before it."""

    new_text: str
    finish_reason: str | None
    chunk: JsonObject
    scores: TokenScores
    sent_chars: int


async def text_steps(stream: AsyncIterator[JsonObject]) -> AsyncIterator[TextStep]:
    """The steps of a stream of engine deltas; a chunk that adds no text (a partial character or a
    possible stop string held back) goes with the next one."""
    sent_chars = 0
    held = TokenScores([], [])
    async for chunk in stream:
        finish_reason = finish_reason_of(chunk["meta_info"])
        scores = TokenScores.of(chunk["meta_info"])
        held.chosen.extend(scores.chosen)
        held.top.extend(scores.top)
        if not chunk["text"] and finish_reason is None:
            continue
        yield TextStep(chunk["text"], finish_reason, chunk, held, sent_chars)
        sent_chars += len(chunk["text"])
        held = TokenScores([], [])


async def stream_chunks(
    engine: Engine, stream: AsyncIterator[JsonObject], shape: ResponseShape, header: JsonObject, return_logprob: bool, include_usage: bool
) -> AsyncIterator[JsonObject]:
    """OpenAI's chunks for one streaming choice, each with what is new (text and the logprobs of
    the tokens behind it)."""
    header = {**header, "object": shape.chunk_object}
    if shape.opening_chunk_choice:
        yield {**header, "choices": [shape.opening_chunk_choice]}
    last = None
    async for step in text_steps(stream):
        last = step.chunk
        logprobs = shape.logprobs(engine, step.scores, step.sent_chars) if return_logprob else None
        yield {**header, "choices": [shape.chunk_choice(0, step.new_text, logprobs, step.finish_reason)]}
    if include_usage and last is not None:
        yield {**header, "choices": [], "usage": usage_of([last], 1)}
