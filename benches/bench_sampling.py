"""What each sampling mode costs rsgl's decode on the default model, against greedy, in one run.

    python benches/bench_sampling.py [--threads 2] [--repeats 2] [--json bench-results/sampling.json]

Random prompts of PROMPT_TOKENS token ids at batch 1 and 16, NEW_TOKENS new tokens each with EOS
ignored, decoded with each sampling mode in turn (round-robin, so a drift of this shared host's
speed hits every mode alike). Throughput counts every new token over the whole call; each number
is the best of --repeats rounds, after a warm-up. This is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from bench_report import machine_fields, write_json

PROMPT_TOKENS = 32
NEW_TOKENS = 64
BATCH_SIZES = (1, 16)
MODES = {
    "greedy": {"temperature": 0.0},
    "temperature 0.8": {"temperature": 0.8},
    "top-p 0.9": {"temperature": 0.8, "top_p": 0.9},
    "top-k 40": {"temperature": 0.8, "top_k": 40},
    "min-p 0.05": {"temperature": 0.8, "min_p": 0.05},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="compute threads (default 2)")
    parser.add_argument("--repeats", type=int, default=2, help="rounds over every mode; the best counts")
    parser.add_argument("--json", default="bench-results/sampling.json", help="where to write the results")
    args = parser.parse_args()

    import rsgl

    rng = np.random.default_rng(0)
    with rsgl.Engine(threads=args.threads, disable_radix_cache=True, progress=False) as llm:
        vocab = llm.model_config["vocab_size"]
        prompts = [rng.integers(100, vocab, size=PROMPT_TOKENS).tolist() for _ in range(max(BATCH_SIZES))]

        def tok_s(batch: int, mode: dict) -> float:
            params = {**mode, "max_new_tokens": NEW_TOKENS, "ignore_eos": True, "seed": 1}
            start = time.perf_counter()
            llm.generate(input_ids=prompts[:batch], sampling_params=params)
            return batch * NEW_TOKENS / (time.perf_counter() - start)

        tok_s(2, MODES["greedy"])  # warm-up
        best = {(b, name): 0.0 for b in BATCH_SIZES for name in MODES}
        for _ in range(args.repeats):
            for b in BATCH_SIZES:
                for name, mode in MODES.items():
                    best[b, name] = max(best[b, name], tok_s(b, mode))
        info = llm.get_server_info()

    print(f"{'mode':>16}" + "".join(f"  batch {b:>2} tok/s  vs greedy" for b in BATCH_SIZES))
    for name in MODES:
        cells = "".join(f"  {best[b, name]:>14.1f}  {best[b, name] / best[b, 'greedy']:>9.2f}" for b in BATCH_SIZES)
        print(f"{name:>16}{cells}")
    write_json(
        args.json,
        {
            "bench": "sampling",
            **machine_fields(args.threads, info.get("kernels")),
            "prompt_tokens": PROMPT_TOKENS,
            "new_tokens": NEW_TOKENS,
            "results": [{"batch": b, "mode": name, "params": MODES[name], "tok_s": best[b, name]} for b in BATCH_SIZES for name in MODES],
        },
    )


if __name__ == "__main__":
    main()
