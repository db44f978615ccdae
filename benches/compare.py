"""rsgl, transformers (torch) and llama.cpp side by side on the default model (SmolLM2-135M) or
any model file, on the same threads, in one run, beside the memory read bandwidth that bounds
batch-1 decode, with each engine's load time and peak memory.

    python benches/compare.py [--threads 2] [--quick] [--skip-llamacpp] [--skip-transformers]
                              [--json bench-results/compare.json] [--plot bench-results/compare.png]
    python benches/compare.py --model PATH [--gguf PATH] [--w8a8] [--transformers] ...
                              [--prefill-tokens 2048] [--decode-contexts 1024,16384] [--llamacpp-kv q8_0]

--model PATH (a GGUF file or Hugging Face folder, e.g. one written by benches/synth_model.py):
rsgl loads PATH in bfloat16 (and, with --w8a8, quantized to W8A8 at load; a quantized GGUF
file also as it is, its 4-bit blocks on the W4A8 kernels); llama.cpp runs the same GGUF file as
it is (or --gguf PATH beside a folder); transformers only with
--transformers (it holds float32 copies: too large past 1B here).

Engines and weights: rsgl.Engine in bfloat16, float32 and W8A8 (int8 weights, lm_head included; KV
pages as rsgl keeps them by default: int8, float32 beside float32 and 4-bit weights); transformers (eager PyTorch, no
torch.compile, its default attention) in float32 and bfloat16; rsgl and llama.cpp on the
default model's own Q4_1 file as it is; llama.cpp (llama-cpp-python) on the model written as
F16 and Q8_0 GGUF too (cached in ~/.cache/rsgl-bench). All get the same random
token ids and run greedy with EOS ignored; each engine runs in a process of its own, so thread
pools and memory do not overlap. Every time is the best of --repeats, after a warm-up.
- decode b1: a 32-token prompt, 128 new tokens; tok/s over the time after the first token (the
  time of a run with one new token is subtracted).
- prefill 512 (--prefill-tokens): a 512-token prompt, one new token: 512 / time to first token.
- decode at N (with --decode-contexts N,...): batch-1 decode of 128 new tokens after an N-token
  prompt, timed from the first new token to the last (rsgl streams them; llama.cpp's loop is
  timed after its prompt): what a long conversation's replies cost, where attention reads N
  keys per layer. (Subtracting a one-token run, as decode b1 does, would leave the noise of a
  prefill of N tokens, seconds at 16k, in a decode of a few seconds.)
- 16 seqs: 16 different 32-token prompts at once, 128 new tokens each; aggregate tok/s after the
  first token. transformers: one generate call on the [16, 32] batch (equal lengths, no padding).
  llama.cpp: its low-level API, one llama_batch holding a token of each of the 16 sequences per
  step (kv_unified, n_seq_max=16, n_batch=512), argmax sampling in numpy.
- decode profile (rsgl rows, printed below the table): one more batch-1 decode with the engine's
  phase counters on (`rsgl._core.profile_steps`): per step, each phase's time, parallel regions,
  the stepping thread's wait at their ends and bytes read, the step's bytes against the probe,
  and the time a token costs beyond its step.
- bandwidth limit of decode b1: the bytes one token reads (every linear layer's weights and the
  lm_head, in the engine's weight type) at the read bandwidth of `rsgl-bench membw` (best GB/s,
  same thread count, a buffer in huge pages as rsgl keeps its weights: the faster probe here),
  probed right before and right after that engine's decode b1 runs; the higher probe counts.
  This host's bandwidth swings (46 and 79 GB/s a few seconds apart), so a probe taken minutes
  away says little about the moment a decode ran. A mixture-of-experts model reads the router
  and its active experts' share of the expert weights.
- load s: from the engine's constructor to ready (llama.cpp: model and context; it maps the
  file and reads pages as its first pass touches them), with the model's files read once just
  before, so each engine starts from a warm page cache; peak RSS: the largest resident memory of
  the engine's process over its whole run (KV cache included).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass
from functools import partial
from multiprocessing import get_context
from pathlib import Path

import numpy as np
from bench_report import machine_fields, write_json

CACHE = Path.home() / ".cache" / "rsgl-bench"
REPO = Path(__file__).resolve().parent.parent
LLAMA_CPP_INSTALL = 'CMAKE_ARGS="-DGGML_NATIVE=ON" pip install llama-cpp-python==0.3.36'
LLAMA_CPP_TYPES = ("F16", "Q8_0")
# Bits per weight rsgl packs a GGUF type into when it runs the file as it is (its 4-bit and
# 8-bit block kernels: an f16 scale per 32 inputs, and a minimum or a second scale; the 8-bit
# block kernels hold 5- and 6-bit quants in their own width); other types it packs in bfloat16.
RSGL_PACKED_BITS = {"Q4_0": 4.5, "Q4_1": 5.0, "Q4_K": 5.0, "Q5_0": 6.0, "Q6_K": 7.0, "Q8_0": 9.0, "MXFP4": 4.25}
# GGUF names of the tensors decode reads as matrices (the lm_head is added apart: tied models
# read token_embd instead of output).
GGUF_LINEAR = (
    "attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
    # Gated DeltaNet's projections (Qwen3.5, Qwen3-Next), and shared experts with their gate
    "attn_gate", "ssm_ba", "ssm_alpha", "ssm_beta", "ssm_out",
    "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp", "ffn_gate_inp_shexp",
)  # fmt: skip
# The first ids of the vocabulary are special tokens; prompts stay clear of them.
FIRST_PLAIN_TOKEN = 100

# Takes equal-length prompts (token-id lists) and a count of new tokens; generates, blocking.
Generate = Callable[[list[list[int]], int], None]
# Takes one prompt and a count of new tokens; generates, blocking; returns the seconds from the
# first new token to the last.
TimedDecode = Callable[[list[int], int], float]


@dataclass
class Workload:
    prompt_tokens: int
    new_tokens: int
    prefill_tokens: int
    sequences: int
    repeats: int
    membw_mb: int
    membw_reps: int
    decode_contexts: tuple[int, ...] = ()  # prompt lengths of the decode-at-context runs
    # llama.cpp takes prompts longer than this in pieces (its compute buffers grow with the batch)
    llama_cpp_max_batch: int = 2048
    llama_cpp_kv: str = "f16"  # its KV cache type: f16 (its default) or q8_0 (with flash attention on)


FULL = Workload(prompt_tokens=32, new_tokens=128, prefill_tokens=512, sequences=16, repeats=2, membw_mb=1024, membw_reps=10)
QUICK = Workload(prompt_tokens=16, new_tokens=16, prefill_tokens=64, sequences=4, repeats=1, membw_mb=256, membw_reps=3)


@dataclass
class Prompts:
    single: list[int]
    parallel: list[list[int]]
    long: list[int]
    contexts: list[list[int]]  # one prompt per decode context


@dataclass
class Row:
    engine: str
    weights: str  # the weight type, as the bandwidth limit counts it
    bytes_per_token: int
    decode_tok_s: float | None = None
    prefill_tok_s: float | None = None
    parallel_tok_s: float | None = None
    context_decode_tok_s: dict[int, float] | None = None  # decode b1 tok/s by prompt length
    bandwidth_gb_s: float | None = None  # the higher probe around this row's decode b1
    load_s: float | None = None
    peak_rss_gb: float | None = None
    info: dict | None = None  # what the engine reports about itself
    decode_profile: dict | None = None  # rsgl: a batch-1 decode's steps by phase (rsgl._core.decode_profile)
    error: str | None = None

    def limit_tok_s(self) -> float | None:
        return None if self.bandwidth_gb_s is None else self.bandwidth_gb_s * 1e9 / self.bytes_per_token


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="compute threads for every engine and the probe (default 2)")
    parser.add_argument("--quick", action="store_true", help="a fast smoke run: short prompts and outputs, 4 sequences")
    parser.add_argument("--skip-llamacpp", action="store_true", help="leave llama.cpp out")
    parser.add_argument("--skip-transformers", action="store_true", help="leave transformers out")
    parser.add_argument("--prefill-tokens", type=int, default=None, help="the prefill prompt's length (default 512)")
    parser.add_argument(
        "--decode-contexts", default=None, help="comma-separated prompt lengths to time batch-1 decode after (e.g. 1024,16384; one repeat each)"
    )
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per number; the best counts")
    parser.add_argument(
        "--llamacpp-kv", choices=("f16", "q8_0"), default="f16", help="llama.cpp's KV cache type (q8_0 turns its flash attention on; default f16, its own)"
    )
    parser.add_argument("--rsgl-bench", default=None, help="a built rsgl-bench binary for the bandwidth probe (default: cargo build --release this checkout)")
    parser.add_argument("--model", type=Path, default=None, help="a GGUF file or HF folder to compare on (default: rsgl's default model)")
    parser.add_argument("--gguf", type=Path, default=None, help="with a --model folder: the GGUF file llama.cpp runs")
    parser.add_argument("--w8a8", action="store_true", help="with --model: also rsgl W8A8 (quantized at load)")
    parser.add_argument("--as-stored-only", action="store_true", help="with a quantized --model GGUF: only rsgl and llama.cpp running it as it is")
    parser.add_argument("--transformers", action="store_true", help="with --model: also transformers (float32 and bfloat16)")
    parser.add_argument(
        "--activation-bits-16", action="store_true", help="with a quantized GGUF: also rsgl running it with 16-bit activations (activation_bits=16)"
    )
    parser.add_argument(
        "--llama-cpp-python",
        type=Path,
        default=None,
        help="a folder llama-cpp-python was installed into with pip --target (e.g. built without AMX or AVX-512), used instead of the installed one",
    )
    parser.add_argument("--json", default="bench-results/compare.json", help="where to write the results")
    parser.add_argument("--plot", default="bench-results/compare.png", help="where to draw the bar chart")
    return parser.parse_args()


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def require_llama_cpp() -> None:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        sys.exit(f"compare.py: llama-cpp-python is not installed; install it with\n  {LLAMA_CPP_INSTALL}\nor pass --skip-llamacpp")


# ---------------------------------------------------------------------------------------------
# Measuring: the same three numbers, the same way, for every engine
# ---------------------------------------------------------------------------------------------


def best_seconds(fn: Callable[[], None], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def decode_tok_s(generate: Generate, prompts: list[list[int]], work: Workload) -> float:
    """Tokens per second after the first token: a run to the first token is subtracted."""
    full = best_seconds(lambda: generate(prompts, work.new_tokens), work.repeats)
    first = best_seconds(lambda: generate(prompts, 1), work.repeats)
    return len(prompts) * (work.new_tokens - 1) / (full - first)


def measure(generate: Generate, timed_decode: TimedDecode | None, prompts: Prompts, work: Workload, probe: Callable[[], float]) -> dict:
    generate([prompts.long], 2)  # warm-up: thread pools, first-call allocations, lazy init
    generate(prompts.parallel, 2)
    prefill_seconds = best_seconds(lambda: generate([prompts.long], 1), work.repeats)
    before = probe()
    decode = decode_tok_s(generate, [prompts.single], work)
    after = probe()
    return {
        "decode_tok_s": decode,
        "bandwidth_gb_s": max(before, after),
        "bandwidth_probes_gb_s": [before, after],
        "prefill_tok_s": len(prompts.long) / prefill_seconds,
        "parallel_tok_s": decode_tok_s(generate, prompts.parallel, work),
        "context_decode_tok_s": {len(p): (work.new_tokens - 1) / timed_decode(p, work.new_tokens) for p in prompts.contexts} if timed_decode else {},
    }


def warm_page_cache(path: Path) -> None:
    """Reads a model's files once, so a load measures the engine, not the disk."""
    for file in [path] if path.is_file() else sorted(path.iterdir()):
        with file.open("rb") as stream:
            while stream.read(64 << 20):
                pass


