"""End to end: `python -m rsgl.server` in a subprocess, driven by real clients (openai, httpx)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time

import httpx
import openai
import orjson
import pytest

API_KEY = "test-key"
PROMPT = "The capital of France is"
STARTUP_TIMEOUT_SECONDS = 120


# ---- the server ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory):
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    port = free_port()
    with open(log_path, "wb") as log:  # a file, not a pipe: nobody reads the output while tests run
        process = subprocess.Popen(
            [sys.executable, "-m", "rsgl.server", "--port", str(port), "--api-key", API_KEY], stdout=log, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process, log_path)
        yield url
    finally:
        stop(process)


def wait_until_healthy(url: str, process: subprocess.Popen, log_path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the server exited with code {process.returncode}:\n{log_path.read_text()[-4000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass  # not listening yet
        time.sleep(0.25)
    pytest.fail(f"the server was not healthy after {STARTUP_TIMEOUT_SECONDS} s:\n{log_path.read_text()[-4000:]}")


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def http(server_url: str):
    with httpx.Client(base_url=server_url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def client(server_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server_url}/v1", api_key=API_KEY)


@pytest.fixture(scope="module")
def model(http: httpx.Client) -> str:
    return http.get("/v1/models").json()["data"][0]["id"]


def native_generate(http: httpx.Client, **body) -> dict | list:
    response = http.post("/generate", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def prompt_token_count(http: httpx.Client, text: str) -> int:
    """How many tokens the engine's tokenizer makes of `text`, as /generate reports it."""
    return native_generate(http, text=text, sampling_params={"max_new_tokens": 1})["meta_info"]["prompt_tokens"]


def sse_payloads(response: httpx.Response) -> list:
    """The `data:` payloads of a server-sent event stream, the final "[DONE]" kept as is."""
    lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines), lines
    return [line[6:] if line == "data: [DONE]" else orjson.loads(line[6:]) for line in lines]


def assert_openai_error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error["message"]


# ---- informational endpoints ---------------------------------------------------------------------


def test_health_needs_no_api_key(server_url: str):
    response = httpx.get(f"{server_url}/health")
    assert response.status_code == 200 and response.text == ""


def test_models_and_model_info(http: httpx.Client, model: str):
    models = http.get("/v1/models").json()
    assert models["object"] == "list"
    assert models["data"] == [{"id": model, "object": "model", "created": models["data"][0]["created"], "owned_by": "rsgl"}]
    info = http.get("/get_model_info").json()
    assert info["served_model_name"] == model and info["is_generation"] is True and info["model_path"]
    server_info = http.get("/get_server_info").json()
    assert server_info["served_model_name"] == model and "running_requests" in server_info


# ---- /v1/completions ---------------------------------------------------------------------------


def test_completion_greedy_says_paris_with_real_token_counts(client: openai.OpenAI, http: httpx.Client, model: str):
    completion = client.completions.create(model=model, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=2)
    assert completion.id.startswith("cmpl-") and completion.object == "text_completion" and completion.model == model
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
    chunks = list(client.completions.create(**request, stream=True, stream_options={"include_usage": True}))
    *text_chunks, usage_chunk = chunks
    assert all(chunk.id == chunks[0].id and chunk.object == "text_completion" for chunk in chunks)
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


def test_client_disconnect_aborts_the_stream(http: httpx.Client):
    # Long enough to run for many seconds unless the abort works; it should stop within a step or two.
    body = {"text": "Once upon a time", "sampling_params": {"max_new_tokens": 1000, "ignore_eos": True}, "stream": True}
    with http.stream("POST", "/generate", json=body) as response:
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
        ("model", {"model": "no-such-model"}),
    ],
)
def test_invalid_values_are_400_with_a_message(client: openai.OpenAI, model: str, field: str, request_body: dict):
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(**{"model": model, "prompt": PROMPT, **request_body})
    assert field in error.value.body["message"]


def test_server_still_answers_after_errors(client: openai.OpenAI, model: str):
    assert client.completions.create(model=model, prompt="Hi", max_tokens=1).choices[0].finish_reason in ("length", "stop")
