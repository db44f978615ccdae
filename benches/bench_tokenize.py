"""What encoding prompts costs, and whether Python keeps running meanwhile: the engine's Rust
tokenizer (`rsgl._core.Tokenizer`) against the `tokenizers` package's, on the same tokenizer.json.

    python benches/bench_tokenize.py [--model PATH] [--prompts 64] [--words 1500] [--json bench-results/tokenize.json]

Each way encodes the same --prompts texts of --words words (varied English-like text): once on
its own (`ms`), and once while a Python thread counts in a loop, as the server's event loop runs
beside a tokenizing request: `ticks vs alone` is how far that thread got against its rate with
nothing else running (1.0: tokenizing never held it up). Best of three rounds per way,
interleaved (this host is shared). This is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Callable

import numpy as np
import tokenizers
from bench_report import machine_fields, write_json

WORDS = "the of and to in is was for on that with as by at from it an be this which are or model token server cache".split()


def timed(work: Callable[[], object]) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def ticking(work: Callable[[], object]) -> float:
    """Ticks per second a Python thread counted while `work` ran."""
    done = threading.Event()
    ticks = 0

    def count() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1

    counter = threading.Thread(target=count)
    start = time.perf_counter()
    counter.start()
    work()
    done.set()
    seconds = time.perf_counter() - start
    counter.join()
    return ticks / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a model folder or GGUF file (default: the default model)")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--words", type=int, default=1500)
    parser.add_argument("--json", default="bench-results/tokenize.json", help="where to write the results")
    args = parser.parse_args()

    from rsgl.loader import load_model

    core = load_model(args.model, progress=False).tokenizer
    assert core is not None, "the model has no tokenizer"
    package = tokenizers.Tokenizer.from_str(core.to_str())
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(WORDS, size=args.words)) + f" {i}." for i in range(args.prompts)]
    assert core.encode_batch(texts) == [package.encode(t).ids for t in texts], "the two tokenizers disagree"

    ways: dict[str, Callable[[], object]] = {
        "tokenizers package, one by one (before)": lambda: [package.encode(t).ids for t in texts],
        "rsgl Tokenizer, one by one": lambda: [core.encode(t) for t in texts],
        "rsgl Tokenizer, encode_batch": lambda: core.encode_batch(texts),
    }
    idle_rate = 0.0
    best = {name: (float("inf"), 0.0) for name in ways}
    for _ in range(3):
        idle_rate = max(idle_rate, ticking(lambda: time.sleep(0.2)))
        for name, work in ways.items():
            best[name] = (min(best[name][0], timed(work)), max(best[name][1], ticking(work)))

    tokens = sum(len(ids) for ids in core.encode_batch(texts))
    print(f"{args.prompts} prompts, {tokens} tokens; a Python thread alone counts {idle_rate / 1e6:.2f} M ticks/s")
    print(f"{'way':>42}  {'ms':>8}  {'M tok/s':>8}  {'ticks/s vs alone':>16}")
    for name, (seconds, rate) in best.items():
        print(f"{name:>42}  {seconds * 1e3:>8.1f}  {tokens / seconds / 1e6:>8.2f}  {rate / idle_rate:>16.2f}")
    write_json(
        args.json,
        {
            "bench": "tokenize",
            **machine_fields(os.cpu_count() or 1, None),
            "model": args.model or "default",
            "prompts": args.prompts,
            "tokens": tokens,
            "results": [{"way": name, "seconds": s, "tokens_per_s": tokens / s, "ticks_vs_alone": r / idle_rate} for name, (s, r) in best.items()],
        },
    )


if __name__ == "__main__":
    main()
