"""End to end: `python -m rsgl.server` in a subprocess, driven by real clients (openai, httpx)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import signal
import time
import uuid
from collections.abc import Iterator

import httpx
import openai
import pytest
from rsgl.server import build_app
from server_helpers import API_KEY, AUTH, assert_openai_error, metric_values, running_server, sse_lines_payloads

PROMPT = "The capital of France is"
# Runs for many seconds unless stopped.
LONG_STREAM = {"text": "Once upon a time", "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True}, "stream": True}


# ---- the server ---------------------------------------------------------------------------------


def native_generate(http: httpx.Client, **body) -> dict | list:
    response = http.post("/generate", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def prompt_token_count(http: httpx.Client, text: str) -> int:
    """How many tokens the engine's tokenizer makes of `text`, as /generate reports it."""
    return native_generate(http, text=text, sampling_params={"max_new_tokens": 1})["meta_info"]["prompt_tokens"]


def sse_payloads(response: httpx.Response) -> list:
    """The `data:` payloads of a server-sent event stream, the final "[DONE]" kept as is."""
    return sse_lines_payloads(list(response.iter_lines()))


def started_stream(streams: contextlib.ExitStack, http: httpx.Client, path: str, body: dict) -> Iterator[str]:
    """The lines of a streaming response that has begun (its first line is read and given back first).
    The iterator holds the connection open: dropping it would close the stream."""
    lines = streams.enter_context(http.stream("POST", path, json=body)).iter_lines()
    return itertools.chain([next(lines)], lines)


# ---- informational endpoints ---------------------------------------------------------------------


def test_health_needs_no_api_key(server_url: str):
    response = httpx.get(f"{server_url}/health")
    assert response.status_code == 200 and response.text == ""


def assert_created_since(created, since: float) -> None:
    """An OpenAI `created`: whole Unix seconds, no earlier than `since` and no later than now."""
    assert type(created) is int and int(since) <= created <= time.time(), (created, since)


def test_models_and_model_info(http: httpx.Client, model: str, server_started_at: float):
    models = http.get("/v1/models").json()
    assert models["object"] == "list"
    [entry] = models["data"]
    created = entry.pop("created")
    assert entry == {"id": model, "object": "model", "owned_by": "sglang"}
    assert_created_since(created, server_started_at)  # when the server started
    info = http.get("/get_model_info").json()
    assert info["served_model_name"] == model and info["is_generation"] is True and info["model_path"]
    server_info = http.get("/get_server_info").json()
    assert server_info["served_model_name"] == model and "running_requests" in server_info
    assert http.get("/server_info").json().keys() == server_info.keys(), "SGLang's newer name for it"


# ---- /v1/completions ---------------------------------------------------------------------------


def test_completion_greedy_says_paris_with_real_token_counts(client: openai.OpenAI, http: httpx.Client, model: str):
    requested_at = time.time()
    completion = client.completions.create(model=model, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=2)
    assert completion.id.startswith("cmpl-") and completion.object == "text_completion" and completion.model == model
    assert_created_since(completion.created, requested_at)
    [choice] = completion.choices
    assert choice.index == 0 and choice.text.startswith(" Paris") and choice.finish_reason == "length"
    assert "".join(choice.logprobs.tokens) == choice.text
    assert len(choice.logprobs.top_logprobs) == 4 and all(len(top) == 2 for top in choice.logprobs.top_logprobs)
    assert choice.logprobs.text_offset[:2] == [0, len(" Paris")]
    usage = completion.usage
    assert usage.completion_tokens == len(choice.logprobs.tokens) == 4
    assert usage.prompt_tokens == prompt_token_count(http, PROMPT)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_completion_from_token_ids(client: openai.OpenAI, http: httpx.Client, model: str):
    token_ids = native_generate(http, text=PROMPT, sampling_params={"max_new_tokens": 3})["output_ids"]
    completion = client.completions.create(model=model, prompt=token_ids, max_tokens=2)
    assert completion.usage.prompt_tokens == len(token_ids)


