"""Under load: 200 concurrent streaming clients, 50 of which leave after their first chunk. The
server keeps serving the others, frees every request's KV, and its /metrics agree with what happened."""

from __future__ import annotations

import asyncio
import time

import httpx
import orjson
import pytest
from server_helpers import AUTH, metric_values, running_server

CLIENTS = 200
LEAVING_CLIENTS = 50
MAX_TOKENS = 8
TEST_TIMEOUT_SECONDS = 120
SETTLE_SECONDS = 10  # for the server to notice the departed clients and release their requests
REQUEST_COUNTS = ("finished", "aborted", "error")


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory):
    with running_server(tmp_path_factory.mktemp("load-server")) as (url, _):
        yield url


async def stream_completion(http: httpx.AsyncClient, index: int, leave_early: bool) -> list | None:
    """The payloads of one streamed completion, or None for a client that leaves after its first chunk."""
    body = {"prompt": f"Request {index}: the number {index} is", "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True}
    body["stream_options"] = {"include_usage": True}
    payloads = []
    async with http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line:
                continue
            payload = line.removeprefix("data: ")
            payloads.append(payload if payload == "[DONE]" else orjson.loads(payload))
            if leave_early:
                return None  # closing the response drops the connection mid-stream
    return payloads


async def run_clients(url: str) -> list[list | None]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)  # the default caps at 100
    async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=TEST_TIMEOUT_SECONDS, limits=limits) as http:
        streams = (stream_completion(http, i, leave_early=i % (CLIENTS // LEAVING_CLIENTS) == 0) for i in range(CLIENTS))
        return await asyncio.wait_for(asyncio.gather(*streams), TEST_TIMEOUT_SECONDS)


def request_counts(http: httpx.Client) -> dict[str, float]:
    values = metric_values(http.get("/metrics").text)
    return {status: values[f'rsgl:requests_total{{status="{status}"}}'] for status in REQUEST_COUNTS}


def assert_complete(payloads: list) -> None:
    *text_chunks, usage_chunk, done = payloads
    assert done == "[DONE]" and usage_chunk["choices"] == []
    completion_tokens = usage_chunk["usage"]["completion_tokens"]
    finish_reason = text_chunks[-1]["choices"][0]["finish_reason"]
    assert 0 < completion_tokens <= MAX_TOKENS and finish_reason == ("length" if completion_tokens == MAX_TOKENS else "stop")
    assert all(chunk["choices"][0]["finish_reason"] is None for chunk in text_chunks[:-1])


def settled(http: httpx.Client, before: dict[str, float]) -> tuple[dict, dict[str, float]]:
    """The server's info and the growth of its request counts once every request has ended."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        info = http.get("/get_server_info").json()
        counts = request_counts(http)
        grown = {status: counts[status] - before[status] for status in REQUEST_COUNTS}
        idle = info["running_requests"] == info["waiting_requests"] == 0
        if (idle and sum(grown.values()) == CLIENTS) or time.monotonic() > deadline:
            return info, grown
        time.sleep(0.2)


def test_many_streams_some_leaving_early(server_url: str):
    with httpx.Client(base_url=server_url, headers=AUTH, timeout=30) as http:
        before = request_counts(http)
        results = asyncio.run(run_clients(server_url))
        completed = [payloads for payloads in results if payloads is not None]
        assert len(completed) == CLIENTS - LEAVING_CLIENTS
        for payloads in completed:
            assert_complete(payloads)

        info, grown = settled(http, before)
        assert info["running_requests"] == info["waiting_requests"] == 0
        assert info["kv_pages_free"] + info["cached_pages"] == info["kv_pages_total"]  # no request holds KV
        finished_anyway = grown["finished"] - len(completed)  # leavers whose last token came before they left
        assert 0 <= finished_anyway <= LEAVING_CLIENTS
        assert grown == {"finished": len(completed) + finished_anyway, "aborted": LEAVING_CLIENTS - finished_anyway, "error": 0}
        assert metric_values(http.get("/metrics").text)["rsgl:kv_pages_used"] == 0
