"""The disk tier behind a real server (`--hicache-dir`): SIGKILLed at random points while requests
run and pages are written, 20 times, it always restarts, keeps every page it reported written,
and answers exactly as a server without the tier does. Each round asks new questions about the
same documents: the documents' pages come back from disk, the questions' pages are new writes."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from pydoc_data.topics import topics

import httpx
import pytest
from server_helpers import AUTH, metric_values, running_server

KILLS = 20
# Small enough that the prompts' pages (about 2,400 tokens) do not all fit in memory.
OPTIONS = ("--max-total-tokens", "1024")
DOCUMENTS = [text[:1200] for text in list(topics.values())[:8]]
GREEDY = {"temperature": 0, "max_new_tokens": 8}


def prompt(document: int, round_index: int) -> str:
    return f"{DOCUMENTS[document]}\nQuestion {round_index}: what is this about?\nAnswer:"


def generate(http: httpx.Client, text: str) -> str:
    response = http.post("/generate", json={"text": text, "sampling_params": GREEDY})
    response.raise_for_status()
    return response.json()["text"]


def hicache(http: httpx.Client) -> dict:
    return http.get("/get_server_info").json()["hicache"]


def client(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers=AUTH, timeout=120)


class ColdAnswers:
    """Answers of a server without the tier, asked once per prompt."""

    def __init__(self, http: httpx.Client) -> None:
        self.http, self.answers = http, {}

    def __getitem__(self, text: str) -> str:
        if text not in self.answers:
            self.answers[text] = generate(self.http, text)
        return self.answers[text]


@pytest.fixture(scope="module")
def cold(tmp_path_factory: pytest.TempPathFactory):
    with running_server(tmp_path_factory.mktemp("cold"), *OPTIONS) as (url, _), client(url) as http:
        yield ColdAnswers(http)


def send_until_killed(url: str, prompts: list[str], answers: list[tuple[str, str]]) -> None:
    with client(url) as http:
        for text in prompts:
            try:
                answers.append((text, generate(http, text)))
            except httpx.TransportError:
                return  # the server was killed


def wait_for_first_write(http: httpx.Client, timeout_seconds: float = 120) -> None:
    deadline = time.monotonic() + timeout_seconds
    while hicache(http)["written_pages"] == 0:
        assert time.monotonic() < deadline, "the server wrote no page to the disk tier"
        time.sleep(0.05)


def test_sigkill_while_writing_never_serves_a_wrong_page(tmp_path: Path, cold: ColdAnswers):
    rng = random.Random(20261127)
    cache_dir = tmp_path / "hicache"
    kept_at_least = 0
    for kill in range(KILLS):
        with running_server(tmp_path, *OPTIONS, "--hicache-dir", str(cache_dir)) as (url, process), client(url) as http:
            stats = hicache(http)
            assert stats["recovered_pages"] >= kept_at_least, f"kill {kill}: pages reported written were lost ({stats['startup']})"
            answers: list[tuple[str, str]] = []
            orders = [rng.sample(range(len(DOCUMENTS)), len(DOCUMENTS)) for _ in range(2)]
            senders = [threading.Thread(target=send_until_killed, args=(url, [prompt(d, kill) for d in order], answers)) for order in orders]
            for sender in senders:
                sender.start()
            if kill == 0:
                # However slow the machine, the first round writes pages, so the last server has some to find.
                wait_for_first_write(http)
            time.sleep(rng.uniform(0.2, 3.0))
            written = hicache(http)["written_pages"]  # on disk (in the page cache) before the kill
            process.kill()
            process.wait()
            for sender in senders:
                sender.join()
            for text, answer in answers:
                assert answer == cold[text], f"kill {kill}: {text[-40:]!r} answered differently"
            kept_at_least = stats["recovered_pages"] + written
    with running_server(tmp_path, *OPTIONS, "--hicache-dir", str(cache_dir)) as (url, _), client(url) as http:
        prompts = [prompt(d, KILLS - 1) for d in range(len(DOCUMENTS))]
        assert [generate(http, text) for text in prompts] == [cold[text] for text in prompts]
        stats = hicache(http)
        assert stats["hit_tokens"] > 0 and stats["used_pages"] >= kept_at_least
        metrics = metric_values(http.get("/metrics").text)
        assert metrics["rsgl:cache_hit_tokens_disk_total"] == stats["hit_tokens"]
        assert metrics["rsgl:hicache_pages_used"] == stats["used_pages"]
        assert metrics["rsgl:cache_hit_tokens_memory_total"] + stats["hit_tokens"] == http.get("/get_server_info").json()["cache_hit_tokens"]