def test_completion_stream_matches_whole_answer(client: openai.OpenAI, model: str):
    request = {"model": model, "prompt": PROMPT, "max_tokens": 6, "temperature": 0}
    whole = client.completions.create(**request)
    requested_at = time.time()
    chunks = list(client.completions.create(**request, stream=True, stream_options={"include_usage": True}))
    *text_chunks, usage_chunk = chunks
    assert all(chunk.id == chunks[0].id and chunk.object == "text_completion" for chunk in chunks)
    assert all(chunk.created == chunks[0].created for chunk in chunks)
    assert_created_since(chunks[0].created, requested_at)
    assert chunks[0].id.startswith("cmpl-")
    assert "".join(chunk.choices[0].text for chunk in text_chunks) == whole.choices[0].text
    assert text_chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason == "length"
    assert usage_chunk.choices == [] and usage_chunk.usage == whole.usage


def test_completion_stop_string(client: openai.OpenAI, model: str):
    completion = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0, stop=["."])
    assert completion.choices[0].text == " Paris" and completion.choices[0].finish_reason == "stop"


def test_completion_batch_with_n_samples(client: openai.OpenAI, http: httpx.Client, model: str):
    prompts = [PROMPT, "Hello"]
    completion = client.completions.create(model=model, prompt=prompts, n=2, max_tokens=3, seed=7, extra_body={"ignore_eos": True})
    assert [choice.index for choice in completion.choices] == [0, 1, 2, 3]
    assert completion.usage.completion_tokens == 4 * 3  # summed over every choice
    assert completion.usage.prompt_tokens == sum(prompt_token_count(http, p) for p in prompts)  # each prompt once


# ---- /v1/chat/completions ------------------------------------------------------------------------

MESSAGES = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]


def test_chat_completion_shape_and_logprobs(client: openai.OpenAI, model: str):
    completion = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2)
    assert completion.id.startswith("chatcmpl-") and completion.object == "chat.completion" and completion.model == model
    [choice] = completion.choices
    assert choice.message.role == "assistant" and choice.message.content
    tokens = choice.logprobs.content
    assert "".join(token.token for token in tokens) == choice.message.content
    assert all(len(token.top_logprobs) == 2 and token.bytes == list(token.token.encode()) for token in tokens)
    assert choice.finish_reason == "length" and completion.usage.completion_tokens == len(tokens) == 6
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens


def test_chat_stream_with_async_client_matches_whole_answer(client: openai.OpenAI, server_url: str, model: str):
    request = {"model": model, "messages": MESSAGES, "max_completion_tokens": 6, "temperature": 0}
    whole = client.chat.completions.create(**request)

    async def stream() -> list:
        async with openai.AsyncOpenAI(base_url=f"{server_url}/v1", api_key=API_KEY) as async_client:
            chunks = await async_client.chat.completions.create(**request, stream=True, stream_options={"include_usage": True})
            return [chunk async for chunk in chunks]

    chunks = asyncio.run(stream())
    first, *content_chunks, usage_chunk = chunks
    assert all(chunk.object == "chat.completion.chunk" and chunk.id.startswith("chatcmpl-") for chunk in chunks)
    assert first.choices[0].delta.role == "assistant"
    assert "".join(chunk.choices[0].delta.content or "" for chunk in content_chunks) == whole.choices[0].message.content
    assert content_chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert usage_chunk.choices == [] and usage_chunk.usage == whole.usage


def test_chat_n_gives_two_choices(client: openai.OpenAI, model: str):
    completion = client.chat.completions.create(model=model, messages=MESSAGES, n=2, max_tokens=2, seed=1)
    assert [choice.index for choice in completion.choices] == [0, 1]
    assert all(choice.message.role == "assistant" for choice in completion.choices)


# ---- /generate ------------------------------------------------------------------------------------


def test_generate_single_batch_and_token_ids(http: httpx.Client):
    greedy = {"temperature": 0, "max_new_tokens": 3}
    single = native_generate(http, text=PROMPT, sampling_params=greedy)
    assert single["text"].startswith(" Paris") and len(single["output_ids"]) == single["meta_info"]["completion_tokens"] == 3
    assert single["meta_info"]["finish_reason"]["type"] == "length"
    batch = native_generate(http, text=[PROMPT, "Hello"], sampling_params=greedy)
    assert len(batch) == 2 and batch[0]["text"] == single["text"]
    from_ids = native_generate(http, input_ids=single["output_ids"], sampling_params={"max_new_tokens": 2}, return_logprob=True)
    assert from_ids["meta_info"]["prompt_tokens"] == 3 and len(from_ids["meta_info"]["output_token_logprobs"]) == 2


