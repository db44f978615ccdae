"""The server's log: the start-up summary, the periodic prefill / decode lines, and with
--log-requests a line per finished request."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
from server_helpers import AUTH, running_server

LOG_WAIT_SECONDS = 10


def wait_for_line(log_path: Path, pattern: str) -> str:
    """The first line of the server's log matching `pattern`, waiting for it to be written."""
    deadline = time.monotonic() + LOG_WAIT_SECONDS
    while True:
        text = log_path.read_text(errors="replace")
        match = re.search(pattern, text, re.MULTILINE)
        if match:
            return match.group(0)
        assert time.monotonic() < deadline, f"no line matching {pattern!r} in the server log:\n{text[-4000:]}"
        time.sleep(0.1)


def settled_count(log_path: Path, needle: str) -> int:
    """How many lines of the log hold `needle` once a second goes by without a new one."""
    deadline = time.monotonic() + LOG_WAIT_SECONDS
    count = -1
    while (new := log_path.read_text(errors="replace").count(needle)) != count:
        assert time.monotonic() < deadline, f"{needle!r} lines keep coming while the engine is idle"
        count = new
        time.sleep(1)
    return count


def test_startup_summary_step_lines_and_request_log(tmp_path: Path):
    with running_server(tmp_path, "--threads", "1", "--log-requests", "--log-interval", "0.2") as (url, _):
        log_path = tmp_path / "server.log"
        info = httpx.get(f"{url}/get_server_info", headers=AUTH).json()
        assert f"Model: {info['model_path']} (served as {info['served_model_name']}); weights: {info['dtype']}" in log_path.read_text()
        wait_for_line(
            log_path, rf"KV cache: {info['kv_cache_dtype']}, {info['kv_pages_total']} pages of {info['page_size']} tokens \({info['max_total_tokens']} tokens\)"
        )
        wait_for_line(log_path, rf"Kernels: {info['kernels']} \(int8: {info['int8_kernels']}\); threads: 1; context length: {info['context_length']}$")

        body = {"text": "Once upon a time", "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}, "rid": "log-test-1"}
        out = httpx.post(f"{url}/generate", json=body, headers=AUTH, timeout=60).json()
        prompt_tokens = out["meta_info"]["prompt_tokens"]
        line = wait_for_line(log_path, r"Finish request\. rid: log-test-1, .*$")
        assert re.search(rf"prompt tokens: {prompt_tokens}, output tokens: 8, finish reason: length, latency: \d+\.\d{{3}} s$", line), line
        wait_for_line(log_path, r"Prefill batch\. #new-token: \d+, #cached-token: \d+, token usage: \d\.\d\d, .*input throughput \(token/s\): [\d.]+$")
        wait_for_line(log_path, r"Decode batch\. #running-req: \d+, #token: \d+, token usage: \d\.\d\d, gen throughput \(token/s\): [\d.]+, #queue-req: \d+$")

        # Streamed requests are logged too; an idle engine adds no step lines (the count settles).
        with httpx.stream("POST", f"{url}/generate", json={**body, "rid": "log-test-2", "stream": True}, headers=AUTH, timeout=60) as response:
            assert response.status_code == 200
            response.read()
        wait_for_line(log_path, r"Finish request\. rid: log-test-2, .*finish reason: length, .*$")
        assert settled_count(log_path, " batch. #") >= 2
