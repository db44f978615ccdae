"""Helpers shared by the server tests: `python -m rsgl.server` in a subprocess on a free loopback port."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import orjson
import pytest

API_KEY = "test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
STARTUP_TIMEOUT_SECONDS = 120
# SIGTERM to exit: the graceful timeout (5 s), the server's own forced exit 5 s later, and a margin.
STOP_TIMEOUT_SECONDS = 15
SETTLE_SECONDS = 20  # for a server to notice departed clients and release their requests


def openai_client(url: str) -> openai.OpenAI:
    """The `openai` package's client for the server at `url`."""
    return openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(log_dir: Path, *options: str, api_key: str | None = API_KEY) -> Iterator[tuple[str, subprocess.Popen]]:
    """(url, process) of a server started with --api-key `api_key` (none: no key) and `options`; stopped on exit."""
    log_path = log_dir / "server.log"
    port = free_port()
    with open(log_path, "wb") as log:  # a file, not a pipe: nobody reads the output while tests run
        key = ["--api-key", api_key] if api_key else []
        command = [sys.executable, "-m", "rsgl.server", "--port", str(port), *key, *options]
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process, log_path)
        yield url, process
    finally:
        stop(process)


def wait_until_healthy(url: str, process: subprocess.Popen, log_path: Path) -> None:
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
    """SIGTERM, which must end the server within its graceful timeout (5 s) and a few seconds."""
    process.terminate()
    try:
        process.wait(timeout=STOP_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        pytest.fail(f"the server ignored SIGTERM for {STOP_TIMEOUT_SECONDS} s and was killed")


def sse_lines_payloads(lines: list[str]) -> list:
    """The `data:` payloads of server-sent event lines, the final "[DONE]" kept as is."""
    lines = [line for line in lines if line]
    assert all(line.startswith("data: ") for line in lines), lines
    return [line[6:] if line == "data: [DONE]" else orjson.loads(line[6:]) for line in lines]


def metric_values(metrics_text: str) -> dict[str, float]:
    """{'name{labels}': value} for every sample of a Prometheus text exposition."""
    samples = (line.rsplit(" ", 1) for line in metrics_text.splitlines() if line and not line.startswith("#"))
    return {name: float(value) for name, value in samples}


def assert_openai_error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error["message"]


def drained(url: str) -> dict:
    """The engine's counters once it is idle (or the last seen after SETTLE_SECONDS)."""
    deadline = time.monotonic() + SETTLE_SECONDS
    with httpx.Client(base_url=url, headers=AUTH, timeout=30) as http:
        while True:
            info = http.get("/get_server_info").json()
            idle = info["running_requests"] == info["waiting_requests"] == info["grammar_waiting_requests"] == 0
            if idle or time.monotonic() > deadline:
                info["kv_pages_used"] = metric_values(http.get("/metrics").text)["rsgl:kv_pages_used"]
                return info
            time.sleep(0.2)


def process_usage(pid: int) -> tuple[int, int]:
    """(resident bytes, threads) of a process."""
    status = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status").read().splitlines() if ":" in line)
    return int(status["VmRSS"].split()[0]) * 1024, int(status["Threads"])
