"""The prefix cache's disk tier (`hicache_dir`): a multi-turn workload whose prefixes do not fit in
memory, with and without the tier, and where reading a prefix back beats recomputing it.

    python benches/bench_hicache.py [--model PATH] [--threads 2] [--conversations 16] [--turns 8]
        [--document-tokens 512] [--question-tokens 16] [--answer-tokens 32] [--concurrency 4]
        [--memory-fraction 0.25] [--crossover 17,65,257,1025,2049] [--json bench-results/hicache.json]

Multi-turn: each of --conversations conversations opens on its own stretch of --document-tokens
tokens of Python's docs (`pydoc_data.topics`); every turn sends the conversation so far (its
earlier questions and the model's answers, --answer-tokens greedy tokens each, ignore_eos) plus a
new question (--question-tokens further tokens of the docs), as a chat client resends its
history. Turns go round the conversations, --concurrency requests at a time. Both engines' KV
pools hold --memory-fraction of the working set (every conversation's context at its last turn),
so a conversation's prefix has left memory before its next turn. The engine with the tier (a
fresh folder) and the one without take each turn alternately, on the same prompts; their
answers must be identical. Throughput: prompt and answer tokens of all turns / wall time.

Crossover: for each length in --crossover, the time of a request with a prompt of that length
and one new token, computed from scratch (no tier) against read back from the tier by a freshly
started engine (nothing in memory), with the file in the page cache and after dropping it from
the page cache (`posix_fadvise(DONTNEED)`: the pages then come from the device).
Also: load times and the process's peak RSS.
Targets (issue 22, printed PASS/FAIL): with the tier, cache hit rate >= 80% and throughput
>= 1.5x the engine without it; identical greedy answers. This is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

from bench_report import machine_fields, write_json

TARGET_HIT_RATE = 0.8
TARGET_SPEEDUP = 1.5


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model path (default: the default model)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--document-tokens", type=int, default=512)
    parser.add_argument("--question-tokens", type=int, default=16)
    parser.add_argument("--answer-tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--memory-fraction", type=float, default=0.25, help="KV pool size / working set")
    parser.add_argument("--crossover", default="17,65,257,1025,2049", help="prompt lengths to read back or recompute (whole pages and a token)")
    parser.add_argument("--json", default="bench-results/hicache.json")
    args = parser.parse_args()
    args.crossover = [int(n) for n in args.crossover.split(",")] if args.crossover else []
    return args


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def doc_ids(llm) -> list[int]:
    from pydoc_data.topics import topics

    return llm.tokenize("\n\n".join(topics[name] for name in sorted(topics)))


def new_engine(args: argparse.Namespace, max_total_tokens: int, hicache_dir: str | None):
    import rsgl

    model = [args.model] if args.model else []
    start = time.perf_counter()
    llm = rsgl.Engine(*model, threads=args.threads, max_total_tokens=max_total_tokens, hicache_dir=hicache_dir, progress=False)
    return llm, time.perf_counter() - start


def run_turn(llm, prompts: list[list[int]], args: argparse.Namespace) -> tuple[list[list[int]], float]:
    """Every conversation's request of one turn, --concurrency at a time: (answers, wall seconds)."""
    params = {"temperature": 0, "max_new_tokens": args.answer_tokens, "ignore_eos": True}
    answers, start = [], time.perf_counter()
    for first in range(0, len(prompts), args.concurrency):
        outs = llm.generate(input_ids=prompts[first : first + args.concurrency], sampling_params=params)
        answers += [out["output_ids"] for out in outs]
    return answers, time.perf_counter() - start


def multi_turn(args: argparse.Namespace, ids: list[int]) -> dict:
    per_turn = args.question_tokens + args.answer_tokens
    working_set = args.conversations * (args.document_tokens + args.turns * per_turn)
    memory_tokens = int(working_set * args.memory_fraction)
    need = args.conversations * args.document_tokens + args.conversations * args.turns * args.question_tokens
    if len(ids) < need:
        sys.exit(f"the docs have {len(ids)} tokens; the conversations need {need}")
    documents = [ids[c * args.document_tokens : (c + 1) * args.document_tokens] for c in range(args.conversations)]
    questions = iter(ids[args.conversations * args.document_tokens :])
    with tempfile.TemporaryDirectory(prefix="rsgl-hicache-bench-") as folder:
        engines, load_s = {}, {}
        for name, hicache_dir in (("disk tier", folder), ("memory only", None)):
            engines[name], load_s[name] = new_engine(args, memory_tokens, hicache_dir)
        log(f"working set {working_set} tokens, KV pool {memory_tokens} tokens in each engine")
        contexts = [list(doc) for doc in documents]
        walls = dict.fromkeys(engines, 0.0)
        mismatches, prompt_tokens, answer_tokens = 0, 0, 0
        try:
            for turn in range(args.turns):
                for context in contexts:
                    context += [next(questions) for _ in range(args.question_tokens)]
                order = list(engines) if turn % 2 == 0 else list(engines)[::-1]
                answers = {}
                for name in order:
                    answers[name], wall = run_turn(engines[name], contexts, args)
                    walls[name] += wall
                mismatches += sum(a != b for a, b in zip(*answers.values()))
                prompt_tokens += sum(map(len, contexts))
                answer_tokens += sum(map(len, answers["disk tier"]))
                log(f"turn {turn + 1}: " + ", ".join(f"{name} {walls[name]:.1f} s so far" for name in engines))
                for context, answer in zip(contexts, answers["disk tier"]):
                    context += answer
            info = {name: llm.get_server_info() for name, llm in engines.items()}
        finally:
            for llm in engines.values():
                llm.shutdown()
    results = {}
    for name in engines:
        results[name] = {
            "load_s": load_s[name],
            "wall_s": walls[name],
            "tok_s": (prompt_tokens + answer_tokens) / walls[name],
            "hit_rate": info[name]["cache_hit_tokens"] / info[name]["prompt_tokens"],
            "hicache": info[name]["hicache"],
        }
    return {
        "working_set_tokens": working_set,
        "memory_tokens": memory_tokens,
        "prompt_tokens": prompt_tokens,
        "answer_tokens": answer_tokens,
        "mismatched_answers": mismatches,
        "results": results,
    }


