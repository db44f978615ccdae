"""Serving many LoRA adapters at once: rsgl's server against llama.cpp's llama-server on the same base
GGUF file and the same GGUF LoRA files, with concurrent requests spread over the adapters, beside
the same requests on the base model alone.

    python benches/lora_throughput.py [--shape llama-1b] [--format gguf-q8_0] [--adapters 8] [--rank 16]
        [--requests 16] [--prompt-tokens 32] [--new-tokens 128] [--runs 3] [--threads 2]
        [--llama-cpp-bin DIR] [--skip-llama-cpp] [--json bench-results/lora_throughput.json]

Model: benches/synth_model.py's random weights at a real shape (Llama-3.2-1B by default), its
safetensors folder (which llama.cpp's LoRA converter reads the base config from) and its GGUF file
in --format, written on first use into ~/.cache/rsgl-bench/synth. Adapters: --adapters PEFT folders
of rank --rank on q/k/v/o/gate/up/down of every layer (alpha 2 x rank, random A and B of std 0.02,
float32), each converted by llama.cpp's convert_lora_to_gguf.py to an F16 GGUF LoRA file; both
servers read those files.

Servers, each a process of its own, loaded once and idle while the other runs:
- rsgl: `python -m rsgl.server --model-path FILE --lora-paths a0=a0.gguf ...` (max_loras_per_batch
  as --adapters, so every adapter runs in one batch).
- llama-server: `-m FILE --lora a0.gguf ... --lora-init-without-apply -np --requests -c
  (--requests x a slot's context)`; a request picks its adapter with `"lora": [{"id": i, "scale":
  1}]`. llama.cpp's server does not batch requests whose adapters differ (its README says so).

Workload: --requests prompts of --prompt-tokens random token ids (the same for every engine and
run), sent at once from as many client threads, greedy, --new-tokens each with EOS ignored, no
prompt caching (rsgl's cache is flushed before each run; llama.cpp's `cache_prompt` is off). "lora":
request i uses adapter i mod --adapters; "base": no adapter. Output throughput: all new tokens /
wall time from the first request sent to the last answer. The runs alternate between engines and
workloads; the best run of each counts, and every run is kept in the JSON with the load average.
This is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from bench_report import machine_fields, write_json  # noqa: E402
from gguf_convert import convert_lora  # noqa: E402
from server_process import LLAMA_CPP_BIN, LLAMA_CPP_BUILD, ServerProcess  # noqa: E402
from synth_model import CACHE, output_path  # noqa: E402

TARGETS = {"self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"), "mlp": ("gate_proj", "up_proj", "down_proj")}
FIRST_PLAIN_TOKEN = 100  # random prompts avoid the special tokens at the start of the vocabulary
SLOT_MARGIN_TOKENS = 64
# The adapters, and a link to the base model: a folder without the projector files beside the synthetic
# models, which rsgl would otherwise consider for the base GGUF file (and refuse, being several).
ADAPTERS = CACHE / "lora"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="llama-1b", help="a benches/synth_model.py shape of a dense model")
    parser.add_argument("--format", default="gguf-q8_0", help="the base GGUF file's format (synth_model.py --format)")
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--llama-cpp-bin", type=Path, default=LLAMA_CPP_BIN, help="the folder of llama-server")
    parser.add_argument("--skip-llama-cpp", action="store_true")
    parser.add_argument("--json", default="bench-results/lora_throughput.json")
    return parser.parse_args()


def model_files(shape: str, gguf_format: str) -> tuple[Path, Path]:
    """The synthetic model's safetensors folder and GGUF file, written if missing."""
    files = []
    for kind in ("safetensors-bf16", gguf_format):
        path = output_path(shape, kind, None)
        if not path.exists():
            subprocess.run([sys.executable, str(Path(__file__).with_name("synth_model.py")), "--shape", shape, "--format", kind], check=True)
        files.append(path)
    return files[0], files[1]


