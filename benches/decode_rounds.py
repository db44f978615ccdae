"""Batch-1 decode of one GGUF file, rsgl bf16 against llama.cpp, in alternated rounds.

compare.py measures each engine once; where two engines are close and the host's bandwidth
swings between runs, one run says little. This measures only batch-1 decode (tokens per second
after the first token, greedy, a 32-token prompt), each engine in a fresh process with the file
read into the page cache first, rsgl then llama.cpp, for several rounds.

    python benches/decode_rounds.py --model ~/.cache/rsgl-bench/synth/llama-8b-gguf-f16.gguf --rounds 4
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

import compare

PROMPT = [[(i * 7919) % 40000 + 100 for i in range(32)]]


def rsgl_decode(path: str, threads: int, work: compare.Workload) -> dict:
    import rsgl

    with rsgl.Engine(path, dtype="bfloat16", threads=threads, kv_cache_dtype="bfloat16", disable_radix_cache=True, progress=False) as llm:

        def generate(batch: list[list[int]], new_tokens: int) -> None:
            llm.generate(input_ids=batch, sampling_params={"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True})

        generate(PROMPT, 2)  # warm-up
        return {"tok_s": compare.decode_tok_s(generate, PROMPT, work)}


def llamacpp_decode(path: str, threads: int, work: compare.Workload) -> dict:
    runner = compare.LlamaCppRunner(path, threads, work, extra_buffer_types=True)
    try:
        runner.generate(PROMPT, 2)  # warm-up
        return {"tok_s": compare.decode_tok_s(runner.generate, PROMPT, work)}
    finally:
        runner.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="a GGUF file both engines load")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=48)
    args = parser.parse_args()
    work = compare.Workload(prompt_tokens=32, new_tokens=args.new_tokens, prefill_tokens=64, sequences=1, repeats=1, membw_mb=0, membw_reps=0)
    engines = (("rsgl bf16", rsgl_decode), ("llama.cpp", llamacpp_decode))
    print("round  engine     decode b1 tok/s")
    for round_index in range(args.rounds):
        for name, decode in engines:
            tok_s = compare.warm_then(args.model, partial(decode, str(args.model), args.threads, work))["tok_s"]
            print(f"{round_index:>5}  {name:<9}  {tok_s:.3f}", flush=True)


if __name__ == "__main__":
    main()
