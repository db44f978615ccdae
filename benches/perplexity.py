"""Perplexity of rsgl and llama.cpp on the same GGUF file and the same tokens, side by side: how
much a quantization scheme (rsgl running a file's 4-bit blocks on its W4A8 kernels, or its
`w4a8` conversion) costs in accuracy, against llama.cpp running the same file.

    python benches/perplexity.py [--model PATH.gguf|FOLDER] [--text FILE] [--window 512]
                                 [--rsgl-quantization gguf|w4a8|none|auto] [--activation-bits 8|16]
                                 [--skip-llamacpp]
                                 [--json bench-results/perplexity.json]

The text (default: tests/data/lighthouse_keepers.txt) is tokenized once by rsgl's tokenizer and
cut into windows of --window tokens; every token of a window after its first is scored from the
ones before it in the window (each window starts with an empty cache, as llama.cpp's
`perplexity` tool does). rsgl scores them with prompt log-probabilities (`logprob_start_len=0`);
llama.cpp (llama-cpp-python, its low-level API) with every position's logits in one batch per
window. Perplexity is exp of the mean negative log-likelihood over the scored tokens. Each engine
runs in its own process.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
from bench_report import isolated

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TEXT = REPO / "tests" / "data" / "lighthouse_keepers.txt"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="a GGUF file (default: rsgl's default model), or a Hugging Face folder with --skip-llamacpp")
    parser.add_argument("--text", type=Path, default=DEFAULT_TEXT, help="the text to score")
    parser.add_argument("--window", type=int, default=512, help="tokens per window")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--rsgl-quantization",
        default="gguf",
        choices=["gguf", "w4a8", "none", "auto"],
        help="gguf: the file's blocks as they are (default); w4a8: dequantized then quantized at load; none: bfloat16; "
        "auto: as the model says (a checkpoint converted by python -m rsgl.quantize: its own quantization)",
    )
    parser.add_argument("--activation-bits", type=int, default=8, choices=[8, 16], help="rsgl's activations of quantized layers")
    parser.add_argument("--skip-llamacpp", action="store_true")
    parser.add_argument("--json", default="bench-results/perplexity.json")
    return parser.parse_args()


def windows(ids: list[int], size: int) -> list[list[int]]:
    return [ids[i : i + size] for i in range(0, len(ids) - 1, size) if len(ids[i : i + size]) > 1]


def rsgl_nll(model: str, chunks: list[list[int]], quantization: str, activation_bits: int, threads: int, kv_cache_dtype: str = "float32") -> list[float]:
    import rsgl

    options = {"none": {"dtype": "bfloat16"}, "auto": {}}.get(quantization, {"quantization": quantization})
    options["activation_bits"] = activation_bits
    options["kv_cache_dtype"] = kv_cache_dtype
    if quantization == "w4a8":
        options["dtype"] = "bfloat16"  # dequantize the file's blocks, then quantize them to w4a8
    with rsgl.Engine(model, threads=threads, progress=False, disable_radix_cache=True, **options) as llm:
        params = {"temperature": 0, "max_new_tokens": 1}
        outs = llm.generate(input_ids=chunks, sampling_params=params, return_logprob=True, logprob_start_len=0)
    nll = []
    for out in outs:
        # The first token of a window has no log-probability (nothing before it).
        nll.extend(-lp for lp, _, _ in out["meta_info"]["input_token_logprobs"][1:])
    return nll


def llamacpp_nll(model: str, chunks: list[list[int]], threads: int) -> list[float]:
    import llama_cpp
    from llama_cpp._logger import set_verbose

    set_verbose(False)
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    # No extra buffer types: their AMX buffers die of SIGILL in VMs that report AMX without
    # enabling it (this project's Intel machine); the plain CPU kernels compute the same sums.
    params.use_extra_bufts = False
    lm = llama_cpp.llama_model_load_from_file(model.encode(), params)
    size = max(len(c) for c in chunks)
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = size, size, size
    cparams.n_threads = cparams.n_threads_batch = threads
    ctx = llama_cpp.llama_init_from_model(lm, cparams)
    vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(lm))
    batch = llama_cpp.llama_batch_init(size, 0, 1)
    nll = []
    for chunk in chunks:
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
        batch.n_tokens = len(chunk)
        for i, token in enumerate(chunk):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.seq_id[i][0], batch.logits[i] = token, i, 1, 0, True
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(ctx), shape=(len(chunk) * vocab,)).reshape(len(chunk), vocab).astype(np.float64)
        logits -= logits.max(axis=1, keepdims=True)
        log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        nll.extend(-log_probs[i, chunk[i + 1]] for i in range(len(chunk) - 1))
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(lm)
    return nll


def main() -> None:
    args = parse_args()
    from rsgl.loader import load_model
    from rsgl.loader.default_model import default_model_path

    model = str(args.model or default_model_path())
    tokenizer = load_model(model, progress=False).tokenizer
    ids = tokenizer.encode(args.text.read_text()).ids
    chunks = windows(ids, args.window)
    scored = sum(len(c) - 1 for c in chunks)
    print(f"{len(ids)} tokens, {len(chunks)} windows of up to {args.window}, {scored} scored", file=sys.stderr)
    results = {}
    label = f"rsgl ({args.rsgl_quantization}{', 16-bit activations' if args.activation_bits == 16 else ''})"
    results[label] = isolated(rsgl_nll, model, chunks, args.rsgl_quantization, args.activation_bits, args.threads)
    if not args.skip_llamacpp:
        results["llama.cpp"] = isolated(llamacpp_nll, model, chunks, args.threads)
    report = {"bench": "perplexity", "model": model, "text": str(args.text), "window": args.window, "scored_tokens": scored, "results": {}}
    for name, nll in results.items():
        assert len(nll) == scored, f"{name} scored {len(nll)} tokens, not {scored}"
        report["results"][name] = {"perplexity": math.exp(sum(nll) / len(nll)), "mean_nll": sum(nll) / len(nll)}
        print(f"{name:>24}: perplexity {report['results'][name]['perplexity']:.4f}")
    if "llama.cpp" in results:
        ratio = report["results"][label]["perplexity"] / report["results"]["llama.cpp"]["perplexity"]
        report["rsgl_over_llamacpp"] = ratio
        print(f"{'rsgl / llama.cpp':>24}: {ratio:.4f}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