def write_adapter(folder: Path, config: dict[str, Any], rank: int, seed: int) -> None:
    """A PEFT LoRA folder for the Llama-layout checkpoint `config` describes, random A and B."""
    hidden, ffn, head_dim = config["hidden_size"], config["intermediate_size"], config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    shapes = {"q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv), "o_proj": (q, hidden),
              "gate_proj": (hidden, ffn), "up_proj": (hidden, ffn), "down_proj": (ffn, hidden)}  # fmt: skip
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for block, projections in TARGETS.items():
            for projection in projections:
                fan_in, fan_out = shapes[projection]
                prefix = f"base_model.model.model.layers.{layer}.{block}.{projection}"
                tensors[f"{prefix}.lora_A.weight"] = rng.normal(0, 0.02, (rank, fan_in)).astype(np.float32)
                tensors[f"{prefix}.lora_B.weight"] = rng.normal(0, 0.02, (fan_out, rank)).astype(np.float32)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    adapter_config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank, "use_rslora": False, "use_dora": False,
        "bias": "none", "fan_in_fan_out": False, "target_modules": [p for ps in TARGETS.values() for p in ps],
    }  # fmt: skip
    (folder / "adapter_config.json").write_text(json.dumps(adapter_config, indent=1))


def adapter_files(base_folder: Path, shape: str, count: int, rank: int) -> list[Path]:
    """`count` GGUF LoRA files (F16) for the shape's model, written (through PEFT folders) if missing."""
    config = json.loads((base_folder / "config.json").read_text())
    files = []
    for index in range(count):
        out = ADAPTERS / f"{shape}-lora-r{rank}-{index}.gguf"
        if not out.exists():
            peft_folder = ADAPTERS / f"{shape}-lora-r{rank}-{index}"
            write_adapter(peft_folder, config, rank, seed=index)
            convert_lora(peft_folder, base_folder, out.with_suffix(".partial"), outtype="f16").replace(out)
        files.append(out)
    return files


def post(url: str, body: dict) -> bytes:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=3600) as response:
        return bytes(response.read())


def rsgl_request(server: ServerProcess, prompt: list[int], adapter: int | None, new_tokens: int, logprob: bool = False) -> list[float]:
    """Per new token its log-probability (with `logprob`), else 0."""
    body: dict[str, Any] = {
        "input_ids": prompt,
        "sampling_params": {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True},
        "return_logprob": logprob,
    }
    if adapter is not None:
        body["lora_path"] = f"a{adapter}"
    meta = json.loads(post(f"{server.url}/generate", body))["meta_info"]
    return [entry[0] for entry in meta["output_token_logprobs"]] if logprob else [0.0] * meta["completion_tokens"]


def llama_request(server: ServerProcess, prompt: list[int], adapter: int | None, new_tokens: int, logprob: bool = False) -> list[float]:
    body = {
        "prompt": prompt, "n_predict": new_tokens, "temperature": 0.0, "ignore_eos": True, "cache_prompt": False, "n_probs": int(logprob),
        "lora": [] if adapter is None else [{"id": adapter, "scale": 1.0}],
    }  # fmt: skip
    answer = json.loads(post(f"{server.url}/completion", body))
    return [entry["logprob"] for entry in answer["completion_probabilities"]] if logprob else [0.0] * answer["tokens_predicted"]


def answers(
    send: Any, server: ServerProcess, prompts: list[list[int]], adapters: list[int | None], new_tokens: int, logprob: bool = False
) -> list[list[float]]:
    with ThreadPoolExecutor(max_workers=len(prompts)) as clients:
        return list(clients.map(lambda job: send(server, job[0], job[1], new_tokens, logprob), zip(prompts, adapters)))


def timed_run(send: Any, server: ServerProcess, prompts: list[list[int]], adapters: list[int | None], new_tokens: int) -> dict:
    started = time.perf_counter()
    tokens = [len(answer) for answer in answers(send, server, prompts, adapters, new_tokens)]
    seconds = time.perf_counter() - started
    if any(count != new_tokens for count in tokens):
        raise RuntimeError(f"{server.name} answered {tokens} tokens, not {new_tokens} each")
    return {"seconds": seconds, "output_tok_s": sum(tokens) / seconds, "load_average_1min": os.getloadavg()[0]}


def check_adapters_apply(name: str, send: Any, server: ServerProcess, prompt: list[int], adapters: int) -> None:
    """Warms the server up with every adapter, and checks that each changes the answer's log-probabilities
    (the random models' greedy tokens hardly change): a server that ignored them would measure the base model."""
    base = answers(send, server, [prompt], [None], 8, logprob=True)[0]
    changed = [answer != base for answer in answers(send, server, [prompt] * adapters, list(range(adapters)), 8, logprob=True)]
    if not all(changed):
        raise RuntimeError(f"{name}: adapters {[i for i, c in enumerate(changed) if not c]} give the base model's answer")


