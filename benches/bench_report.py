"""What the Python benchmarks share: where and how they write their JSON."""

from __future__ import annotations

import json
import platform
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path


def machine_fields(threads: int, kernels: str | None) -> dict:
    """The facts that make two runs comparable."""
    return {"threads": threads, "rsgl_kernels": kernels, "machine": platform.machine()}


def write_json(path: str, report: dict) -> None:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


def isolated(fn, *args):
    """`fn(*args)` in a fresh process of its own: each engine's threads, memory and peak RSS apart."""
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()
