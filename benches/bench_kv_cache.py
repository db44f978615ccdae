"""KV cache element types side by side (float32, bfloat16, int8): decode speed at a long context
with several sequences, tokens per memory budget, and perplexity over a long text.

    python benches/bench_kv_cache.py [--model PATH] [--quantization gguf|w4a8|w8a8_int8] [--dtype float32]
        [--threads 2] [--dtypes bfloat16,int8,float32] [--context 4096] [--concurrent 8] [--decode-tokens 64]
        [--rounds 3] [--skip-decode] [--kv-gb 2.5] [--ppl-tokens 16384] [--ppl-window 4096]
        [--json bench-results/kv_cache.json]

Every engine loads the same weights in the same format (--model, --quantization, --dtype: as
`rsgl.Engine` takes them; by default the default model in its default precision) and differs only
in its KV pages' dtype.

Decode: --concurrent prompts of --context tokens (distinct stretches of the text below) are
prefilled once into every engine's radix cache (one engine per dtype, loaded side by side, the
same --kv-gb budget each). Each round then asks every engine in turn (the order flipped every
round) for --decode-tokens more tokens of all of them at once (ignore_eos): the cached prompts
leave one token each to compute, so the wall time is decode at that context. tok/s = sequences
x tokens / wall, best of the rounds.
Perplexity: the first --ppl-tokens tokens of Python's own documentation (`pydoc_data.topics`,
shipped with every CPython), in windows of --ppl-window tokens (8192: the default model's whole
context, so windows of 8191, a prompt leaving room for one token), each window from an empty cache, scored with prompt log-probabilities, each dtype in
its own engine without a radix cache. --skip-decode measures only that.
Also: each engine's load time and tokens in the budget, and the process's peak RSS.
Targets (printed PASS/FAIL): int8 decode >= 1.3x bfloat16 at 4096 tokens and 8 sequences, int8
perplexity within 1% of bfloat16's (issue 22); int8 perplexity within 1% of float32 pages' (issue
45: the condition for int8 to be the default KV dtype of a weight format). This is a benchmark,
not a test.
"""

from __future__ import annotations

import argparse
import math
import resource
import sys
import time

from bench_report import machine_fields, write_json
from perplexity import windows

TARGET_SPEEDUP = 1.3
TARGET_PERPLEXITY_RATIO = 1.01


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model path (default: the default model)")
    parser.add_argument("--quantization", default=None, help="the engines' quantization (default: the model's default)")
    parser.add_argument("--dtype", default=None, help="the engines' weight dtype, e.g. float32 (default: the model's default)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtypes", default="bfloat16,int8,float32")
    parser.add_argument("--context", type=int, default=4096, help="prompt tokens per sequence")
    parser.add_argument("--concurrent", type=int, default=8)
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-decode", action="store_true", help="perplexity only: no prefill, no decode rounds")
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


def engine_options(args: argparse.Namespace, kv_dtype: str) -> dict:
    """rsgl.Engine's arguments: the weights as asked, `kv_dtype` pages."""
    options = {"threads": args.threads, "kv_cache_dtype": kv_dtype, "kv_cache_memory_gb": args.kv_gb, "progress": False}
    if args.model:
        options["model_path"] = args.model
    if args.quantization:
        options["quantization"] = args.quantization
    if args.dtype:
        options["dtype"] = args.dtype
    return options