def test_generate_stream_sends_cumulative_text(http: httpx.Client):
    body = {"text": PROMPT, "sampling_params": {"temperature": 0, "max_new_tokens": 4}}
    whole = native_generate(http, **body)
    with http.stream("POST", "/generate", json={**body, "stream": True}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        *chunks, done = sse_payloads(response)
    assert done == "[DONE]" and len(chunks) == 4
    assert all(later["text"].startswith(earlier["text"]) for earlier, later in zip(chunks, chunks[1:]))
    assert chunks[-1]["text"] == whole["text"] and chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"


def test_generate_gives_each_logprob_its_token_text_when_asked(http: httpx.Client):
    body = {"text": PROMPT, "sampling_params": {"temperature": 0, "max_new_tokens": 3}, "return_logprob": True, "top_logprobs_num": 2}
    assert native_generate(http, **body)["meta_info"]["input_token_logprobs"] == [], "no prompt logprobs without logprob_start_len"
    body |= {"logprob_start_len": 0, "return_text_in_logprobs": True}
    whole = native_generate(http, **body)
    with http.stream("POST", "/generate", json={**body, "stream": True}) as response:
        *_, last, _ = sse_payloads(response)
    for meta in (whole["meta_info"], last["meta_info"]):
        entries = meta["input_token_logprobs"] + meta["output_token_logprobs"] + [e for top in meta["output_top_logprobs"] for e in top]
        texts = http.post("/detokenize", json={"tokens": [[token_id] for _, token_id, _ in entries], "skip_special_tokens": False}).json()["text"]
        assert [text for _, _, text in entries] == texts
        assert "".join(text for _, _, text in meta["input_token_logprobs"]) == PROMPT


def test_client_disconnect_aborts_the_stream(http: httpx.Client):
    # The abort should stop it within a step or two.
    with http.stream("POST", "/generate", json=LONG_STREAM) as response:
        next(response.iter_lines())
    deadline = time.monotonic() + 5
    while http.get("/get_server_info").json()["running_requests"]:
        assert time.monotonic() < deadline, "the request kept running after its client left"
        time.sleep(0.05)


def test_repeated_prompt_hits_the_prefix_cache_until_flushed(http: httpx.Client):
    body = {"text": "A long shared system prompt. " * 12 + "Question?", "sampling_params": {"temperature": 0, "max_new_tokens": 2}}
    native_generate(http, **body)
    assert native_generate(http, **body)["meta_info"]["cached_tokens"] > 0
    assert http.post("/flush_cache").status_code == 200
    assert native_generate(http, **body)["meta_info"]["cached_tokens"] == 0


def test_client_leaving_a_whole_request_aborts_it(http: httpx.Client):
    body = {"text": "Once upon a time", "sampling_params": {"max_new_tokens": 1000, "ignore_eos": True}}
    with pytest.raises(httpx.ReadTimeout):
        http.post("/generate", json=body, timeout=1.0)
    deadline = time.monotonic() + 5
    while http.get("/get_server_info").json()["running_requests"]:
        assert time.monotonic() < deadline, "the request kept running after its client left"
        time.sleep(0.05)


# ---- errors ---------------------------------------------------------------------------------------


def test_bad_json_is_a_400(http: httpx.Client):
    message = assert_openai_error(http.post("/v1/completions", content=b"{not json"), 400)
    assert "JSON" in message
    assert http.post("/v1/chat/completions", content=b"[]").json()["error"]["type"] == "invalid_request_error"


def test_api_key_is_required(server_url: str):
    assert_openai_error(httpx.get(f"{server_url}/v1/models"), 401)
    assert_openai_error(httpx.get(f"{server_url}/v1/models", headers={"Authorization": "Bearer wrong"}), 401)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server_url}/v1", api_key="wrong").models.list()


