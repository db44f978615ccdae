"""Soak and load: rounds of 1,000 concurrent streaming clients, a third of which leave at random
points, mixed with non-streamed, constrained, n > 1 and abandoned requests, each round followed by a
drain. Every client that stayed gets a complete, well-formed answer; the server's /metrics count
each request it received once, with no error, and those whose client stayed as finished; the
engine ends idle with every KV page back; the server's thread count and resident memory return to their level after a warm-up
round; /health answers throughout. Three rounds in a row on one server, so what leaks adds up."""

from __future__ import annotations

import asyncio
import random
import resource
import time
from dataclasses import dataclass, field

import httpx
import orjson
import pytest
from server_helpers import AUTH, SETTLE_SECONDS, drained, metric_values, process_usage, running_server

STREAMS = 1000
LEAVING_SHARE = 3  # one streaming client in LEAVING_SHARE leaves early
WHOLE = 100  # non-streamed completions
CONSTRAINED = 60  # streamed and not, JSON schema and regex
SAMPLED = 40  # n = 3
ABANDONED = 60  # non-streamed requests whose client gives up before the answer
MAX_TOKENS = 8
ROUND_TIMEOUT_SECONDS = 300
HEALTH_PERIOD_SECONDS = 0.1
# The server's resident memory and thread count after a round, against their level after a
# warm-up round of the same size (which sets the heap's high-water mark: a smaller warm-up leaves
# ~40 MB of allocator growth that is no leak and does not recur in later rounds).
TOLERANCE = 0.05
SERVER_OPTIONS = ("--max-total-tokens", "4096", "--kv-cache-dtype", "bfloat16", "--random-seed", "7")
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}
REQUEST_STATUSES = ("finished", "aborted", "error")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    # Each client holds a socket: a thousand of them pass the usual soft limit of 1024 files.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        with running_server(tmp_path_factory.mktemp("load-server"), *SERVER_OPTIONS) as (url, process):
            yield url, process.pid
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@dataclass
class Round:
    """What one round's clients saw."""

    complete: list = field(default_factory=list)  # (kind, payload) of clients that stayed
    left_streams: int = 0  # streaming clients that left mid-stream
    left_after_the_end: int = 0  # of those, the ones that had already read their request's last token
    abandoned: int = 0  # non-streamed clients that gave up before the answer
    health_seconds: list = field(default_factory=list)


def sse_payloads(lines: list[str]) -> list:
    return [line[6:] if line == "data: [DONE]" else orjson.loads(line[6:]) for line in lines if line]


def has_finish_reason(payload) -> bool:
    return payload != "[DONE]" and any(choice["finish_reason"] for choice in payload["choices"])


async def stream_completion(http: httpx.AsyncClient, result: Round, index: int, leave_after: int | None, extra: dict) -> None:
    body = {"prompt": f"Request {index}: the number {index} is", "max_tokens": MAX_TOKENS, "stream": True, **extra}
    body["stream_options"] = {"include_usage": True}
    lines = []
    async with http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            lines.append(line)
            if leave_after is not None and len(lines) > leave_after:
                result.left_streams += 1
                result.left_after_the_end += any(has_finish_reason(payload) for payload in sse_payloads(lines))
                return  # closing the response drops the connection mid-stream
    result.complete.append(("stream", sse_payloads(lines)))


async def whole_completion(http: httpx.AsyncClient, result: Round, index: int, extra: dict) -> None:
    body = {"prompt": f"Question {index}: say a number.", "max_tokens": MAX_TOKENS, **extra}
    response = await http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    result.complete.append(("whole", response.json()))


async def abandoned_completion(http: httpx.AsyncClient, result: Round, index: int, rng: random.Random) -> None:
    body = {"prompt": f"A long story {index}:", "max_tokens": 200, "ignore_eos": True}
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(http.post("/v1/completions", json=body), rng.uniform(0.05, 1.0))
    result.abandoned += 1


async def probe_health(url: str, result: Round, stop: asyncio.Event) -> None:
    # A connection per probe, apart from the load's pool: reusing an idle pooled connection can
    # race the server closing it (uvicorn's keep-alive timeout, 5 s, equals httpx's pool expiry),
    # which a client sees as "Server disconnected" without the server having stalled.
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=ROUND_TIMEOUT_SECONDS, limits=limits) as http:
        while not stop.is_set():
            started = time.perf_counter()
            assert (await http.get("/health")).status_code == 200
            result.health_seconds.append(time.perf_counter() - started)
            await asyncio.sleep(HEALTH_PERIOD_SECONDS)


