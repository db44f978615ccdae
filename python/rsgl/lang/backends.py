"""Where a program's `gen` and `select` run: an in-process `rsgl.Engine`, or a server's native
HTTP API (`RuntimeEndpoint`). Both render role blocks with the model's chat template, tokenize on
the engine's side and score choices the same way, so a greedy program gives the same output on
either."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any, Protocol

from rsgl._typing import JsonObject
from rsgl.chat_template import render_chat
from rsgl.engine import Engine, check_choices, continuation_start, rank_choices
from rsgl.errors import InvalidRequestError, RsglError

ROLES = ("system", "user", "assistant")
# Stands in for a message's content while finding the text a template puts around it.
_CONTENT = "\x00rsgl-content\x00"


class Backend(Protocol):
    def generate(self, text: str, sampling_params: JsonObject) -> JsonObject:
        """SGLang's result: {"text", "meta_info"}."""

    def generate_stream(self, text: str, sampling_params: JsonObject) -> Iterator[str]:
        """The generated text in pieces, as it comes."""

    def select(self, text: str, choices: list[str]) -> JsonObject:
        """`Engine.select`'s result: {"text", "index", "logprobs", "normalized_logprobs"}."""

    def role_markers(self, role: str) -> tuple[str, str]:
        """The text the chat template puts before and after a `role` message's content."""


_default_backend: Backend | None = None


def set_default_backend(backend: Backend | Engine) -> None:
    """The backend programs run on when `run` is given none (an Engine is wrapped for you)."""
    global _default_backend
    _default_backend = as_backend(backend)


def as_backend(backend: Backend | Engine | None) -> Backend:
    if backend is None:
        if _default_backend is None:
            raise InvalidRequestError("no backend: pass backend=... to run, or call rsgl.set_default_backend(rsgl.Engine()) first")
        return _default_backend
    return EngineBackend(backend) if isinstance(backend, Engine) else backend


def role_markers(template: str | None, bos_token: str | None, eos_token: str | None, add_bos_token: bool) -> dict[str, tuple[str, str]]:
    """Each role's (prefix, suffix) in `template`: a message rendered after a system message,
    minus that system message alone (so a template's default system prompt stays out). With
    `add_bos_token` (the engine puts BOS before every prompt) the template's own BOS is left out."""

    def render(messages: list[JsonObject]) -> str:
        return render_chat(template, messages, add_generation_prompt=False, bos_token=bos_token, eos_token=eos_token)

    markers: dict[str, tuple[str, str]] = {}
    first = {"role": "system", "content": "x"}
    for role in ROLES:
        if role == "system":
            before, after = render([{"role": "system", "content": _CONTENT}]).split(_CONTENT)
            if add_bos_token:
                before = before.removeprefix(bos_token or "")
        else:
            head = render([first])
            before, after = render([first, {"role": role, "content": _CONTENT}]).removeprefix(head).split(_CONTENT)
        markers[role] = (before, after)
    return markers


class EngineBackend:
    """Runs programs on an in-process `rsgl.Engine`."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        model = engine.model
        self._markers = role_markers(model.chat_template, model.bos_token, model.eos_token, model.add_bos_token)

    def generate(self, text: str, sampling_params: JsonObject) -> JsonObject:
        out = self.engine.generate(text, dict(sampling_params))
        if not isinstance(out, dict):
            raise InvalidRequestError("a program's gen takes n=1 (one sample per call)")
        return out

    def generate_stream(self, text: str, sampling_params: JsonObject) -> Iterator[str]:
        for chunk in self.engine._generate_deltas(text, dict(sampling_params)):
            yield chunk["text"]

    def select(self, text: str, choices: list[str]) -> JsonObject:
        return self.engine.select(text, choices)

    def role_markers(self, role: str) -> tuple[str, str]:
        return self._markers[role]


class RuntimeEndpoint:
    """Runs programs on a running `python -m rsgl.server` (or SGLang-compatible) server through its
    native API: /generate (streamed as server-sent events), /tokenize and /get_model_info."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 600) -> None:
        self.base_url = base_url.rstrip("/")
        self.headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
        self.timeout = timeout
        info = self._request("GET", "/get_model_info")
        self._markers = role_markers(info.get("chat_template"), info.get("bos_token"), info.get("eos_token"), info.get("add_bos_token", False))

    def generate(self, text: str, sampling_params: JsonObject) -> JsonObject:
        result: JsonObject = self._request("POST", "/generate", {"text": text, "sampling_params": sampling_params})
        return result

    def generate_stream(self, text: str, sampling_params: JsonObject) -> Iterator[str]:
        body = {"text": text, "sampling_params": sampling_params, "stream": True}
        sent = 0  # characters: /generate streams the whole text so far, as SGLang's does
        with self._open("POST", "/generate", body) as response:
            for line in response:
                payload = line.decode().strip().removeprefix("data: ")
                if not payload or payload == "[DONE]":
                    continue
                chunk = json.loads(payload)
                if "error" in chunk:
                    raise RsglError(chunk["error"].get("message", "the server ended the stream with an error"))
                yield chunk["text"][sent:]
                sent = len(chunk["text"])

    def select(self, text: str, choices: list[str]) -> JsonObject:
        check_choices(text, choices)
        prompt_ids = self._request("POST", "/tokenize", {"prompt": text})["tokens"]
        full_ids = self._request("POST", "/tokenize", {"prompt": [text + c for c in choices]})["tokens"]
        starts = [continuation_start(prompt_ids, ids) for ids in full_ids]
        # One batch scored from the earliest start; each choice keeps its own tokens' values.
        first = min(starts)
        body = {"input_ids": full_ids, "sampling_params": {"max_new_tokens": 0, "temperature": 0}, "return_logprob": True, "logprob_start_len": first}
        results = self._request("POST", "/generate", body)
        token_logprobs = [[lp for lp, _, _ in result["meta_info"]["input_token_logprobs"][start - first :]] for result, start in zip(results, starts)]
        return rank_choices(choices, token_logprobs)

    def role_markers(self, role: str) -> tuple[str, str]:
        return self._markers[role]

    def _request(self, method: str, path: str, body: JsonObject | None = None) -> Any:
        """The server's JSON answer (an object, or a list of them for a batch)."""
        with self._open(method, path, body) as response:
            return json.loads(response.read())

    def _open(self, method: str, path: str, body: JsonObject | None) -> http.client.HTTPResponse:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, headers=self.headers, method=method)
        try:
            response: http.client.HTTPResponse = urllib.request.urlopen(request, timeout=self.timeout)
            return response
        except urllib.error.HTTPError as error:
            message = _error_message(error)
            if error.code == 400:
                raise InvalidRequestError(message) from None
            raise RsglError(f"{method} {path} failed with HTTP {error.code}: {message}") from None
        except urllib.error.URLError as error:
            raise RsglError(f"cannot reach the server at {self.base_url}: {error.reason}") from None


def _error_message(error: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(error.read())["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return error.reason
