"""What thousands of open streaming connections cost the server: RSS, OS threads and /health latency.

Starts `python -m rsgl.server` with room for two running requests, keeps both busy with long
generations, then opens N streamed `/generate` requests that wait in the queue with their
connections held open (each a real HTTP/1.1 request on its own socket, never read). While they are
held, /health is probed every 20 ms. Then every client leaves and the server must drain back to
zero running and waiting requests, its RSS and thread count back near the baseline.

    python benches/bench_idle_streams.py                  # 2000 connections, the default model
    python benches/bench_idle_streams.py --connections 500 --server-args="--threads 2"

Prints a table and writes bench-results/idle-streams.json.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import resource
import time
from pathlib import Path

import httpx
import orjson
from rsgl.bench_serving import launched_server

# Requests the engine runs at once: the long "blockers" hold both slots, so the rest wait.
RUNNING_SLOTS = 2
BLOCKER_TOKENS = 4000
HEALTH_PROBE_SECONDS = 0.02
# Connections opened at once (the listen backlog stays well below its limit).
CONNECT_BATCH = 100


def process_stats(pid: int) -> dict:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {"rss_mb": int(fields["VmRSS"].split()[0]) / 1024, "threads": int(fields["Threads"])}


async def open_stream(host: str, port: int, body: bytes) -> asyncio.StreamWriter:
    reader, writer = await asyncio.open_connection(host, port)
    head = f"POST /generate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    writer.write(head.encode() + body)
    await writer.drain()
    writer.reader = reader  # kept alive with the writer; never read
    return writer


async def wait_for_queue(client: httpx.AsyncClient, predicate, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        info = (await client.get("/get_server_info")).json()
        if predicate(info) or time.monotonic() > deadline:
            return info
        await asyncio.sleep(0.1)


async def measure(base_url: str, pid: int, connections: int, hold_seconds: float) -> dict:
    host, port = base_url.removeprefix("http://").split(":")
    async with httpx.AsyncClient(base_url=base_url, timeout=30, trust_env=False) as client:
        await client.post("/generate", json={"text": "Warm up.", "sampling_params": {"max_new_tokens": 4}})
        baseline = process_stats(pid)

        blocker = orjson.dumps({"text": "Count:", "stream": True, "sampling_params": {"max_new_tokens": BLOCKER_TOKENS, "ignore_eos": True}})
        idle = orjson.dumps({"text": "Say hi.", "stream": True, "sampling_params": {"max_new_tokens": 8}})
        writers = [await open_stream(host, int(port), blocker) for _ in range(RUNNING_SLOTS)]
        await wait_for_queue(client, lambda i: i["running_requests"] >= RUNNING_SLOTS, 30)

        started = time.monotonic()
        for first in range(0, connections, CONNECT_BATCH):
            writers += await asyncio.gather(*(open_stream(host, int(port), idle) for _ in range(first, min(first + CONNECT_BATCH, connections))))
        info = await wait_for_queue(client, lambda i: i["waiting_requests"] >= connections, 120)
        opened_seconds = time.monotonic() - started

        # The client's own objects for thousands of sockets would make its garbage collections
        # pause the probes (50-80 ms seen), which is not the server's latency.
        gc.freeze()
        health_ms = []
        held = process_stats(pid)
        hold_until = time.monotonic() + hold_seconds
        while time.monotonic() < hold_until:
            sent = time.perf_counter()
            (await client.get("/health")).raise_for_status()
            health_ms.append((time.perf_counter() - sent) * 1000)
            now = process_stats(pid)
            held = {key: max(held[key], now[key]) for key in held}
            await asyncio.sleep(HEALTH_PROBE_SECONDS)

        for writer in writers:
            writer.close()
        drained = await wait_for_queue(client, lambda i: i["running_requests"] == 0 and i["waiting_requests"] == 0, 120)
        await asyncio.sleep(1)  # let the last handlers finish
        after = process_stats(pid)
    health_ms.sort()
    return {
        "connections": connections,
        "queued_while_held": info["waiting_requests"],
        "seconds_to_open": round(opened_seconds, 2),
        "baseline": baseline,
        "held": held,
        "after_drain": after,
        "extra_rss_mb_held": round(held["rss_mb"] - baseline["rss_mb"], 1),
        "extra_threads_held": held["threads"] - baseline["threads"],
        "health_probes": len(health_ms),
        "health_ms_p50": round(health_ms[len(health_ms) // 2], 2),
        "health_ms_p99": round(health_ms[int(len(health_ms) * 0.99)], 2),
        "health_ms_max": round(health_ms[-1], 2),
        "drained": drained["running_requests"] == 0 and drained["waiting_requests"] == 0,
        "kv_pages_free_after": drained["kv_pages_free"] + drained["cached_pages"] == drained["kv_pages_total"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--hold-seconds", type=float, default=10)
    parser.add_argument("--server-args", default="", help="extra arguments for the server, as one string")
    parser.add_argument("--json", type=Path, default=Path("bench-results/idle-streams.json"))
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < args.connections + 100:
        raise SystemExit(f"bench_idle_streams: the open-files limit ({hard}) is below {args.connections} connections")
    server_args = f"--max-running-requests {RUNNING_SLOTS} {args.server_args}"
    with launched_server(server_args, api_key=None, timeout=600) as (base_url, process):
        result = asyncio.run(measure(base_url, process.pid, args.connections, args.hold_seconds))
    for key, value in result.items():
        print(f"{key:>22}  {value}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