def run_isolated(fn: Callable[..., dict], *args) -> dict:
    """Runs fn in a fresh process, so no engine shares threads or memory with another; adds the
    process's peak resident memory."""
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        return pool.submit(with_peak_rss, fn, *args).result()


def warm_then(path: Path, fn: Callable[..., dict], *args) -> dict:
    warm_page_cache(path)
    return run_isolated(fn, *args)


def with_peak_rss(fn: Callable[..., dict], *args) -> dict:
    result = fn(*args)
    return {**result, "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9}


# ---------------------------------------------------------------------------------------------
# The engines (each function runs in its own process)
# ---------------------------------------------------------------------------------------------


def measure_rsgl(
    model: str | None, dtype: str, threads: int, prompts: Prompts, work: Workload, probe: Probe, quantization: str | None = None, activation_bits: int = 8
) -> dict:
    import rsgl

    # No prefix cache: every run computes its whole prompt, as the other engines do. W8A8
    # quantizes the lm_head too, as llama.cpp's Q8_0 does the (tied) output matrix. KV pages as
    # each engine keeps them by default (rsgl: int8 beside 16-bit and int8 weights, float32 beside
    # float32 and 4-bit ones; llama.cpp: F16).
    precision = {"quantization": quantization, "quantize_lm_head": True} if quantization else {}
    started = time.perf_counter()
    with rsgl.Engine(
        model,
        dtype=dtype,
        threads=threads,
        activation_bits=activation_bits,
        disable_radix_cache=True,
        progress=False,
        **precision,
    ) as llm:
        load_s = time.perf_counter() - started

        def generate(batch: list[list[int]], new_tokens: int) -> None:
            params = {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}
            outs = llm.generate(input_ids=batch, sampling_params=params)
            assert all(o["meta_info"]["completion_tokens"] == new_tokens for o in outs)

        def timed_decode(prompt: list[int], new_tokens: int) -> float:
            params = {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}
            first = None
            for _ in llm.generate(input_ids=prompt, sampling_params=params, stream=True):
                first = first or time.perf_counter()
            return time.perf_counter() - first

        result = measure(generate, timed_decode, prompts, work, probe)
        result["decode_profile"] = profiled_decode(timed_decode, prompts.single, work.new_tokens)
        info = llm.get_server_info()
    kept = ("kernels", "int8_kernels", "threads", "dtype", "quantization", "activation_bits", "kv_cache_dtype")
    return {**result, "load_s": load_s, "info": {k: info[k] for k in kept if k in info}}


def profiled_decode(timed_decode: TimedDecode, prompt: list[int], new_tokens: int) -> dict:
    """One more batch-1 decode, streamed, its steps timed by phase (apart from the timed runs:
    the scopes cost a little), and its own time per token, first to last."""
    from rsgl import _core

    _core.profile_steps(True)
    seconds = timed_decode(prompt, new_tokens)
    _core.profile_steps(False)
    steps, phases = _core.decode_profile()
    return {"steps": steps, "phases": phases, "token_seconds": seconds / (new_tokens - 1)}


def measure_transformers(dtype: str, threads: int, model_path: str, prompts: Prompts, work: Workload, probe: Probe) -> dict:
    os.environ["TQDM_DISABLE"] = "1"  # transformers' GGUF conversion draws its own progress bar
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(threads)
    path = Path(model_path)
    started = time.perf_counter()
    source = {"pretrained_model_name_or_path": path.parent, "gguf_file": path.name} if path.is_file() else {"pretrained_model_name_or_path": path}
    model = AutoModelForCausalLM.from_pretrained(**source, dtype=getattr(torch, dtype)).eval()
    load_s = time.perf_counter() - started

    def generate(batch: list[list[int]], new_tokens: int) -> None:
        ids = torch.tensor(batch)  # equal lengths: no padding, no mask needed
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,  # EOS ignored
                do_sample=False,
                use_cache=True,
                pad_token_id=0,
            )
        assert out.shape[1] == ids.shape[1] + new_tokens

    result = measure(generate, None, prompts, work, probe)  # not timed at long contexts
    return {
        **result,
        "load_s": load_s,
        "info": {"torch": torch.__version__, "transformers": transformers.__version__, "attention": model.config._attn_implementation},
    }