def perplexity_nll(args: argparse.Namespace, kv_dtype: str, chunks: list[list[int]]) -> list[float]:
    """Negative log-likelihoods of every token of `chunks` after its first, each chunk from an empty cache."""
    import rsgl

    with rsgl.Engine(**engine_options(args, kv_dtype), disable_radix_cache=True) as llm:
        outs = llm.generate(input_ids=chunks, sampling_params={"max_new_tokens": 0}, return_logprob=True, logprob_start_len=0)
    # The first token of a window has no log-probability (nothing before it).
    return [-lp for out in outs for lp, _, _ in out["meta_info"]["input_token_logprobs"][1:]]


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

    engines, results = {}, {}
    for dtype in args.dtypes:
        log(f"{dtype}: loading {args.model or 'the default model'}, {args.threads} thread(s), {args.kv_gb} GB of KV")
        start = time.perf_counter()
        llm = engines[dtype] = rsgl.Engine(**engine_options(args, dtype))
        info = llm.get_server_info()
        results[dtype] = {"load_s": time.perf_counter() - start, "max_total_tokens": info["max_total_tokens"], "decode_walls": []}
        if dtype == args.dtypes[0]:
            ids = llm.tokenize(long_text())
            model_path, kernels, weights = info["model_path"], info.get("kernels"), {"dtype": info["dtype"], "quantization": info["quantization"]}
            if args.ppl_window >= info["context_length"]:
                # A prompt leaves room for one token: a window of the whole context scores its last
                # position from the context_length - 1 before it.
                log(f"--ppl-window {args.ppl_window}: windows of {info['context_length'] - 1} tokens, the model's context less one")
                args.ppl_window = info["context_length"] - 1
        if args.skip_decode:  # one engine at a time: only its size and the weights' format are read
            llm.shutdown()
    needed = 0 if args.skip_decode else args.concurrent * args.context
    if len(ids) < max(needed, args.ppl_tokens):
        sys.exit(f"the text has {len(ids)} tokens; --concurrent x --context and --ppl-tokens need at most that many")
    prompts = [ids[i * args.context : (i + 1) * args.context] for i in range(args.concurrent)]
    if not args.skip_decode:
        try:
            for dtype, llm in engines.items():
                log(f"{dtype}: prefilling {args.concurrent} x {args.context} tokens")
                decode_seconds(llm, prompts, 1)
            for round_index in range(args.rounds):
                order = args.dtypes if round_index % 2 == 0 else args.dtypes[::-1]
                for dtype in order:
                    wall = decode_seconds(engines[dtype], prompts, args.decode_tokens)
                    results[dtype]["decode_walls"].append(wall)
                    log(f"round {round_index + 1} {dtype}: {args.concurrent * args.decode_tokens / wall:.1f} tok/s")
        finally:
            for llm in engines.values():
                llm.shutdown()
    chunks = windows(ids[: args.ppl_tokens], args.ppl_window)
    for dtype in args.dtypes:
        log(f"{dtype}: perplexity over {args.ppl_tokens} tokens in windows of {args.ppl_window}")
        start = time.perf_counter()
        nll = perplexity_nll(args, dtype, chunks)
        results[dtype]["perplexity"] = math.exp(sum(nll) / len(nll))
        results[dtype]["perplexity_s"] = time.perf_counter() - start
        if results[dtype]["decode_walls"]:
            results[dtype]["decode_tok_s"] = args.concurrent * args.decode_tokens / min(results[dtype]["decode_walls"])
    peak_rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)
    checks = report(results, args, weights)
    print(f"peak RSS of the process (all engines): {peak_rss_gb:.2f} GB")
    write_json(
        args.json,
        {
            "bench": "kv_cache",
            "model": model_path,
            "weights": weights,
            **machine_fields(args.threads, kernels),
            "context": args.context,
            "concurrent": args.concurrent,
            "decode_tokens": args.decode_tokens,
            "rounds": 0 if args.skip_decode else args.rounds,
            "kv_cache_memory_gb": args.kv_gb,
            "ppl_tokens": args.ppl_tokens,
            "ppl_window": args.ppl_window,
            "peak_rss_gb": peak_rss_gb,
            "results": results,
            "checks": checks,
        },
    )


def report(results: dict[str, dict], args: argparse.Namespace, weights: dict) -> dict[str, bool]:
    bf16, f32 = results.get("bfloat16"), results.get("float32")
    decoded = not args.skip_decode
    print(f"weights: {weights['dtype']}, quantization {weights['quantization']}")
    if decoded:
        print(f"{args.concurrent} sequences at {args.context} tokens, {args.decode_tokens} decode tokens each, best of {args.rounds}")
    print(f"perplexity over {args.ppl_tokens} tokens in windows of {args.ppl_window}")
    print(f"{'kv dtype':<9} {'load s':>7} {'tokens in budget':>17} {'decode tok/s':>13} {'vs bf16':>8} {'perplexity':>11} {'vs bf16':>8} {'vs f32':>8}")
    for dtype, r in results.items():
        speed = f"{r['decode_tok_s']:.1f}" if decoded else "-"
        speedup = f"{r['decode_tok_s'] / bf16['decode_tok_s']:.2f}x" if decoded and bf16 else "-"
        vs_bf16 = f"{r['perplexity'] / bf16['perplexity']:.4f}" if bf16 else "-"
        vs_f32 = f"{r['perplexity'] / f32['perplexity']:.4f}" if f32 else "-"
        print(f"{dtype:<9} {r['load_s']:>7.1f} {r['max_total_tokens']:>17} {speed:>13} {speedup:>8} {r['perplexity']:>11.4f} {vs_bf16:>8} {vs_f32:>8}")
    checks = {}
    if "int8" in results:
        int8 = results["int8"]
        if bf16 and decoded:
            checks[f"int8 decode >= {TARGET_SPEEDUP}x bfloat16"] = int8["decode_tok_s"] >= TARGET_SPEEDUP * bf16["decode_tok_s"]
        if bf16:
            checks["int8 perplexity within 1% of bfloat16"] = int8["perplexity"] <= TARGET_PERPLEXITY_RATIO * bf16["perplexity"]
        if f32:
            checks["int8 perplexity within 1% of float32"] = int8["perplexity"] <= TARGET_PERPLEXITY_RATIO * f32["perplexity"]
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    return checks


if __name__ == "__main__":
    main()
