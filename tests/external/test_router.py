"""rsgl workers behind SGLang's own router (`smg`, the Shepherd Model Gateway, from PyPI), on
loopback: the router registers them as SGLang workers, its cache-aware policy keeps each shared
prefix on one worker (a higher cache hit rate than round-robin), a worker killed mid-load loses
no request, and `openai` clients see one endpoint."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from pydoc_data.topics import topics

import httpx
import openai
import pytest
from server_helpers import free_port, running_server

WORKER_OPTIONS = ("--threads", "1", "--max-total-tokens", "8192")
# Three few-shot groups (odd, so round-robin over two workers sends each group to both), each a
# shared document and four questions, asked round by round.
GROUPS = [text[:1500] for text in list(topics.values())[20:23]]
QUESTIONS = 4
READY_TIMEOUT_SECONDS = 60


def prompt(group: int, question: int) -> str:
    return f"{GROUPS[group]}\n\nQuestion {question}: what does this say?\nAnswer:"


@contextlib.contextmanager
def router(log_dir: Path, workers: list[str], policy: str) -> Iterator[str]:
    """The URL of `smg launch` routing to `workers` with `policy`, once it sees them all healthy."""
    port = free_port()
    command = [sys.executable, "-m", "smg", "launch", "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers]
    command += ["--policy", policy, "--log-level", "warn", "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
    command += ["--shutdown-grace-period-secs", "2"]
    with open(log_dir / f"router-{policy}.log", "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while not _ready(url, len(workers)):
            assert process.poll() is None, (log_dir / f"router-{policy}.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the router never saw every worker healthy"
            time.sleep(0.25)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def _ready(url: str, workers: int) -> bool:
    try:
        response = httpx.get(f"{url}/readiness", timeout=2)
    except httpx.TransportError:
        return False
    return response.status_code == 200 and response.json().get("healthy_workers") == workers


def cache_counts(workers: list[str]) -> tuple[int, int]:
    """(prompt tokens, of which cache hits) summed over the workers."""
    infos = [httpx.get(f"{url}/get_server_info", timeout=30).json() for url in workers]
    return sum(i["prompt_tokens"] for i in infos), sum(i["cache_hit_tokens"] for i in infos)


def complete(client: openai.OpenAI, model: str, text: str) -> str:
    return client.completions.create(model=model, prompt=text, max_tokens=4, temperature=0).choices[0].text


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[tuple[str, subprocess.Popen]]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(running_server(tmp_path_factory.mktemp(f"worker{i}"), *WORKER_OPTIONS, api_key=None)) for i in range(2)]


def test_workers_register_as_sglang_and_cache_aware_routing_keeps_prefixes_together(workers, tmp_path):
    urls = [url for url, _ in workers]
    hit_rates, answers = {}, {}
    for policy in ("round_robin", "cache_aware"):
        for url in urls:
            assert httpx.post(f"{url}/flush_cache", timeout=30).status_code == 200
        before = cache_counts(urls)
        with router(tmp_path, urls, policy) as url:
            [model] = [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]]
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
            answers[policy] = {(g, q): complete(client, model, prompt(g, q)) for q in range(QUESTIONS) for g in range(len(GROUPS))}
        after = cache_counts(urls)
        hit_rates[policy] = (after[1] - before[1]) / (after[0] - before[0])
    assert answers["cache_aware"] == answers["round_robin"], "workers answer alike whichever serves"
    # Each group's document is computed once with cache-aware routing, once per worker with round-robin.
    assert hit_rates["cache_aware"] > hit_rates["round_robin"] + 0.1, hit_rates


def test_a_worker_killed_mid_load_loses_no_request(workers, tmp_path):
    urls = [url for url, _ in workers]
    with router(tmp_path, urls, "cache_aware") as url:
        [model] = [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]]
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        expected = {(g, q): complete(client, model, prompt(g, q)) for q in range(2) for g in range(len(GROUPS))}
        got: dict[tuple[int, int], str] = {}
        failures: list[BaseException] = []

        def ask(key: tuple[int, int]) -> None:
            try:
                got[key] = complete(client, model, prompt(*key))
            except Exception as exc:
                failures.append(exc)

        keys = list(expected) * 2
        askers = [threading.Thread(target=ask, args=(key,)) for key in keys]
        for asker in askers:
            asker.start()
        while len(got) + len(failures) < len(keys) // 4:  # a quarter answered: the rest in flight or queued
            time.sleep(0.02)
        workers[1][1].kill()  # the fixture's stop() then finds it already gone
        for asker in askers:
            asker.join()
        assert not failures, failures
        assert got == expected
        assert {key: complete(client, model, prompt(*key)) for key in expected} == expected, "the router keeps serving"
