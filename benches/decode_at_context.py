"""Batch-1 decode after a long prompt, one rsgl engine per KV dtype in turn: time to first token
and decode tok/s from the first streamed token to the last (the prompt's prefill, seconds at 8k
tokens, stays out of the decode's time).

    python benches/decode_at_context.py [--model PATH] [--context 8000] [--new-tokens 128]
        [--dtypes float32,bfloat16,int8] [--threads 2] [--json bench-results/decode_at_context.json]

Random token ids, greedy, EOS ignored, no prefix cache. For llama.cpp beside it on the same file,
`benches/compare.py --decode-contexts N` (each engine at its default KV dtype).
"""

from __future__ import annotations

import argparse
import random
import time

from bench_report import machine_fields, write_json


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model path (default: the default model, at W8A8 as rsgl serves it)")
    parser.add_argument("--context", type=int, default=8000, help="prompt tokens")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--dtypes", default="float32,bfloat16,int8", help="KV cache dtypes, one engine each")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default="bench-results/decode_at_context.json")
    return parser.parse_args()


def measure(args: argparse.Namespace, kv_cache_dtype: str) -> dict:
    import rsgl

    with rsgl.Engine(args.model, threads=args.threads, kv_cache_dtype=kv_cache_dtype, disable_radix_cache=True, progress=False) as engine:
        info = engine.get_server_info()
        rng = random.Random(0)
        ids = [rng.randrange(100, 1000) for _ in range(args.context)]  # ids every vocabulary has
        params = {"temperature": 0, "max_new_tokens": args.new_tokens, "ignore_eos": True}
        engine.generate(input_ids=ids[:64], sampling_params={**params, "max_new_tokens": 4})  # warm-up
        started = time.perf_counter()
        first = None
        for _ in engine.generate(input_ids=ids, sampling_params=params, stream=True):
            first = first or time.perf_counter()
        ended = time.perf_counter()
        assert first is not None
    return {
        "kv_cache_dtype": kv_cache_dtype,
        "kernels": info["kernels"],
        "ttft_s": first - started,
        "prefill_tok_s": args.context / (first - started),
        "decode_tok_s": (args.new_tokens - 1) / (ended - first),
    }


def main() -> None:
    args = parse_args()
    rows = [measure(args, dtype) for dtype in args.dtypes.split(",")]
    print(f"batch-1 decode after {args.context} prompt tokens, {args.new_tokens} new, {args.threads} thread(s), kernels {rows[0]['kernels']}")
    print(f"{'KV dtype':>9}  {'TTFT s':>7}  {'prefill tok/s':>13}  {'decode tok/s':>12}")
    for row in rows:
        print(f"{row['kv_cache_dtype']:>9}  {row['ttft_s']:7.1f}  {row['prefill_tok_s']:13.1f}  {row['decode_tok_s']:12.1f}")
    write_json(args.json, {**machine_fields(args.threads, rows[0]["kernels"]), "context": args.context, "new_tokens": args.new_tokens, "rows": rows})


if __name__ == "__main__":
    main()