def first_token_seconds(llm, prompt: list[int]) -> float:
    start = time.perf_counter()
    llm.generate(input_ids=prompt, sampling_params={"temperature": 0, "max_new_tokens": 1})
    return time.perf_counter() - start


def crossover(args: argparse.Namespace, ids: list[int]) -> list[dict]:
    """Per prompt length: seconds to compute it from scratch, and to read it back from the tier."""
    if not args.crossover:
        return []
    longest = max(args.crossover)
    prompts = {n: ids[i * longest : i * longest + n] for i, n in enumerate(args.crossover)}
    rows = {n: {"tokens": n} for n in args.crossover}
    with tempfile.TemporaryDirectory(prefix="rsgl-hicache-crossover-") as folder:
        llm, _ = new_engine(args, 2 * longest, None)
        for n, prompt in prompts.items():
            llm.flush_cache()
            rows[n]["recompute_s"] = first_token_seconds(llm, prompt)
        llm.shutdown()
        llm, _ = new_engine(args, 2 * longest, folder)
        for prompt in prompts.values():
            first_token_seconds(llm, prompt)  # computed, and written to the tier
        llm.shutdown()  # waits for the writer
        for where in ("page cache", "device"):
            if where == "device":
                for file in Path(folder).glob("*.rsglkv"):
                    fd = os.open(file, os.O_RDONLY)
                    os.fsync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    os.close(fd)
            llm, _ = new_engine(args, 2 * longest, folder)
            for n, prompt in prompts.items():
                rows[n][f"disk_{where.replace(' ', '_')}_s"] = first_token_seconds(llm, prompt)
            llm.shutdown()
    return list(rows.values())


def main() -> None:
    args = parse_args()
    probe, _ = new_engine(args, 64, None)
    ids = doc_ids(probe)
    model_path, kernels = probe.get_server_info()["model_path"], probe.get_server_info()["kernels"]
    probe.shutdown()
    turns = multi_turn(args, ids)
    rows = crossover(args, ids)
    peak_rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)
    checks = report(turns, rows)
    print(f"peak RSS of the process: {peak_rss_gb:.2f} GB")
    write_json(
        args.json,
        {
            "bench": "hicache",
            "model": model_path,
            **machine_fields(args.threads, kernels),
            "args": {k: v for k, v in vars(args).items() if k != "json"},
            "multi_turn": turns,
            "crossover": rows,
            "peak_rss_gb": peak_rss_gb,
            "checks": checks,
        },
    )


def report(turns: dict, rows: list[dict]) -> dict[str, bool]:
    tier, memory = turns["results"]["disk tier"], turns["results"]["memory only"]
    print(f"multi-turn: working set {turns['working_set_tokens']} tokens, KV pool {turns['memory_tokens']} tokens")
    print(f"{'engine':<12} {'load s':>7} {'wall s':>7} {'tok/s':>8} {'hit rate':>9}")
    for name, r in turns["results"].items():
        print(f"{name:<12} {r['load_s']:>7.1f} {r['wall_s']:>7.1f} {r['tok_s']:>8.1f} {r['hit_rate']:>9.1%}")
    disk = tier["hicache"]
    print(
        f"disk tier: {disk['hit_tokens']} prompt tokens read back, {disk['read_bytes'] / 1e9:.2f} GB read, "
        f"{disk['written_bytes'] / 1e9:.2f} GB written, {disk['used_pages']} pages held"
    )
    if rows:
        print(f"{'tokens':>7} {'recompute ms':>13} {'read (page cache) ms':>21} {'read (device) ms':>17}")
        for row in rows:
            print(f"{row['tokens']:>7} {row['recompute_s'] * 1e3:>13.1f} {row['disk_page_cache_s'] * 1e3:>21.1f} {row['disk_device_s'] * 1e3:>17.1f}")
    speedup = memory["wall_s"] / tier["wall_s"]
    checks = {
        f"hit rate with the tier >= {TARGET_HIT_RATE:.0%}": tier["hit_rate"] >= TARGET_HIT_RATE,
        f"throughput >= {TARGET_SPEEDUP}x without the tier ({speedup:.2f}x)": speedup >= TARGET_SPEEDUP,
        f"identical greedy answers ({turns['mismatched_answers']} differ)": turns["mismatched_answers"] == 0,
    }
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}: {name}")
    return checks


if __name__ == "__main__":
    main()