def main() -> None:
    args = parse_args()
    with_llama_cpp = not args.skip_llama_cpp
    if with_llama_cpp and not (args.llama_cpp_bin / "llama-server").exists():
        raise SystemExit(LLAMA_CPP_BUILD.format(bin=args.llama_cpp_bin))
    folder, synthetic = model_files(args.shape, args.format)
    model = ADAPTERS / synthetic.name
    if not model.exists():
        ADAPTERS.mkdir(parents=True, exist_ok=True)
        model.symlink_to(synthetic)
    loras = adapter_files(folder, args.shape, args.adapters, args.rank)
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    rng = np.random.default_rng(0)
    prompts = [rng.integers(FIRST_PLAIN_TOKEN, vocab, args.prompt_tokens).tolist() for _ in range(args.requests)]
    workloads: dict[str, list[int | None]] = {"base": [None] * args.requests, "lora": [i % args.adapters for i in range(args.requests)]}

    servers: dict[str, tuple[ServerProcess, Any]] = {}
    load_average = {"start": os.getloadavg()}
    try:
        lora_paths = [f"a{i}={path}" for i, path in enumerate(loras)]
        servers["rsgl"] = (ServerProcess.rsgl(model, args.threads, "--lora-paths", *lora_paths, "--max-loras-per-batch", str(args.adapters)), rsgl_request)
        if with_llama_cpp:
            slot_tokens = args.prompt_tokens + args.new_tokens + SLOT_MARGIN_TOKENS
            arguments = ["-np", str(args.requests), "-c", str(args.requests * slot_tokens), "--lora-init-without-apply"]
            servers["llama.cpp"] = (
                ServerProcess.llama_server(args.llama_cpp_bin, model, args.threads, *arguments, *(a for p in loras for a in ("--lora", str(p)))),
                llama_request,
            )
        for name, (server, send) in servers.items():
            check_adapters_apply(name, send, server, prompts[0], args.adapters)
            print(f"{name}: loaded in {server.load_seconds:.1f} s", flush=True)
        runs: dict[str, dict[str, list[dict]]] = {name: {workload: [] for workload in workloads} for name in servers}
        for run in range(args.runs):
            order = [(name, workload) for name in servers for workload in workloads]
            for name, workload in order if run % 2 == 0 else reversed(order):
                server, send = servers[name]
                if name == "rsgl":
                    post(f"{server.url}/flush_cache", {})
                runs[name][workload].append(timed_run(send, server, prompts, workloads[workload], args.new_tokens))
                print(f"run {run + 1}: {name} {workload}: {runs[name][workload][-1]['output_tok_s']:.1f} tok/s", flush=True)
        results = {
            name: {
                "load_seconds": server.load_seconds, "peak_rss_mb": server.peak_rss_mb(),
                **{workload: {"output_tok_s": max(r["output_tok_s"] for r in runs[name][workload]), "runs": runs[name][workload]} for workload in workloads},
            }
            for name, (server, _) in servers.items()
        }  # fmt: skip
    finally:
        for server, _ in servers.values():
            server.stop()
    load_average["end"] = os.getloadavg()

    import rsgl._core

    print(f"\n{args.shape} {args.format}, {args.adapters} adapters of rank {args.rank} on q/k/v/o/gate/up/down, {args.requests} requests at once,")
    print(
        f"{args.prompt_tokens} prompt + {args.new_tokens} new tokens each, {args.threads} threads, rsgl kernels {rsgl._core.kernel_isa()}, best of {args.runs}"
    )
    print(f"{'engine':<12} {'base tok/s':>10} {'lora tok/s':>10} {'lora/base':>9} {'load s':>7} {'peak RSS MB':>11}")
    for name, result in results.items():
        base, lora = result["base"]["output_tok_s"], result["lora"]["output_tok_s"]
        print(f"{name:<12} {base:>10.1f} {lora:>10.1f} {lora / base:>9.2f} {result['load_seconds']:>7.1f} {result['peak_rss_mb']:>11.0f}")
    if "llama.cpp" in results:
        print(f"rsgl / llama.cpp with adapters: {results['rsgl']['lora']['output_tok_s'] / results['llama.cpp']['lora']['output_tok_s']:.2f}x")
    write_json(
        args.json,
        {
            **machine_fields(args.threads, rsgl._core.kernel_isa()), "shape": args.shape, "format": args.format, "model": str(model),
            "adapters": [str(p) for p in loras], "rank": args.rank, "requests": args.requests, "prompt_tokens": args.prompt_tokens,
            "new_tokens": args.new_tokens, "load_average": load_average, "results": results,
        },
    )  # fmt: skip


if __name__ == "__main__":
    main()