class LlamaCppRunner:
    """Greedy generation for several equal-length sequences at once through llama.cpp's C API:
    one llama_batch per step, holding every sequence's next token under its own seq_id."""

    def __init__(self, gguf_path: str, threads: int, work: Workload, extra_buffer_types: bool):
        import llama_cpp
        from llama_cpp._logger import set_verbose

        set_verbose(False)
        self.lib = llama_cpp
        llama_cpp.llama_backend_init()
        model_params = llama_cpp.llama_model_default_params()
        model_params.use_extra_bufts = extra_buffer_types
        self.model = llama_cpp.llama_model_load_from_file(gguf_path.encode(), model_params)
        if not self.model:
            raise RuntimeError(f"llama.cpp cannot load {gguf_path}")
        self.vocab_size = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.model))
        longest = max([work.prefill_tokens, *work.decode_contexts])
        self.batch_capacity = min(max(work.prefill_tokens, work.sequences * work.prompt_tokens), work.llama_cpp_max_batch)
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = max(longest + work.new_tokens, work.sequences * (work.prompt_tokens + work.new_tokens))
        params.n_batch = params.n_ubatch = self.batch_capacity  # a whole prompt in one llama_decode
        params.n_seq_max = work.sequences
        params.kv_unified = True  # one KV buffer: the long prompt may use more than n_ctx / n_seq_max
        params.n_threads = params.n_threads_batch = threads
        if work.llama_cpp_kv == "q8_0":  # quantized V pages need its flash attention
            params.type_k = params.type_v = llama_cpp.GGML_TYPE_Q8_0
            params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        self.ctx = llama_cpp.llama_init_from_model(self.model, params)
        if not self.ctx:
            raise RuntimeError("llama.cpp cannot create its context")
        self.batch = llama_cpp.llama_batch_init(self.batch_capacity, 0, work.sequences)

    def generate(self, prompts: list[list[int]], new_tokens: int) -> float:
        """Returns the seconds from the first new token (the prompt's argmax) to the last."""
        self.lib.llama_memory_clear(self.lib.llama_get_memory(self.ctx), True)
        if len(prompts) == 1:  # a long prompt in pieces of the batch's capacity, as llama-server feeds one
            *pieces, last = [prompts[0][i : i + self.batch_capacity] for i in range(0, len(prompts[0]), self.batch_capacity)]
            for index, piece in enumerate(pieces):
                self._decode([piece], start=index * self.batch_capacity)
            tokens = self._decode([last], start=len(pieces) * self.batch_capacity)
        else:
            tokens = self._decode(prompts, start=0)
        first = time.perf_counter()
        for step in range(new_tokens - 1):
            tokens = self._decode([[t] for t in tokens], start=len(prompts[0]) + step)
        return time.perf_counter() - first

    def _decode(self, chunks: list[list[int]], start: int) -> list[int]:
        """Feeds chunks[s] to sequence s from position `start`; returns each one's argmax token."""
        b, i = self.batch, 0
        for seq, chunk in enumerate(chunks):
            for offset, token in enumerate(chunk):
                b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0] = token, start + offset, 1, seq
                b.logits[i] = offset == len(chunk) - 1  # only the last token's logits are needed
                i += 1
        b.n_tokens = i
        status = self.lib.llama_decode(self.ctx, b)
        if status != 0:
            raise RuntimeError(f"llama_decode returned {status}")
        logits = np.ctypeslib.as_array(self.lib.llama_get_logits(self.ctx), shape=(len(chunks), self.vocab_size))
        return logits.argmax(axis=1).tolist()

    def close(self) -> None:
        self.lib.llama_batch_free(self.batch)
        self.lib.llama_free(self.ctx)
        self.lib.llama_model_free(self.model)


