"""LoRA adapters loaded and unloaded over HTTP on a real server started without any
(`POST /load_lora_adapter`, `/unload_lora_adapter`, SGLang's routes and result shape): /v1/models
follows them, their greedy tokens are transformers + peft's, refusals are 400s carrying SGLang's
result and the API's error; adapters come and go while streams on the base model and on other
adapters run, and every stream completes with the tokens it gets alone; the KV pool drains after."""

from __future__ import annotations

import asyncio

import httpx
import orjson
import pytest
from lora_adapters import ADAPTERS, greedy, save_adapter, with_adapter
from server_helpers import AUTH, drained, openai_client, running_server
from tiny_models import build_byte_llama

IDS = [1, 72, 101, 108, 108, 111, 33]
GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
# Streams that run while adapters are loaded and unloaded (most likely: a few ms each), and ones that hold an adapter
# until they are aborted (the context's length, which they never reach).
LONG = {"temperature": 0, "max_new_tokens": 1500, "ignore_eos": True}
HOLD = {"temperature": 0, "max_new_tokens": 16000, "ignore_eos": True}
SCENARIO_TIMEOUT_SECONDS = 300
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    """(url, {name: adapter folder}, {None: base, name: peft model}) of a server of a tiny byte-level
    Llama started with no adapters; adapters a, b and c (a's config, other weights) are saved."""
    base_path = tmp_path_factory.mktemp("lora-runtime-base")
    base, _ = build_byte_llama(base_path, {"max_position_embeddings": 16384}, chat_template=CHAT_TEMPLATE)
    folders, models = {}, {None: base}
    for seed, (name, config) in enumerate([*ADAPTERS.items(), ("c", ADAPTERS["a"])]):
        folder = tmp_path_factory.mktemp(f"lora-runtime-{name}")
        save_adapter(base, folder, seed, **config)
        folders[name], models[name] = str(folder), with_adapter(base, folder)
    options = ("--model-path", str(base_path), "--dtype", "float32", "--threads", "2", "--max-total-tokens", "65536", "--served-model-name", "tiny")
    with running_server(tmp_path_factory.mktemp("lora-runtime-server"), *options) as (url, _):
        yield url, folders, models


def post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}{path}", headers=AUTH, json=body, timeout=60)


def model_ids(url: str) -> list[str]:
    return [model.id for model in openai_client(url).models.list().data]


def generate(url: str, lora: str | None, sampling: dict = GREEDY) -> httpx.Response:
    return post(url, "/generate", {"input_ids": IDS, "sampling_params": sampling, "lora_path": lora})


def test_a_server_started_without_adapters_loads_and_unloads_them(served):
    url, folders, models = served
    assert model_ids(url) == ["tiny"]
    loaded = post(url, "/load_lora_adapter", {"lora_name": "a", "lora_path": folders["a"]})
    assert loaded.status_code == 200, loaded.text
    assert loaded.json() == {"success": True, "error_message": "", "loaded_adapters": {"a": folders["a"]}}
    assert model_ids(url) == ["tiny", "a"]
    assert generate(url, "a").json()["output_ids"] == greedy(models["a"], IDS, GREEDY["max_new_tokens"])
    unloaded = post(url, "/unload_lora_adapter", {"lora_name": "a"})
    assert unloaded.status_code == 200 and unloaded.json() == {"success": True, "error_message": "", "loaded_adapters": {}}
    assert model_ids(url) == ["tiny"]
    refused = generate(url, "a")
    assert refused.status_code == 400 and 'lora_path "a"' in refused.json()["error"]["message"]


def refusal(response: httpx.Response, loaded: dict[str, str]) -> str:
    """The message of a refused load or unload: a 400 with SGLang's result and the API's error."""
    assert response.status_code == 400, response.text
    body = response.json()
    assert (body["success"], body["loaded_adapters"]) == (False, loaded)
    assert body["error"]["message"] == body["error_message"] and body["error"]["type"] == "invalid_request_error"
    return body["error_message"]


def test_refused_loads_and_unloads_are_400s_naming_the_fault(served):
    url, folders, _ = served
    assert 'LoRA adapter "nope" is not loaded' in refusal(post(url, "/unload_lora_adapter", {"lora_name": "nope"}), {})
    assert "lora_name" in refusal(post(url, "/load_lora_adapter", {"lora_path": folders["b"]}), {})
    assert "lora_path" in refusal(post(url, "/load_lora_adapter", {"lora_name": "b"}), {})
    for unreadable in ("/nonexistent/adapter", "~no-such-user-of-rsgl/adapter"):
        assert "is not a folder" in refusal(post(url, "/load_lora_adapter", {"lora_name": "b", "lora_path": unreadable}), {})
    assert "name too long" in refusal(post(url, "/load_lora_adapter", {"lora_name": "b", "lora_path": "/" + "é" * 200}), {})
    assert post(url, "/load_lora_adapter", {"lora_name": "b", "lora_path": folders["b"]}).status_code == 200
    again = post(url, "/load_lora_adapter", {"lora_name": "b", "lora_path": folders["a"]})
    assert 'LoRA adapter "b" is already loaded' in refusal(again, {"b": folders["b"]})
    assert post(url, "/unload_lora_adapter", {"lora_name": "b"}).status_code == 200