def client_mix(http: httpx.AsyncClient, result: Round, rng: random.Random) -> list:
    """Every kind of client of a round, in a random order."""
    regex = {"regex": "(yes|no), [0-9]{1,3}"}
    json_schema = {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}}}
    clients = []
    for i in range(STREAMS):
        leave_after = rng.randrange(1, MAX_TOKENS + 2) if i % LEAVING_SHARE == 0 else None
        clients.append(stream_completion(http, result, i, leave_after, {"temperature": rng.choice((0, 1.0))}))
    clients += [whole_completion(http, result, i, {"temperature": 1.0}) for i in range(WHOLE)]
    for i in range(CONSTRAINED):
        constraint = regex if i % 2 else {"temperature": 1.0, **json_schema}
        if i % 3:
            clients.append(whole_completion(http, result, i, {**constraint, "max_tokens": 24}))
        else:
            clients.append(stream_completion(http, result, i, None, {**constraint, "max_tokens": 24}))
    clients += [whole_completion(http, result, i, {"n": 3, "temperature": 1.0}) for i in range(SAMPLED)]
    clients += [abandoned_completion(http, result, i, rng) for i in range(ABANDONED)]
    rng.shuffle(clients)
    return clients


async def run_round(url: str, seed: int) -> Round:
    result, rng, stop = Round(), random.Random(seed), asyncio.Event()
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)  # the default caps at 100
    async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=ROUND_TIMEOUT_SECONDS, limits=limits) as http:
        health = asyncio.create_task(probe_health(url, result, stop))
        try:
            await asyncio.wait_for(asyncio.gather(*client_mix(http, result, rng)), ROUND_TIMEOUT_SECONDS)
        finally:
            stop.set()
            await health
    return result


def assert_well_formed(kind: str, payload) -> None:
    if kind == "whole":
        choices = payload["choices"]
        assert choices and all(c["finish_reason"] in ("stop", "length") for c in choices)
        assert payload["usage"]["completion_tokens"] > 0
        return
    *text_chunks, usage_chunk, done = payload
    assert done == "[DONE]" and usage_chunk["choices"] == [], payload[-3:]
    assert usage_chunk["usage"]["completion_tokens"] > 0
    assert text_chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert all(chunk["choices"][0]["finish_reason"] is None for chunk in text_chunks[:-1])


def request_counts(url: str) -> dict[str, int]:
    """The server's count of generation requests by how they ended, from /metrics."""
    values = metric_values(httpx.get(f"{url}/metrics", headers=AUTH, timeout=30).text)
    return {status: int(values[f'rsgl:requests_total{{status="{status}"}}']) for status in REQUEST_STATUSES}


def counted_since(url: str, before: dict[str, int], at_least: int) -> dict[str, int]:
    """The requests counted since `before`, once there are `at_least` (or after SETTLE_SECONDS): a
    request is counted when its handler ends, which can trail the engine's finishing it."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        grown = {status: count - before[status] for status, count in request_counts(url).items()}
        if sum(grown.values()) >= at_least or time.monotonic() > deadline:
            return grown
        time.sleep(0.2)


@pytest.fixture(scope="module")
def baseline(server) -> tuple[int, int]:
    """The server's resident memory and threads after a full warm-up round."""
    url, pid = server
    asyncio.run(run_round(url, seed=0))
    drained(url)
    return process_usage(pid)


@pytest.mark.parametrize("round_index", range(3))
def test_a_thousand_streams_and_everything_else_then_a_drain(server, baseline, round_index: int):
    url, pid = server
    before = request_counts(url)
    result = asyncio.run(run_round(url, seed=round_index + 1))
    assert result.left_streams >= STREAMS // LEAVING_SHARE // 2
    for kind, payload in result.complete:
        assert_well_formed(kind, payload)

    info = drained(url)
    # The server counts each request it received once, by how it ended: every request answered with
    # a status, and an abandoned one only if a handler read it before its client gave up.
    answered = len(result.complete) + result.left_streams
    grown = counted_since(url, before, answered)
    assert grown["error"] == 0, grown
    assert answered <= grown["finished"] + grown["aborted"] <= answered + result.abandoned, (grown, answered)
    # A client that stayed, or read its last token before leaving, saw its request finish.
    assert grown["finished"] >= len(result.complete) + result.left_after_the_end, (grown, len(result.complete), result.left_after_the_end)
    assert info["running_requests"] == info["waiting_requests"] == info["grammar_waiting_requests"] == 0
    assert info["kv_pages_free"] + info["cached_pages"] == info["kv_pages_total"]  # no request holds KV
    assert info["kv_pages_used"] == 0
    rss, threads = process_usage(pid)
    base_rss, base_threads = baseline
    assert threads <= base_threads * (1 + TOLERANCE), (threads, base_threads)
    assert rss <= base_rss * (1 + TOLERANCE), (rss / 1e6, base_rss / 1e6)
    worst = max(result.health_seconds)
    print(
        f"round {round_index}: {len(result.complete)} complete, {result.left_streams} left mid-stream ({result.left_after_the_end} after the end), "
        f"{result.abandoned} abandoned; server counted {grown}; /health worst {worst * 1e3:.0f} ms "
        f"over {len(result.health_seconds)} probes; RSS {rss / 1e6:.0f} MB (baseline {base_rss / 1e6:.0f}), threads {threads} ({base_threads})"
    )