def measure_llamacpp(gguf_path: str, threads: int, prompts: Prompts, work: Workload, probe: Probe, extra_buffer_types: bool = True) -> dict:
    import llama_cpp

    started = time.perf_counter()
    runner = LlamaCppRunner(gguf_path, threads, work, extra_buffer_types)
    load_s = time.perf_counter() - started
    try:
        result = measure(runner.generate, lambda prompt, new_tokens: runner.generate([prompt], new_tokens), prompts, work, probe)
    finally:
        runner.close()
    system_info = llama_cpp.llama_print_system_info().decode()
    info = {
        "llama_cpp_python": llama_cpp.__version__,
        "llama_cpp_path": str(Path(llama_cpp.__file__).parent),
        "system_info": system_info.strip(),
        "extra_buffer_types": extra_buffer_types,
        "kv_cache_type": work.llama_cpp_kv,
    }
    return {**result, "load_s": load_s, "info": info}


def measure_llamacpp_isolated(path: Path, threads: int, prompts: Prompts, work: Workload, probe: Probe) -> dict:
    """llama.cpp in a process of its own; if that process dies, once more without its extra buffer
    types. Its AMX buffers (chosen for quantized weights whenever the CPU reports AMX) die of
    SIGILL in VMs that report AMX without enabling it, as this project's Intel machine does."""
    try:
        return warm_then(path, measure_llamacpp, str(path), threads, prompts, work, probe)
    except BrokenProcessPool:
        log("  llama.cpp's process died; again without its extra buffer types (AMX, repacked weights)")
        return warm_then(path, measure_llamacpp, str(path), threads, prompts, work, probe, False)


