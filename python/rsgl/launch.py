"""`python -m rsgl.launch --dp N`: N rsgl workers, each on its own share of the cores (and of a NUMA
node's, where the machine has several), behind SGLang's router with its cache-aware policy, as
one command. Ctrl-C or SIGTERM stops the router, then the workers.

    python -m rsgl.launch --dp 2 [--port 30000] [--worker-base-port 31000] [--policy cache_aware]
        [--router smg|sglang-router|none] [--router-metrics-port P]
        [any `python -m rsgl.server` option, e.g. --model-path M]

Each worker is `python -m rsgl.server` with `--threads` set to its share of the cores and its CPU
affinity limited to them, so its compute threads pin there and the memory they touch first (the
KV pool, the packed weights) lands on their node; with `numactl` installed, the worker's memory is
also bound to the node (`--membind`). The router is `smg launch` (PyPI `smg`), or `sglang-router`'s
`launch_router` where that is what a user has; `--router none` starts only the workers (to register
with a router started on its own). The router answers to the model's name and to "default", as one
server does, and serves its Prometheus metrics on the launcher's host, on a free port unless
`--router-metrics-port` names one (so two launches on one machine do not collide).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import FrameType

import httpx

READY_TIMEOUT_SECONDS = 600
ROUTERS = ("smg", "sglang-router", "none")


@dataclass(frozen=True)
class Placement:
    """Where one worker runs: its CPUs, and the NUMA node they belong to (None: unknown)."""

    cpus: tuple[int, ...]
    node: int | None


def numa_nodes() -> dict[int, set[int]]:
    """{node: its CPUs} from sysfs; one node holding every CPU where sysfs says nothing."""
    nodes = {}
    for path in sorted(Path("/sys/devices/system/node").glob("node[0-9]*")):
        nodes[int(path.name[4:])] = parse_cpu_list((path / "cpulist").read_text())
    return nodes or {0: set(range(os.cpu_count() or 1))}


def parse_cpu_list(text: str) -> set[int]:
    """The CPUs of a kernel list such as "0-3,8,10-11"."""
    cpus: set[int] = set()
    for part in filter(None, text.strip().split(",")):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def place_workers(count: int, allowed: set[int], nodes: dict[int, set[int]]) -> list[Placement]:
    """Splits the `allowed` CPUs among `count` workers: whole NUMA nodes first (workers spread over
    the nodes in turn), then each node's CPUs evenly among the workers it got. Fails when a worker
    would get none."""
    usable = {node: sorted(cpus & allowed) for node, cpus in nodes.items() if cpus & allowed}
    order = sorted(usable)
    per_node: dict[int, int] = {node: 0 for node in order}
    for worker in range(count):
        per_node[order[worker % len(order)]] += 1
    placements = []
    for node in order:
        cpus, share = usable[node], per_node[node]
        for i in range(share):
            mine = tuple(cpus[i * len(cpus) // share : (i + 1) * len(cpus) // share])
            if not mine:
                raise SystemExit(f"rsgl.launch: {count} workers need at least {count} CPUs; this process may use {len(allowed)}")
            placements.append(Placement(mine, node if len(nodes) > 1 else None))
    return placements


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="python -m rsgl.launch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dp", type=int, default=1, help="workers (data-parallel replicas)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000, help="the router's port (the one endpoint clients use)")
    parser.add_argument("--worker-base-port", type=int, default=31000, help="worker i listens on this port + i")
    parser.add_argument("--policy", default="cache_aware", help="the router's policy (cache_aware, round_robin, power_of_two, ...)")
    parser.add_argument("--router", choices=ROUTERS, default="smg")
    parser.add_argument("--router-metrics-port", type=int, default=0, help="the router's Prometheus port (default: a free one)")
    args, server_options = parser.parse_known_args(argv)
    if args.dp < 1:
        parser.error("--dp must be at least 1")
    if "--threads" in server_options or "--port" in server_options:
        parser.error("--threads and --port are set per worker by the launcher")
    return args, server_options


def worker_command(port: int, placement: Placement, server_options: list[str]) -> list[str]:
    command = [sys.executable, "-m", "rsgl.server", "--host", "127.0.0.1", "--port", str(port), "--threads", str(len(placement.cpus)), *server_options]
    if placement.node is not None and shutil.which("numactl"):
        command = ["numactl", f"--membind={placement.node}", *command]
    return command


@dataclass(frozen=True)
class RouterOptions:
    host: str
    port: int
    policy: str
    metrics_port: int
    model: str  # the workers' model name, which "default" stands for


def router_command(router: str, options: RouterOptions, workers: list[str]) -> list[str]:
    where = ["--host", options.host, "--port", str(options.port), "--worker-urls", *workers, "--policy", options.policy]
    metrics = ["--prometheus-host", options.host, "--prometheus-port", str(options.metrics_port)]
    if router == "smg":
        return [sys.executable, "-m", "smg", "launch", *where, *metrics, "--model-alias", f"default={options.model}"]
    return [sys.executable, "-m", "sglang_router.launch_router", *where, *metrics]


def free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


def served_model(worker: str) -> str:
    model: str = httpx.get(f"{worker}/v1/models", timeout=30).json()["data"][0]["id"]
    return model


def wait_until(ready: str, processes: list[subprocess.Popen[bytes]], what: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in processes):
            raise SystemExit(f"rsgl.launch: {what} exited before it was ready")
        try:
            if httpx.get(ready, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"rsgl.launch: {what} was not ready after {READY_TIMEOUT_SECONDS} s")


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to each (the router first), then waits for all; SIGKILL to any still running after 30 s."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + 30
    for process in processes:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main(argv: list[str] | None = None) -> None:
    args, server_options = parse_args(argv)
    placements = place_workers(args.dp, os.sched_getaffinity(0), numa_nodes())
    ports = [args.worker_base_port + i for i in range(args.dp)]
    started: list[subprocess.Popen[bytes]] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        for port, placement in zip(ports, placements):
            where = f", NUMA node {placement.node}" if placement.node is not None else ""
            print(f"rsgl.launch: worker on port {port}, CPUs {list(placement.cpus)}{where}", flush=True)
            # A session of its own: Ctrl-C at the terminal reaches only the launcher, which stops
            # the router, then the workers.
            command = worker_command(port, placement, server_options)
            started.append(subprocess.Popen(command, preexec_fn=partial(os.sched_setaffinity, 0, set(placement.cpus)), start_new_session=True))
        workers = [f"http://127.0.0.1:{port}" for port in ports]
        for url in workers:
            wait_until(f"{url}/health", started, f"the worker at {url}")
        if args.router != "none":
            metrics_port = args.router_metrics_port or free_port(args.host)
            options = RouterOptions(args.host, args.port, args.policy, metrics_port, served_model(workers[0]))
            started.insert(0, subprocess.Popen(router_command(args.router, options, workers), start_new_session=True))
            wait_until(f"http://{args.host}:{args.port}/readiness", started, "the router")
            print(f"rsgl.launch: serving on http://{args.host}:{args.port} ({args.router}, {args.policy}) over {len(workers)} workers", flush=True)
            print(f"rsgl.launch: router metrics on http://{args.host}:{metrics_port}/metrics", flush=True)
        else:
            print(f"rsgl.launch: workers ready at {' '.join(workers)}", flush=True)
        while all(p.poll() is None for p in started):
            time.sleep(0.5)
        raise SystemExit("rsgl.launch: a process exited on its own; stopping the others")
    except KeyboardInterrupt:
        pass
    finally:
        stop(started)


if __name__ == "__main__":
    main()
