"""Property-based fuzzing of the server from its own /openapi.json with schemathesis: generated
requests, valid and invalid, against every documented operation. No answer may be a 5xx, an
undocumented status, or a body or content type the document does not describe; the server must
stay up, and its resident memory must come back to within 10% of its level after a warm-up run.

The server runs with a short context (every generation ends within a few hundred tokens) and a
small `--max-n`, so the fuzzer's largest valid requests stay quick; a request over those limits is
one of the cases it must see refused with a 400."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
from server_helpers import API_KEY, AUTH, drained, process_usage, running_server

SERVER_OPTIONS = ("--context-length", "256", "--max-n", "4", "--max-total-tokens", "2048", "--random-seed", "3")
WARM_UP_EXAMPLES = 5
FUZZ_EXAMPLES = 30  # per operation
TOLERANCE = 0.10
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"
FUZZ_TIMEOUT_SECONDS = 900


def fuzz(url: str, examples: int, seed: int, workdir: Path) -> subprocess.CompletedProcess:
    command = [
        sys.executable, "-m", "schemathesis.cli", "run", f"{url}/openapi.json",
        "--checks", CHECKS,
        "--max-examples", str(examples),
        "--seed", str(seed),
        "--header", f"Authorization: Bearer {API_KEY}",
        "--request-timeout", "60",
        "--continue-on-failure",
        "--generation-database", ":memory:",
        "--no-color",
    ]  # fmt: skip
    # In a directory of its own: schemathesis keeps a cache of what it found in the working directory.
    return subprocess.run(command, capture_output=True, text=True, timeout=FUZZ_TIMEOUT_SECONDS, cwd=workdir)


def test_fuzzed_requests_get_documented_answers_and_leave_memory_as_it_was(tmp_path):
    with running_server(tmp_path, *SERVER_OPTIONS) as (url, process):
        warm_up = fuzz(url, WARM_UP_EXAMPLES, seed=1, workdir=tmp_path)
        assert warm_up.returncode == 0, warm_up.stdout[-6000:] + warm_up.stderr[-2000:]
        drained(url)
        base_rss, base_threads = process_usage(process.pid)

        run = fuzz(url, FUZZ_EXAMPLES, seed=2, workdir=tmp_path)
        print(run.stdout[-3000:])
        assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
        assert httpx.get(f"{url}/health", headers=AUTH, timeout=10).status_code == 200
        info = drained(url)
        assert info["running_requests"] == info["waiting_requests"] == info["grammar_waiting_requests"] == 0
        assert info["kv_pages_used"] == 0
        rss, threads = process_usage(process.pid)
        assert threads <= base_threads * (1 + TOLERANCE), (threads, base_threads)
        assert rss <= base_rss * (1 + TOLERANCE), (rss / 1e6, base_rss / 1e6)