# ---------------------------------------------------------------------------------------------
# Inputs: the bandwidth probe, the prompts, the GGUF files, the bytes a token reads
# ---------------------------------------------------------------------------------------------


@dataclass
class Probe:
    """`rsgl-bench membw` with the engines' thread count: memory read bandwidth, best GB/s.
    Called from the engines' processes, right around their decode b1."""

    binary: str
    threads: int
    size_mb: int
    reps: int

    def __call__(self) -> float:
        args = ["membw", "--threads", str(self.threads), "--size-mb", str(self.size_mb), "--reps", str(self.reps)]
        with tempfile.TemporaryDirectory() as scratch:
            out = Path(scratch) / "membw.json"
            subprocess.run([self.binary, *args, "--json", str(out)], check=True, stdout=subprocess.DEVNULL)
            return json.loads(out.read_text())["best_gb_s"]


def build_bench_binary(given: str | None) -> str:
    """The rsgl-bench binary: the one given, else built from this checkout."""
    if given:
        return given
    subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "rsgl-bench"], cwd=REPO, check=True)
    metadata = subprocess.run(["cargo", "metadata", "--format-version", "1", "--no-deps"], cwd=REPO, check=True, capture_output=True, text=True)
    return str(Path(json.loads(metadata.stdout)["target_directory"]) / "release" / "rsgl-bench")


def make_prompts(vocab_size: int, work: Workload) -> Prompts:
    """Random token ids: nothing is shared between prompts, so no engine can reuse work."""
    rng = np.random.default_rng(0)

    def ids(n: int) -> list[int]:
        return rng.integers(FIRST_PLAIN_TOKEN, vocab_size, size=n).tolist()

    return Prompts(
        single=ids(work.prompt_tokens),
        parallel=[ids(work.prompt_tokens) for _ in range(work.sequences)],
        long=ids(work.prefill_tokens),
        contexts=[ids(n) for n in work.decode_contexts],
    )


def linear_parameters(config: dict) -> int:
    """Weights of every linear layer a token goes through plus the lm_head: what decode reads for
    each token (of a mixture-of-experts layer: the router and the active experts)."""
    hidden, moe = config["hidden_size"], config["moe"]
    q_rows = config["num_attention_heads"] * config["head_dim"]
    kv_rows = config["num_key_value_heads"] * config["head_dim"]
    mlp = 3 * hidden * config["intermediate_size"]
    if moe:
        mlp = moe["experts_per_token"] * 3 * hidden * moe["expert_intermediate_size"] + moe["num_experts"] * hidden
    per_layer = hidden * (q_rows + 2 * kv_rows) + q_rows * hidden + mlp
    return config["num_hidden_layers"] * per_layer + config["vocab_size"] * hidden