async def stream(http: httpx.AsyncClient, lora: str | None, started: asyncio.Event, sampling: dict = LONG) -> dict:
    """The last chunk of a streamed /generate (its chunks are cumulative); `started` is set at its first."""
    last: dict = {}
    body = {"input_ids": IDS, "sampling_params": sampling, "lora_path": lora, "stream": True}
    async with http.stream("POST", "/generate", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                last = orjson.loads(line[6:])
                started.set()
    return last


def start(http: httpx.AsyncClient, lora: str | None, sampling: dict = LONG) -> tuple[asyncio.Task, asyncio.Event]:
    started = asyncio.Event()
    return asyncio.create_task(stream(http, lora, started, sampling)), started


def test_adapters_come_and_go_while_streams_run_and_every_stream_completes(served):
    url, folders, models = served
    for name in ("a", "b"):
        assert post(url, "/load_lora_adapter", {"lora_name": name, "lora_path": folders[name]}).status_code == 200

    async def under_load() -> tuple[list[str | None], list[dict], int]:
        async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=SCENARIO_TIMEOUT_SECONDS) as http:
            # Two streams hold a for as long as the calls take (they are aborted after); others on the base model
            # run as they come and go, and one on c once it is loaded.
            holders, holding = zip(*(start(http, "a", HOLD) for _ in range(2)))
            loras: list[str | None] = [None, None]
            streams, started = zip(*(start(http, lora) for lora in loras))
            await asyncio.wait_for(asyncio.gather(*(event.wait() for event in [*holding, *started])), SCENARIO_TIMEOUT_SECONDS)
            in_use = await http.post("/unload_lora_adapter", json={"lora_name": "a"})
            assert 'LoRA adapter "a" is in use by 2 requests (running or waiting)' in refusal(in_use, {"a": folders["a"], "b": folders["b"]})
            unloaded = await http.post("/unload_lora_adapter", json={"lora_name": "b"})
            assert unloaded.json() == {"success": True, "error_message": "", "loaded_adapters": {"a": folders["a"]}}
            loaded = await http.post("/load_lora_adapter", json={"lora_name": "c", "lora_path": folders["c"]})
            assert loaded.status_code == 200, loaded.text
            holding_through = sum(not task.done() for task in holders)  # a stream's task ends with the server's stream
            on_c, _ = start(http, "c")
            finals = await asyncio.gather(*streams, on_c)
            for task in holders:
                task.cancel()  # closing the connection aborts the request
            await asyncio.gather(*holders, return_exceptions=True)
            return [*loras, "c"], finals, holding_through

    loras, finals, holding_through = asyncio.run(under_load())
    assert holding_through == 2, "the adapters changed while the streams ran"
    assert model_ids(url) == ["tiny", "a", "c"]
    for lora, final in zip(loras, finals):
        assert final["meta_info"]["finish_reason"]["type"] == "length" and len(final["output_ids"]) == LONG["max_new_tokens"], lora
        assert final["output_ids"] == generate(url, lora, LONG).json()["output_ids"], lora
    assert generate(url, "c").json()["output_ids"] == greedy(models["c"], IDS, GREEDY["max_new_tokens"])
    info = drained(url)
    assert info["running_requests"] == info["waiting_requests"] == 0
    assert info["kv_pages_free"] + info["cached_pages"] == info["kv_pages_total"] and info["kv_pages_used"] == 0
    for name in ("a", "c"):
        assert post(url, "/unload_lora_adapter", {"lora_name": name}).status_code == 200
    assert model_ids(url) == ["tiny"]


def test_the_openai_chat_api_picks_a_loaded_adapter_by_model_name(served):
    url, folders, models = served
    assert post(url, "/load_lora_adapter", {"lora_name": "b", "lora_path": folders["b"]}).status_code == 200
    question = [{"role": "user", "content": "hello"}]
    ids = post(url, "/tokenize", {"prompt": "user: hello\nassistant:"}).json()["tokens"]
    client = openai_client(url)
    answers = []
    for model, lora in (("b", "b"), ("tiny", None)):
        chat = client.chat.completions.create(model=model, messages=question, temperature=0, max_tokens=8, extra_body={"ignore_eos": True})
        expected = post(url, "/detokenize", {"tokens": greedy(models[lora], ids, 8)}).json()["text"]
        assert chat.choices[0].message.content == expected, model
        answers.append(expected)
    assert answers[0] != answers[1], "the adapter changes the answer"
    assert post(url, "/unload_lora_adapter", {"lora_name": "b"}).status_code == 200
