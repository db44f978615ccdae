"""One worker with every core against several workers with a share each behind SGLang's router
(`python -m rsgl.launch`), on a shared-prefix workload and a random one, with cache hit rates.

    python benches/bench_scale.py [--model PATH] [--dp 2] [--groups 6] [--per-group 8]
        [--document-chars 1500] [--answer-tokens 16] [--concurrency 8] [--json bench-results/scale.json]

Shared-prefix: --groups few-shot groups, each a document from Python's docs
(`pydoc_data.topics`) and --per-group questions, sent by --concurrency clients at once in an
order that interleaves the groups. Random: as many prompts of the same length, each its own
document, so nothing is shared. Each setup is started with `python -m rsgl.launch` and asked
through its one endpoint with the `openai` client (greedy, --answer-tokens each, ignore_eos):
1 worker with all cores (no router), then --dp workers with a share of the cores each behind
`smg` with the cache-aware policy and with round-robin. Throughput: prompt and answer tokens /
wall time. Hit rate: cache hits / prompt tokens summed over the workers. On a machine with few
cores this shows what the machinery costs, not how far it scales. This is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
from bench_report import machine_fields, write_json

READY_TIMEOUT_SECONDS = 600


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model path (default: the default model)")
    parser.add_argument("--dp", type=int, default=2)
    parser.add_argument("--groups", type=int, default=6)
    parser.add_argument("--per-group", type=int, default=8)
    parser.add_argument("--document-chars", type=int, default=1500)
    parser.add_argument("--answer-tokens", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--json", default="bench-results/scale.json")
    return parser.parse_args()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def workloads(args: argparse.Namespace) -> dict[str, list[str]]:
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[name] for name in sorted(topics))
    count = args.groups * args.per_group
    docs = [text[i * args.document_chars : (i + 1) * args.document_chars] for i in range(args.groups + count)]
    shared = [f"{docs[g]}\n\nQuestion {q}: what does this say?\nAnswer:" for q in range(args.per_group) for g in range(args.groups)]
    unique = [f"{docs[args.groups + i]}\n\nQuestion 0: what does this say?\nAnswer:" for i in range(count)]
    return {"shared-prefix": shared, "random": unique}


@contextlib.contextmanager
def launched(args: argparse.Namespace, dp: int, policy: str) -> Iterator[tuple[str, list[str]]]:
    """(endpoint, worker URLs) of `python -m rsgl.launch` with `dp` workers (no router for one)."""
    port, base = free_port(), free_port()
    command = [sys.executable, "-m", "rsgl.launch", "--dp", str(dp), "--port", str(port), "--worker-base-port", str(base), "--policy", policy]
    command += ["--router", "none" if dp == 1 else "smg", "--max-total-tokens", "16384"]
    command += ["--model-path", args.model] if args.model else []
    log = Path(f"/tmp/rsgl-bench-scale-{dp}-{policy}.log")
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    workers = [f"http://127.0.0.1:{base + i}" for i in range(dp)]
    try:
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while not any(word in log.read_text() for word in ("serving on", "workers ready")):
            if process.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"rsgl.launch did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield (workers[0] if dp == 1 else f"http://127.0.0.1:{port}"), workers
    finally:
        process.terminate()
        process.wait(timeout=60)


def run(endpoint: str, workers: list[str], prompts: list[str], args: argparse.Namespace) -> dict:
    [model] = [m["id"] for m in httpx.get(f"{endpoint}/v1/models", timeout=30).json()["data"]]
    client = openai.OpenAI(base_url=f"{endpoint}/v1", api_key="none", timeout=600)
    extra = {"ignore_eos": True}
    before = [httpx.get(f"{w}/get_server_info", timeout=30).json() for w in workers]

    def ask(text: str) -> int:
        out = client.completions.create(model=model, prompt=text, max_tokens=args.answer_tokens, temperature=0, extra_body=extra)
        assert out.usage is not None
        return out.usage.prompt_tokens + out.usage.completion_tokens

    start = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        tokens = sum(pool.map(ask, prompts))
    wall = time.perf_counter() - start
    after = [httpx.get(f"{w}/get_server_info", timeout=30).json() for w in workers]
    prompt_tokens = sum(a["prompt_tokens"] - b["prompt_tokens"] for a, b in zip(after, before))
    hits = sum(a["cache_hit_tokens"] - b["cache_hit_tokens"] for a, b in zip(after, before))
    return {"wall_s": wall, "tok_s": tokens / wall, "req_s": len(prompts) / wall, "hit_rate": hits / max(prompt_tokens, 1)}


def main() -> None:
    args = parse_args()
    prompts = workloads(args)
    setups = [("1 worker, all cores", 1, "cache_aware")]
    setups += [(f"{args.dp} workers, {policy}", args.dp, policy) for policy in ("cache_aware", "round_robin")]
    results: dict[str, dict[str, dict]] = {}
    kernels = None
    for name, dp, policy in setups:
        with launched(args, dp, policy) as (endpoint, workers):
            kernels = httpx.get(f"{workers[0]}/get_server_info", timeout=30).json()["kernels"]
            results[name] = {}
            for workload, texts in prompts.items():
                results[name][workload] = run(endpoint, workers, texts, args)
                r = results[name][workload]
                print(f"{name:<28} {workload:<14} {r['tok_s']:>8.1f} tok/s {r['req_s']:>6.2f} req/s  hit rate {r['hit_rate']:>6.1%}", flush=True)
    threads = len(os.sched_getaffinity(0))
    write_json(args.json, {"bench": "scale", "model": args.model or "default", **machine_fields(threads, kernels), "args": vars(args), "results": results})


if __name__ == "__main__":
    main()