def gguf_linear_bytes(path: Path, config: dict, packed_by_rsgl: bool = False, element_bytes: int | None = None) -> int:
    """The same weights as `linear_parameters`, in the bytes this GGUF file stores them in (or,
    with `packed_by_rsgl`, in what rsgl packs them into running the file as it is: the types it has
    integer kernels for as stored, the rest in bfloat16; or `element_bytes` per weight)."""
    from gguf import GGUFReader

    def size(t) -> int:
        if element_bytes:
            return int(t.n_elements) * element_bytes
        return int(t.n_elements * RSGL_PACKED_BITS.get(t.tensor_type.name, 16.0) / 8) if packed_by_rsgl else t.n_bytes

    tensors = {t.name: size(t) for t in GGUFReader(path).tensors}
    moe = config["moe"]
    active = moe["experts_per_token"] / moe["num_experts"] if moe else 1.0
    layers = 0.0
    for name, size in tensors.items():
        module = name.split(".")[2] if name.startswith("blk.") else ""
        if module in GGUF_LINEAR or module == "ffn_gate_inp":
            layers += size
        elif module.endswith("_exps"):
            layers += size * active
    return int(layers) + tensors.get("output.weight", tensors["token_embd.weight"])  # tied: token_embd is the lm_head


def write_f32_gguf(source: Path, out: Path) -> None:
    """A copy of `source` with every tensor dequantized to float32 and all its metadata: the input
    llama.cpp's own quantizer turns into F16 and Q8_0."""
    import gguf

    reader = gguf.GGUFReader(source)
    architecture = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    partial = out.with_suffix(".partial")
    writer = gguf.GGUFWriter(partial, architecture)
    for field in reader.fields.values():
        # The writer adds the architecture and the GGUF.* header fields itself; the file type changes.
        if field.name in (gguf.Keys.General.ARCHITECTURE, gguf.Keys.General.FILE_TYPE) or field.name.startswith("GGUF."):
            continue
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub_type)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.replace(out)


def llama_cpp_models(source: Path, threads: int) -> dict[str, Path]:
    """The default model as F16 and Q8_0 GGUF, made once (via a float32 copy) and cached."""
    import llama_cpp
    from llama_cpp._logger import set_verbose

    set_verbose(False)  # the quantizer logs every tensor
    CACHE.mkdir(parents=True, exist_ok=True)
    stem = source.name.split(".")[0]
    f32 = CACHE / f"{stem}.F32.gguf"
    if not f32.is_file():
        log(f"writing {f32} ...")
        write_f32_gguf(source, f32)
    models = {}
    for name in LLAMA_CPP_TYPES:
        models[name] = CACHE / f"{stem}.{name}.gguf"
        if not models[name].is_file():
            log(f"quantizing {models[name]} ...")
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{name}")
            params.nthread = threads
            partial = models[name].with_suffix(".partial")
            if llama_cpp.llama_model_quantize(str(f32).encode(), str(partial).encode(), ctypes.byref(params)) != 0:
                raise RuntimeError(f"llama.cpp could not write {models[name]}")
            partial.replace(models[name])
    return models


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


def plan(args: argparse.Namespace, model: Path, config: dict, prompts: Prompts, work: Workload) -> list[tuple[Row, Callable[[], dict]]]:
    """Every engine/weights pair to measure, with the call that measures it."""
    t, params = args.threads, linear_parameters(config)
    probe = Probe(build_bench_binary(args.rsgl_bench), t, work.membw_mb, work.membw_reps)
    given = str(args.model) if args.model else None
    rsgl_rows = [("bf16", "bfloat16", 2, None), ("f32", "float32", 4, None), ("w8a8", "bfloat16", 1, "w8a8_int8")]
    if args.model:  # float32 copies of real-size models do not fit here
        rsgl_rows = [row for row in rsgl_rows if (row[0] == "bf16" and not args.as_stored_only) or (row[0] == "w8a8" and args.w8a8)]
    if model.is_file():  # the file's own tensors: linear_parameters knows no hybrid or shared-expert layers

        def weight_bytes(size: int) -> int:
            return gguf_linear_bytes(model, config, element_bytes=size)
    else:

        def weight_bytes(size: int) -> int:
            return size * params

    runs = [
        (Row("rsgl", weights, weight_bytes(size)), partial(warm_then, model, measure_rsgl, given, dtype, t, prompts, work, probe, quantization))
        for weights, dtype, size, quantization in rsgl_rows
    ]
    file_type = gguf_file_type(model) if model.is_file() else None
    if file_type not in (None, "F16", "BF16", "ALL_F32"):
        # A quantized file, run as it is (dtype auto), as llama.cpp runs it.
        packed_bytes = gguf_linear_bytes(model, config, packed_by_rsgl=True)
        for bits in (8, 16) if args.activation_bits_16 else (8,):
            measure_one = partial(warm_then, model, measure_rsgl, str(model), "auto", t, prompts, work, probe, None, bits)
            runs.append((Row("rsgl", file_type if bits == 8 else f"{file_type} a16", packed_bytes), measure_one))
    if args.transformers if args.model else not args.skip_transformers:
        for dtype, weights, size in (("float32", "f32", 4), ("bfloat16", "bf16", 2)):
            measure_one = partial(warm_then, model, measure_transformers, dtype, t, str(model), prompts, work, probe)
            runs.append((Row("transformers", weights, weight_bytes(size)), measure_one))
    if not args.skip_llamacpp:
        for name, path in llama_cpp_files(args, model, t).items():
            measure_one = partial(measure_llamacpp_isolated, path, t, prompts, work, probe)
            runs.append((Row("llama.cpp", name, gguf_linear_bytes(path, config)), measure_one))
    return runs


