"""`python -m rsgl.launch`: how workers are placed on cores and NUMA nodes, and the whole command
(two workers behind `smg`) serving the default model on loopback, then stopped by SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from rsgl.launch import Placement, parse_cpu_list, place_workers
from server_helpers import free_port

TWO_NODES = {0: set(range(0, 4)), 1: set(range(4, 8))}


def test_workers_get_whole_nodes_first_then_even_shares():
    assert parse_cpu_list("0-2,5,7-8\n") == {0, 1, 2, 5, 7, 8}
    assert place_workers(2, set(range(8)), TWO_NODES) == [Placement((0, 1, 2, 3), 0), Placement((4, 5, 6, 7), 1)]
    assert place_workers(4, set(range(8)), TWO_NODES) == [Placement(cpus, node) for cpus, node in (((0, 1), 0), ((2, 3), 0), ((4, 5), 1), ((6, 7), 1))]
    assert place_workers(3, set(range(8)), TWO_NODES)[2] == Placement((4, 5, 6, 7), 1), "the node with fewer workers gives them more cores"
    assert place_workers(2, {0, 1}, {0: {0, 1}}) == [Placement((0,), None), Placement((1,), None)], "one node: no NUMA binding"
    assert place_workers(1, {2, 3, 5}, TWO_NODES) == [Placement((2, 3), 0)], "only the CPUs the process may use"
    with pytest.raises(SystemExit, match="need at least 3 CPUs"):
        place_workers(3, {0, 1}, {0: {0, 1}})


def test_two_workers_behind_the_router_serve_as_one_endpoint_and_stop_on_sigterm(tmp_path: Path):
    port, base, metrics = free_port(), free_port(), free_port()
    command = [sys.executable, "-m", "rsgl.launch", "--dp", "2", "--port", str(port), "--worker-base-port", str(base), "--max-total-tokens", "4096"]
    command += ["--router-metrics-port", str(metrics)]
    log = tmp_path / "launch.log"
    with open(log, "wb") as out:
        launcher = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    url, workers = f"http://127.0.0.1:{port}", [f"http://127.0.0.1:{base + i}" for i in range(2)]
    try:
        deadline = time.monotonic() + 180
        while "serving on" not in log.read_text():
            assert launcher.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        [model] = [m["id"] for m in httpx.get(f"{url}/v1/models", timeout=30).json()["data"]]
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
        answer = client.completions.create(model=model, prompt="The capital of France is", max_tokens=4, temperature=0)
        assert answer.choices[0].text
        # "default" reaches a worker through the router, as it does on one server.
        chat = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0)
        assert chat.choices[0].message.content
        assert httpx.get(f"http://127.0.0.1:{metrics}/metrics", timeout=30).status_code == 200, "the router's metrics on the launcher's host and port"
        assert [httpx.get(f"{w}/get_server_info", timeout=30).json()["threads"] for w in workers] == [1, 1], "a core each"
    finally:
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=60) == 0, log.read_text()[-3000:]
    for target in [url, *workers]:
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{target}/health", timeout=2)