def test_unknown_route_and_wrong_method(http: httpx.Client):
    assert_openai_error(http.get("/v1/nothing-here"), 404)
    assert_openai_error(http.get("/v1/completions"), 405)


@pytest.mark.parametrize(
    ("field", "request_body"),
    [
        ("max_tokens", {"max_tokens": -1}),
        ("temperature", {"temperature": -1}),
    ],
)
def test_invalid_values_are_400_with_a_message(client: openai.OpenAI, model: str, field: str, request_body: dict):
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(**{"model": model, "prompt": PROMPT, **request_body})
    assert field in error.value.body["message"]


def test_an_unknown_model_is_a_404_and_default_names_the_served_one(client: openai.OpenAI, model: str):
    with pytest.raises(openai.NotFoundError) as error:
        client.completions.create(model="no-such-model", prompt=PROMPT, max_tokens=1)
    assert repr(model) in error.value.body["message"] and "'default'" in error.value.body["message"]
    assert client.completions.create(model="default", prompt=PROMPT, max_tokens=1).model == model


def test_server_still_answers_after_errors(client: openai.OpenAI, model: str):
    assert client.completions.create(model=model, prompt="Hi", max_tokens=1).choices[0].finish_reason in ("length", "stop")


# ---- tokens, aborts, probes, the API description ---------------------------------------------------


def test_health_generate_runs_the_model(http: httpx.Client):
    assert http.get("/health_generate").status_code == 200


def test_tokenize_and_detokenize_round_trip(http: httpx.Client):
    tokenized = http.post("/tokenize", json={"prompt": PROMPT}).json()
    assert tokenized["count"] == len(tokenized["tokens"]) == prompt_token_count(http, PROMPT)
    assert tokenized["max_model_len"] == http.get("/get_server_info").json()["context_length"]
    assert http.post("/detokenize", json={"tokens": tokenized["tokens"]}).json() == {"text": PROMPT}
    batch = http.post("/tokenize", json={"text": [PROMPT, "Hello"]}).json()
    assert batch["tokens"][0] == tokenized["tokens"] and batch["count"] == [len(ids) for ids in batch["tokens"]]
    assert http.post("/detokenize", json={"tokens": batch["tokens"]}).json() == {"text": [PROMPT, "Hello"]}


@pytest.mark.parametrize("tokens", [[], [-1], [10**9], ["a"], None])
def test_detokenize_rejects_what_is_not_token_ids(http: httpx.Client, tokens):
    assert "tokens" in assert_openai_error(http.post("/detokenize", json={"tokens": tokens}), 400)


def test_abort_request_ends_the_stream_with_abort(http: httpx.Client):
    rid = f"abort-me-{uuid.uuid4().hex}"
    with contextlib.ExitStack() as streams:
        lines = started_stream(streams, http, "/generate", {**LONG_STREAM, "rid": rid})
        assert http.post("/abort_request", json={"rid": rid}).status_code == 200
        *_, last, done = sse_lines_payloads(list(lines))
    assert done == "[DONE]" and last["meta_info"]["finish_reason"]["type"] == "abort"
    assert_openai_error(http.post("/abort_request", json={}), 400)


