"""KV cache element types side by side (float32, bfloat16, int8): decode speed at a long context
with several sequences, tokens per memory budget, and perplexity over a long text.

    python benches/bench_kv_cache.py [--model PATH] [--quantization w4a8] [--threads 2] [--dtypes bfloat16,int8,float32]
        [--context 4096] [--concurrent 8] [--decode-tokens 64] [--rounds 3] [--kv-gb 2.5]
        [--ppl-tokens 16384] [--ppl-window 4096] [--json bench-results/kv_cache.json]

Decode: --concurrent prompts of --context tokens (distinct stretches of the text below) are
prefilled once into every engine's radix cache (one engine per dtype, loaded side by side, the
same --kv-gb budget each). Each round then asks every engine in turn (the order flipped every
round) for --decode-tokens more tokens of all of them at once (ignore_eos): the cached prompts
leave one token each to compute, so the wall time is decode at that context. tok/s = sequences
x tokens / wall, best of the rounds.
Perplexity: the first --ppl-tokens tokens of Python's own documentation (`pydoc_data.topics`,
shipped with every CPython), in windows of --ppl-window tokens, scored with prompt
log-probabilities (`perplexity.rsgl_nll`), each dtype in its own engine without a radix cache.
Also: each engine's load time and tokens in the budget, and the process's peak RSS.
Targets (issue 22, printed PASS/FAIL): int8 decode >= 1.3x bfloat16 at 4096 tokens and 8
sequences; int8 perplexity within 1% of bfloat16's. This is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import math
import resource
import sys
import time

from bench_report import machine_fields, write_json
from perplexity import rsgl_nll, windows

TARGET_SPEEDUP = 1.3
TARGET_PERPLEXITY_RATIO = 1.01


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model path (default: the default model)")
    parser.add_argument("--quantization", default=None, help="the engines' quantization (default: as the model is stored)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtypes", default="bfloat16,int8,float32")
    parser.add_argument("--context", type=int, default=4096, help="prompt tokens per sequence")
    parser.add_argument("--concurrent", type=int, default=8)
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kv-gb", type=float, default=2.5, help="kv_cache_memory_gb of every engine")
    parser.add_argument("--ppl-tokens", type=int, default=16384)
    parser.add_argument("--ppl-window", type=int, default=4096)
    parser.add_argument("--json", default="bench-results/kv_cache.json")
    args = parser.parse_args()
    args.dtypes = args.dtypes.split(",")
    return args


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def long_text() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name] for name in sorted(topics))


def decode_seconds(llm, prompts: list[list[int]], tokens: int) -> float:
    params = {"temperature": 0, "max_new_tokens": tokens, "ignore_eos": True}
    start = time.perf_counter()
    outs = llm.generate(input_ids=prompts, sampling_params=params)
    wall = time.perf_counter() - start
    assert all(o["meta_info"]["completion_tokens"] == tokens for o in outs)
    return wall


def main() -> None:
    args = parse_args()
    import rsgl

    engines, load_s = {}, {}
    for dtype in args.dtypes:
        log(f"{dtype}: loading {args.model or 'the default model'}, {args.threads} thread(s), {args.kv_gb} GB of KV")
        start = time.perf_counter()
        model = [args.model] if args.model else []
        quantization = {"quantization": args.quantization} if args.quantization else {}
        engines[dtype] = rsgl.Engine(*model, threads=args.threads, kv_cache_dtype=dtype, kv_cache_memory_gb=args.kv_gb, progress=False, **quantization)
        load_s[dtype] = time.perf_counter() - start
    any_engine = engines[args.dtypes[0]]
    ids = any_engine.tokenize(long_text())
    needed = args.concurrent * args.context
    if len(ids) < max(needed, args.ppl_tokens):
        sys.exit(f"the text has {len(ids)} tokens; --concurrent x --context and --ppl-tokens need at most that many")
    prompts = [ids[i * args.context : (i + 1) * args.context] for i in range(args.concurrent)]
    results: dict[str, dict] = {}
    try:
        for dtype, llm in engines.items():
            log(f"{dtype}: prefilling {args.concurrent} x {args.context} tokens")
            decode_seconds(llm, prompts, 1)
            info = llm.get_server_info()
            results[dtype] = {"load_s": load_s[dtype], "max_total_tokens": info["max_total_tokens"], "decode_walls": []}
        for round_index in range(args.rounds):
            order = args.dtypes if round_index % 2 == 0 else args.dtypes[::-1]
            for dtype in order:
                wall = decode_seconds(engines[dtype], prompts, args.decode_tokens)
                results[dtype]["decode_walls"].append(wall)
                log(f"round {round_index + 1} {dtype}: {args.concurrent * args.decode_tokens / wall:.1f} tok/s")
        model_path = any_engine.get_server_info()["model_path"]
        kernels = any_engine.get_server_info().get("kernels")
    finally:
        for llm in engines.values():
            llm.shutdown()
    chunks = windows(ids[: args.ppl_tokens], args.ppl_window)
    for dtype in args.dtypes:
        log(f"{dtype}: perplexity over {args.ppl_tokens} tokens")
        nll = rsgl_nll(model_path, chunks, args.quantization or "auto", 8, args.threads, dtype)
        results[dtype]["perplexity"] = math.exp(sum(nll) / len(nll))
        results[dtype]["decode_tok_s"] = args.concurrent * args.decode_tokens / min(results[dtype]["decode_walls"])
    peak_rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)
    checks = report(results, args)
    print(f"peak RSS of the process (all engines): {peak_rss_gb:.2f} GB")
    write_json(
        args.json,
        {
            "bench": "kv_cache",
            "model": model_path,
            **machine_fields(args.threads, kernels),
            "context": args.context,
            "concurrent": args.concurrent,
            "decode_tokens": args.decode_tokens,
            "rounds": args.rounds,
            "kv_cache_memory_gb": args.kv_gb,
            "ppl_tokens": args.ppl_tokens,
            "ppl_window": args.ppl_window,
            "peak_rss_gb": peak_rss_gb,
            "results": results,
            "checks": checks,
        },
    )


def report(results: dict[str, dict], args: argparse.Namespace) -> dict[str, bool]:
    base = results.get("bfloat16")
    print(f"{args.concurrent} sequences at {args.context} tokens, {args.decode_tokens} decode tokens each, best of {args.rounds}")
    print(f"{'kv dtype':<9} {'load s':>7} {'tokens in budget':>17} {'decode tok/s':>13} {'vs bf16':>8} {'perplexity':>11} {'vs bf16':>8}")
    for dtype, r in results.items():
        speed = f"{r['decode_tok_s'] / base['decode_tok_s']:.2f}x" if base else "-"
        quality = f"{r['perplexity'] / base['perplexity']:.4f}" if base else "-"
        print(f"{dtype:<9} {r['load_s']:>7.1f} {r['max_total_tokens']:>17} {r['decode_tok_s']:>13.1f} {speed:>8} {r['perplexity']:>11.4f} {quality:>8}")
    checks = {}
    if base and "int8" in results:
        int8 = results["int8"]
        checks[f"int8 decode >= {TARGET_SPEEDUP}x bfloat16"] = int8["decode_tok_s"] >= TARGET_SPEEDUP * base["decode_tok_s"]
        checks["int8 perplexity within 1% of bfloat16"] = int8["perplexity"] <= TARGET_PERPLEXITY_RATIO * base["perplexity"]
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    return checks


if __name__ == "__main__":
    main()