def llama_cpp_files(args: argparse.Namespace, model: Path, threads: int) -> dict[str, Path]:
    """The GGUF files llama.cpp runs, by their weight type: the --model file (or --gguf) as it is,
    else the default model as F16 and Q8_0."""
    if not args.model:
        return {**llama_cpp_models(model, threads), gguf_file_type(model): model}
    gguf_file = args.gguf or (model if model.is_file() else None)
    if gguf_file is None:
        log("llama.cpp left out: the model is a folder and no --gguf file was given")
        return {}
    return {gguf_file_type(gguf_file): gguf_file}


def gguf_file_type(path: Path) -> str:
    """A GGUF file's type as llama.cpp names it (Q4_0, Q4_K_M, F16, ...), else the file's stem."""
    import gguf

    file_type = gguf.GGUFReader(path).get_field(gguf.Keys.General.FILE_TYPE)
    return gguf.LlamaFileType(file_type.contents()).name.removeprefix("MOSTLY_") if file_type else path.stem


def run_all(runs: list[tuple[Row, Callable[[], dict]]]) -> list[Row]:
    """Measures each row; one engine failing leaves its row marked and the others measured."""
    rows = []
    for row, measure_one in runs:
        log(f"measuring {row.engine} {row.weights} ...")
        try:
            result = measure_one()
        except Exception as error:  # any engine's failure: report it, go on with the others
            row.error = f"{type(error).__name__}: {error}"
            log(f"  failed: {row.error}")
        else:
            row.decode_tok_s, row.prefill_tok_s, row.parallel_tok_s = result["decode_tok_s"], result["prefill_tok_s"], result["parallel_tok_s"]
            row.context_decode_tok_s = result["context_decode_tok_s"]
            row.bandwidth_gb_s, row.info = result["bandwidth_gb_s"], result["info"]
            row.load_s, row.peak_rss_gb = result.get("load_s"), result["peak_rss_gb"]
            row.info["bandwidth_probes_gb_s"] = result["bandwidth_probes_gb_s"]
            row.decode_profile = result.get("decode_profile")
        rows.append(row)
    return rows


def headers(work: Workload) -> list[str]:
    return [
        "engine",
        "weights",
        "decode b1 tok/s",
        f"prefill {work.prefill_tokens} tok/s",
        f"{work.sequences} seqs tok/s",
        *[f"decode at {n} tok/s" for n in work.decode_contexts],
        "MB/token",
        "probe GB/s",
        "b1 limit tok/s",
        "% of limit",
        "load s",
        "peak RSS GB",
    ]


def table_rows(rows: list[Row], work: Workload) -> list[list[str]]:
    def cell(value: float | None) -> str:
        return "failed" if value is None else f"{value:.1f}"

    out = []
    for row in rows:
        limit = row.limit_tok_s()
        share = None if row.decode_tok_s is None or limit is None else 100 * row.decode_tok_s / limit
        out.append(
            [
                row.engine,
                row.weights,
                cell(row.decode_tok_s),
                cell(row.prefill_tok_s),
                cell(row.parallel_tok_s),
                *[cell((row.context_decode_tok_s or {}).get(n)) for n in work.decode_contexts],
                f"{row.bytes_per_token / 1e6:.0f}",
                cell(row.bandwidth_gb_s),
                cell(limit),
                cell(share),
                "-" if row.load_s is None else f"{row.load_s:.2f}",
                "-" if row.peak_rss_gb is None else f"{row.peak_rss_gb:.2f}",
            ]
        )
    return out


def print_table(columns: list[str], cells: list[list[str]]) -> None:
    widths = [max(len(r[c]) for r in [columns, *cells]) for c in range(len(columns))]
    for row in [columns, ["-" * w for w in widths], *cells]:
        print("  ".join(cell.rjust(w) for cell, w in zip(row, widths)))