def test_openapi_describes_every_route(http: httpx.Client):
    document = http.get("/openapi.json").json()
    assert document["openapi"].startswith("3.")
    app = build_app(None)  # only its routes are read; the engine is never touched
    served = {(route.path, method.lower()) for route in app.routes for method in route.methods - {"HEAD"}}
    described = {(path, method) for path, operations in document["paths"].items() for method in operations}
    assert described == served
    operations = [operation for operations in document["paths"].values() for operation in operations.values()]
    assert all(operation["summary"] and "200" in operation["responses"] for operation in operations)
    assert document["paths"]["/v1/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]["required"] == ["prompt"]


# ---- /metrics ---------------------------------------------------------------------------------------


def read_metrics(http: httpx.Client) -> dict[str, float]:
    response = http.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return metric_values(response.text)


def test_metrics_count_requests_tokens_and_latencies(http: httpx.Client):
    before = read_metrics(http)
    whole = native_generate(http, text=PROMPT, sampling_params={"temperature": 0, "max_new_tokens": 3})
    streamed = {"text": PROMPT, "stream": True, "sampling_params": {"temperature": 0, "max_new_tokens": 4}}
    with http.stream("POST", "/generate", json=streamed) as response:
        *chunks, _ = sse_payloads(response)
    after = read_metrics(http)

    def grew(name: str) -> float:
        return after[name] - before[name]

    assert grew('rsgl:requests_total{status="finished"}') == 2
    assert grew("rsgl:generation_tokens_total") == 3 + 4
    assert grew("rsgl:prompt_tokens_total") == 2 * whole["meta_info"]["prompt_tokens"]
    assert grew("rsgl:time_to_first_token_seconds_count") == 1  # only a stream shows when its first token came
    assert grew("rsgl:inter_token_latency_seconds_count") == len(chunks) - 1
    assert grew("rsgl:e2e_request_latency_seconds_count") == 2
    assert after["rsgl:num_running_reqs"] == after["rsgl:kv_pages_used"] == after["rsgl:kv_usage"] == 0
    assert after["rsgl:kv_pages_total"] > 0 and 0 <= after["rsgl:cache_hit_rate"] <= 1
    buckets = [value for name, value in after.items() if name.startswith("rsgl:e2e_request_latency_seconds_bucket")]
    assert buckets == sorted(buckets) and buckets[-1] == after["rsgl:e2e_request_latency_seconds_count"]


@pytest.fixture(scope="module")
def busy_server(tmp_path_factory: pytest.TempPathFactory):
    """A client of a server running 2 requests at a time, so that more wait in its queue."""
    with running_server(tmp_path_factory.mktemp("busy-server"), "--max-running-requests", "2") as (url, _):
        with httpx.Client(base_url=url, headers=AUTH, timeout=120) as http:
            yield http


LATENCIES = ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds")


def test_latency_histograms_count_each_request_under_rsgl_sglang_and_vllm_names(busy_server: httpx.Client):
    before = read_metrics(busy_server)
    body = {"text": PROMPT, "stream": True, "sampling_params": {"temperature": 0, "max_new_tokens": 5, "ignore_eos": True}}
    requests = 6

    def stream(_: int) -> int:
        with busy_server.stream("POST", "/generate", json=body) as response:
            assert response.status_code == 200
            *chunks, done = sse_payloads(response)
        assert done == "[DONE]" and chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
        return len(chunks)

    with concurrent.futures.ThreadPoolExecutor(requests) as pool:
        chunks = sum(pool.map(stream, range(requests)))
    after = read_metrics(busy_server)

    def grew(name: str) -> float:
        return after[name] - before.get(name, 0.0)

    names = {
        "ttft": ("rsgl:time_to_first_token_seconds", "sglang:time_to_first_token_seconds", "vllm:time_to_first_token_seconds"),
        "itl": ("rsgl:inter_token_latency_seconds", "sglang:inter_token_latency_seconds", "vllm:inter_token_latency_seconds"),
        "e2e": ("rsgl:e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds"),
        "queue": ("rsgl:queue_time_seconds", "sglang:queue_time_seconds", "vllm:request_queue_time_seconds"),
    }
    expected = {"ttft": requests, "itl": chunks - requests, "e2e": requests, "queue": requests}
    for measure, aliases in names.items():
        for name in aliases:
            assert grew(f"{name}_count") == expected[measure], name
            buckets = [value for key, value in after.items() if key.startswith(f"{name}_bucket")]
            assert buckets == sorted(buckets) and buckets[-1] == after[f"{name}_count"], name
        # One measurement per request, the same under every name.
        assert len({after[f"{name}_sum"] for name in aliases}) == 1, aliases
    # Two run at a time: the others waited in the engine's queue, and their TTFT includes it.
    assert grew("rsgl:queue_time_seconds_sum") > 0
    assert grew("rsgl:time_to_first_token_seconds_sum") > grew("rsgl:queue_time_seconds_sum")
    # SGLang's buckets under its names.
    assert 'sglang:time_to_first_token_seconds_bucket{le="400"}' in after
    assert 'sglang:inter_token_latency_seconds_bucket{le="0.002"}' in after
    retractions = {after[name] for name in ("rsgl:retracted_requests_total", "sglang:num_retracted_requests_total", "vllm:num_preemptions_total")}
    assert retractions == {busy_server.get("/get_server_info").json()["retracted_requests"]}
    assert after["vllm:num_requests_running"] == after["vllm:num_requests_waiting"] == 0


def test_prompt_longer_than_the_context_is_a_400_counted_as_an_error(http: httpx.Client):
    before = read_metrics(http)
    context_length = http.get("/get_server_info").json()["context_length"]
    response = http.post("/v1/completions", json={"prompt": [1] * (context_length + 1), "max_tokens": 1})
    assert "context length" in assert_openai_error(response, 400)
    assert read_metrics(http)['rsgl:requests_total{status="error"}'] == before['rsgl:requests_total{status="error"}'] + 1


# ---- admission control and shutdown ---------------------------------------------------------------


@pytest.fixture(scope="module")
def small_server(tmp_path_factory: pytest.TempPathFactory):
    """A client of a server admitting 2 generation requests at a time and bodies up to 4 KiB."""
    options = ("--max-queued-requests", "2", "--max-request-bytes", "4096")
    with running_server(tmp_path_factory.mktemp("small-server"), *options) as (url, _):
        with httpx.Client(base_url=url, headers=AUTH, timeout=60) as http:
            yield http


def test_requests_beyond_the_limit_get_a_503_with_retry_after(small_server: httpx.Client):
    request = {"prompt": PROMPT, "max_tokens": 1}
    with contextlib.ExitStack() as streams:
        _admitted = [started_stream(streams, small_server, "/generate", LONG_STREAM) for _ in range(2)]
        overloaded = small_server.post("/v1/completions", json=request)
        assert_openai_error(overloaded, 503)
        assert overloaded.json()["error"]["type"] == "server_overloaded" and overloaded.headers["retry-after"] == "1"
        assert small_server.get("/health").status_code == small_server.get("/metrics").status_code == 200  # probes are not queued
    # The streams' slots come back once the server sees their clients gone.
    deadline = time.monotonic() + 5
    while (status := small_server.post("/v1/completions", json=request).status_code) == 503 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert status == 200


def test_large_bodies_get_a_413(http: httpx.Client, small_server: httpx.Client):
    ten_megabytes = b'{"prompt": "' + b"a" * 10_000_000 + b'"}'
    assert "larger than" in assert_openai_error(http.post("/v1/completions", content=ten_megabytes), 413)
    chunked = iter([b'{"text": "', b"a" * 5000, b'"}'])  # no Content-Length: measured as it arrives
    assert_openai_error(small_server.post("/generate", content=chunked), 413)


def test_ctrl_c_stops_the_server_cleanly_with_the_shells_code(tmp_path):
    with running_server(tmp_path) as (url, process):
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 130
    log = (tmp_path / "server.log").read_text()
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log[-3000:]


def refuses_connections_soon(url: str, within_seconds: float) -> bool:
    deadline = time.monotonic() + within_seconds
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=5)
        except httpx.ConnectError:
            return True
        time.sleep(0.05)
    return False


def test_sigterm_finishes_short_streams_aborts_long_ones_and_exits_0(tmp_path):
    short_request = {"prompt": PROMPT, "max_tokens": 16, "temperature": 0, "ignore_eos": True, "stream": True}
    with running_server(tmp_path, "--graceful-shutdown-timeout", "3") as (url, process):
        with httpx.Client(base_url=url, headers=AUTH, timeout=60) as http, contextlib.ExitStack() as streams:
            short = started_stream(streams, http, "/v1/completions", short_request)
            long = started_stream(streams, http, "/generate", LONG_STREAM)
            process.send_signal(signal.SIGTERM)
            short_payloads = sse_lines_payloads(list(short))
            # uvicorn sees the signal at its next tick (0.1 s): a short stream may end before that.
            assert refuses_connections_soon(f"{url}/health", within_seconds=2)
            long_payloads = sse_lines_payloads(list(long))
        assert process.wait(timeout=30) == 0
    assert short_payloads[-1] == "[DONE]" and short_payloads[-2]["choices"][0]["finish_reason"] == "length"
    assert long_payloads[-1] == "[DONE]" and long_payloads[-2]["meta_info"]["finish_reason"]["type"] == "abort"