def print_decode_profile(row: Row) -> None:
    """Where an rsgl row's batch-1 decode step goes, phase by phase, and how far it is from its
    bandwidth limit: bytes read per step (packed weights, KV pages) over the probe's GB/s, against
    the step's time; "between steps" is what a token costs beyond its step in the same run (the
    Python side taking outputs, the engine loop waiting for work)."""
    profile = row.decode_profile
    if not profile or not profile["steps"]:
        return
    steps, phases = profile["steps"], [p for p in profile["phases"] if p["seconds"] > 0]
    step = {key: sum(p[key] for p in phases) for key in ("seconds", "regions", "wait_seconds", "bytes")}

    def cells(name: str, p: dict) -> list[str]:
        gb_s = f"{p['bytes'] / p['seconds'] / 1e9:.1f}" if p["bytes"] else ""
        return [
            name,
            f"{p['seconds'] / steps * 1e3:.3f}",
            f"{100 * p['seconds'] / step['seconds']:.1f}%",
            f"{p['regions'] / steps:.1f}",
            f"{p['wait_seconds'] / steps * 1e3:.3f}",
            f"{p['bytes'] / steps / 1e6:.2f}",
            gb_s,
        ]

    step_ms, token_ms = step["seconds"] / steps * 1e3, profile["token_seconds"] * 1e3
    print(f"\nrsgl {row.weights}, batch-1 decode profiled: {steps} steps of {step_ms:.3f} ms, a token every {token_ms:.3f} ms")
    body = [cells(p["phase"], p) for p in phases] + [cells("step", step)]
    print_table(["phase", "ms/step", "share", "regions/step", "wait ms/step", "MB/step", "GB/s"], body)
    print(f"between steps: {token_ms - step_ms:.3f} ms per token")
    if row.bandwidth_gb_s:
        floor_ms = step["bytes"] / steps / (row.bandwidth_gb_s * 1e9) * 1e3
        print(f"at {row.bandwidth_gb_s:.1f} GB/s the step's bytes take {floor_ms:.3f} ms: {100 * floor_ms / step_ms:.0f}% of the limit per step")


def plot(path: str, model: str, rows: list[Row], work: Workload, threads: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r.engine} {r.weights}" for r in rows]
    panels = [
        ("decode, batch 1", [r.decode_tok_s for r in rows]),
        (f"prefill, {work.prefill_tokens} tokens", [r.prefill_tok_s for r in rows]),
        (f"decode, {work.sequences} sequences (aggregate)", [r.parallel_tok_s for r in rows]),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(15, 0.5 * len(rows) + 2), sharey=True)
    y = np.arange(len(rows))
    for ax, (title, values) in zip(axes, panels):
        measured = [v or 0.0 for v in values]
        if ax is axes[0]:  # batch-1 decode has a ceiling: the bandwidth over the bytes per token
            ax.barh(y, [r.limit_tok_s() or 0.0 for r in rows], color="0.88", label="bandwidth limit (probe around each decode)")
            ax.legend(loc="lower right", fontsize=8)
        bars = ax.barh(y, measured, color=[f"C{['rsgl', 'transformers', 'llama.cpp'].index(r.engine)}" for r in rows])
        ax.bar_label(bars, labels=[f"{v:.0f}" if v else "failed" for v in values], padding=3, fontsize=8)
        ax.margins(x=0.12)  # room for the value labels
        ax.set_title(title)
        ax.set_xlabel("tokens/s")
    axes[0].set_yticks(y, labels)
    axes[0].invert_yaxis()
    fig.suptitle(f"{model}, {threads} threads, one run")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main() -> None:
    args = parse_args()
    if args.llama_cpp_python:
        # Spawned engine processes inherit sys.path.
        sys.path.insert(0, str(args.llama_cpp_python.resolve()))
    if not args.skip_llamacpp:
        require_llama_cpp()
    work = QUICK if args.quick else FULL
    if args.repeats:
        work.repeats = args.repeats
    if args.prefill_tokens:
        work.prefill_tokens = args.prefill_tokens
    if args.decode_contexts:
        work.decode_contexts = tuple(int(n) for n in args.decode_contexts.split(","))
    work.llama_cpp_kv = args.llamacpp_kv
    from rsgl.loader import load_model
    from rsgl.loader.default_model import default_model_path

    model = args.model or Path(default_model_path())
    config = load_model(model, skip_tokenizer_init=True, progress=False).config.fields
    prompts = make_prompts(config["vocab_size"], work)
    rows = run_all(plan(args, model, config, prompts, work))

    print_table(headers(work), table_rows(rows, work))
    for row in rows:
        print_decode_profile(row)
    kernels = next((r.info.get("kernels") for r in rows if r.engine == "rsgl" and r.info), None)
    report = {
        "bench": "compare",
        "model": str(model),
        **machine_fields(args.threads, kernels),
        "workload": asdict(work),
        "results": [{**asdict(r), "limit_tok_s": r.limit_tok_s()} for r in rows],
    }
    write_json(args.json, report)
    plot(args.plot, model.name.split(".")[0], rows, work, args.threads)
    if any(r.error for r in rows):
        sys.exit("compare.py: some engines failed; see their errors above")


if __name__ == "__main__":
    main()
