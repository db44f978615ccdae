"""Time to first token for one image and a question: rsgl against llama.cpp on a random-weight SmolVLM-256M (or
Qwen2.5-VL-3B).

    python benches/vision_ttft.py [--model smolvlm-256m|qwen2.5-vl-3b] [--runs 3] [--threads 2] [--gguf-type bf16|f16]
        [--rsgl-files gguf|folder] [--llama-cpp-bin DIR] [--skip-llama-cpp] [--skip-mtmd-cli] [--perf]
        [--out bench-results/vision_ttft.json]

The model: SmolVLM-256M-Instruct's shapes with random weights (std 0.02), built with transformers' own classes and
cached as ~/.cache/rsgl-bench/synth/smolvlm-256m-safetensors-bf16 (config.json model_type "idefics3", as the real
folder says): the text model is SmolLM2-135M (hidden 576, 30 layers, 9 heads / 3 kv heads of 64, ffn 1536, rope
base 100000) with 49,280 tokens and its own lm_head; the vision tower SigLIP base at 512 pixels (hidden 768, 12 layers, 12
heads, ffn 3072, patches of 16); scale_factor 4, so a tile's 1024 patches become 64 tokens; the image processor as
SmolVLM-256M's (longest edge 2048, tiles of 512, LANCZOS, mean = std = 0.5, image_seq_len 64). The tokenizer is the
default model's (SmolLM2's, which SmolVLM's extends) with SmolVLM's special tokens added; the chat template is
SmolVLM's. llama.cpp's converter (tests/gguf_convert.py) makes the text GGUF and the projector GGUF (--mmproj) of
it, both in --gguf-type.

The request: one 448 x 448 picture (PNG bytes, drawn from a seed; every timed request has a picture of its own, so no
engine's image cache hits) and a 32-token question, as SmolVLM's template renders one user turn, greedy, one new
token. A 448-pixel square is scaled to 2048 and cut into 4 x 4 tiles of 512 plus the whole image as a 17th tile:
17 x 64 = 1088 image tokens in both engines.

--model qwen2.5-vl-3b: Qwen2.5-VL-3B-Instruct's shapes (the text model: hidden 2048, 36 layers, 16 heads / 2 kv heads,
ffn 11008, 151,936 tokens, tied embeddings, M-RoPE; the 32-block vision tower of hidden 1280 with windows of 112 pixels)
with transformers' own random initialization, the default model's tokenizer plus Qwen's vision tokens, Qwen2-VL's
image processor: the 448-pixel square is 32 x 32 patches of 14, 256 image tokens. Both engines read the GGUF files
llama.cpp's converter makes of that folder (rsgl the folder itself with --rsgl-files folder).

- rsgl: an Engine(text GGUF, mmproj=projector GGUF, dtype="bfloat16"), the files llama.cpp reads (--rsgl-files
  folder: the Hugging Face folder they came from), in a process of its own; TTFT is the wall time of `generate(prompt,
  image_data=[png bytes])`, image decoding and tiling included. After the runs, the same process splits a request's
  time: the image preparation alone (decode, tile, hash: rsgl.vision's PromptImages.prepare), a text-only prefill of
  as many tokens as the image prompt (random token ids), and the rest, which is the vision tower's (its encoder
  runs inside the first prefill step).
- llama.cpp: llama-server (-t threads, its defaults otherwise) on loopback, a process of its own; TTFT is the wall
  time of a /completion request ({"prompt_string", "multimodal_data": [base64 PNG]}, n_predict 1, cache_prompt
  false), which includes decoding and slicing the image, the projector and the prefill; the server's own
  timings.prompt_ms is reported beside it. Then one llama-mtmd-cli run (-n 1, OMP_WAIT_POLICY=passive, see
  mtmd_cli_run) whose log gives the image chunks it encoded (64 tokens each) and their encoding time.
- --perf: one more request of each engine under `perf record`, its self time by symbol (where the time goes).

Each engine has a warm-up request with a picture of its own first; then the timed requests alternate between the
engines (each engine's process stays loaded, idle while the other runs). TTFT is the best of --runs; every run is
kept in the JSON. Peak RSS: rsgl's process's (getrusage), llama-server's VmHWM. Load: Engine() construction, and
llama-server's start until /health answers.

llama.cpp is built from the llama.cpp that llama-cpp-python's source distribution vendors (see LLAMA_CPP_BUILD).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_report import machine_fields, write_json  # noqa: E402
from server_process import LLAMA_CPP_BIN, LLAMA_CPP_BUILD, ServerProcess  # noqa: E402
from synth_model import CACHE, convert_with_llama_cpp  # noqa: E402

IMAGE_SIDE = 448
QUESTION_TOKENS = 32
WARM_UP_SEED = 1000

# SmolVLM-256M-Instruct's shapes. Its lm_head is its own (256M parameters = 228M + 49280 x 576). Its text_config
# names the class "VLlama3ForCausalLM" (Hugging Face's training code's), which rsgl does not know: "LlamaForCausalLM"
# here, which llama.cpp's converter takes alike (it needs a class there to convert the language model).
TEXT_CONFIG = dict(
    model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
    num_attention_heads=9, num_key_value_heads=3, head_dim=64, rms_norm_eps=1e-5, rope_theta=100000.0, max_position_embeddings=8192,
    tie_word_embeddings=False, vocab_size=49280,
)  # fmt: skip
VISION_CONFIG = dict(
    model_type="idefics3_vision", hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
    image_size=512, patch_size=16, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6,
)  # fmt: skip
SCALE_FACTOR = 4
IMAGE_SEQ_LEN = (VISION_CONFIG["image_size"] // VISION_CONFIG["patch_size"]) ** 2 // SCALE_FACTOR**2
LONGEST_EDGE = 2048
# SmolVLM's special tokens (<|im_start|> is SmolLM2's already).
VISION_TOKENS = (
    "<fake_token_around_image>",
    "<image>",
    "<global-img>",
    *(f"<row_{row}_col_{col}>" for row in range(1, 7) for col in range(1, 7)),
    "<end_of_utterance>",
)
QUESTION_TEXT = (
    "Look at this picture carefully and describe every object you can see, its colour, its position in the frame,"
    " and what the whole scene might mean to someone who took it on a summer afternoon walk."
)


# ---- the model -------------------------------------------------------------------------------------------------


def write_default_tokenizer(partial: Path, special_tokens: tuple[str, ...], eos_token: str) -> Any:
    """The default model's tokenizer (SmolLM2's) with `special_tokens` added, saved to `partial` with a tokenizer
    config ending turns with `eos_token`; returns the `tokenizers.Tokenizer`."""
    import tokenizers
    from rsgl.loader import load_model

    default = load_model(None, progress=False)
    if default.tokenizer is None:
        raise RuntimeError("the default model loaded without its tokenizer")
    tokenizer = tokenizers.Tokenizer.from_str(default.tokenizer.to_str())
    tokenizer.add_special_tokens(list(special_tokens))
    partial.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(partial / "tokenizer.json"))
    tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos_token, "pad_token": "<|im_end|>", "add_bos_token": False}
    (partial / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return tokenizer


def write_smolvlm_folder(folder: Path) -> None:
    """SmolVLM-256M-Instruct's layout with random weights, written by transformers (save_pretrained), with the
    default model's tokenizer plus SmolVLM's special tokens, SmolVLM's image processor and chat template."""
    import torch
    import transformers
    from transformers.models.smolvlm.processing_smolvlm import DEFAULT_CHAT_TEMPLATE

    partial = folder.with_name(folder.name + ".partial")
    tokenizer = write_default_tokenizer(partial, VISION_TOKENS, "<end_of_utterance>")
    config = transformers.Idefics3Config(
        text_config=TEXT_CONFIG,
        vision_config=VISION_CONFIG,
        scale_factor=SCALE_FACTOR,
        image_token_id=tokenizer.token_to_id("<image>"),
        tie_word_embeddings=False,
        architectures=["Idefics3ForConditionalGeneration"],
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForImageTextToText.from_config(config, dtype=torch.bfloat16)
    with torch.no_grad():  # std 0.02 everywhere but the norms, which stay ones and zeros
        for name, parameter in model.named_parameters():
            if "norm" not in name:
                parameter.normal_(0.0, 0.02)
    model.save_pretrained(partial)
    image_processor = transformers.SmolVLMImageProcessorPil(
        size={"longest_edge": LONGEST_EDGE},
        max_image_size={"longest_edge": VISION_CONFIG["image_size"]},
        resample=Image.Resampling.LANCZOS,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    processor = transformers.Idefics3Processor(
        image_processor=image_processor,
        tokenizer=transformers.AutoTokenizer.from_pretrained(partial),
        image_seq_len=IMAGE_SEQ_LEN,
        chat_template=DEFAULT_CHAT_TEMPLATE,
    )
    processor.save_pretrained(partial)
    partial.replace(folder)


# Qwen2.5-VL-3B-Instruct's shapes: the text model (tied embeddings, M-RoPE sections 16 + 24 + 24) and the 32-block
# vision tower (windows of 112 pixels, full attention in blocks 7, 15, 23, 31), as its config.json has them.
QWEN_TEXT_CONFIG = dict(
    hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2, rms_norm_eps=1e-6,
    max_position_embeddings=128000, vocab_size=151936, tie_word_embeddings=True,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]},
)  # fmt: skip
QWEN_VISION_CONFIG = dict(
    depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048, patch_size=14, spatial_merge_size=2,
    temporal_patch_size=2, window_size=112, fullatt_block_indexes=[7, 15, 23, 31], hidden_act="silu",
)  # fmt: skip
QWEN_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")


def write_qwen2_5_vl_folder(folder: Path) -> None:
    """Qwen2.5-VL-3B-Instruct's layout with random weights (transformers' own initialization, std 0.02), written by
    transformers, with the default model's tokenizer plus Qwen's vision tokens and Qwen2-VL's image processor (its
    default pixel bounds, as the real folder's)."""
    import torch
    import transformers

    partial = folder.with_name(folder.name + ".partial")
    tokenizer = write_default_tokenizer(partial, QWEN_TOKENS, "<|im_end|>")
    ids = {token: tokenizer.token_to_id(token) for token in QWEN_TOKENS}
    config = transformers.Qwen2_5_VLConfig(
        text_config={**QWEN_TEXT_CONFIG, "eos_token_id": tokenizer.token_to_id("<|im_end|>")},
        vision_config=QWEN_VISION_CONFIG,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
        architectures=["Qwen2_5_VLForConditionalGeneration"],
    )
    torch.manual_seed(0)
    transformers.AutoModelForImageTextToText.from_config(config, dtype=torch.bfloat16).save_pretrained(partial)
    transformers.Qwen2VLImageProcessorPil().save_pretrained(partial)
    partial.replace(folder)


def qwen_prompt(folder: Path) -> str:
    """One user turn (the image, then the question) as Qwen2.5-VL's chat template writes it."""
    import tokenizers

    text = question(tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json")))
    return f"<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>{text}<|im_end|>\n<|im_start|>assistant\n"


@dataclass(frozen=True)
class BenchModel:
    """A vision-language model the bench runs: how its folder is written, its prompt for one image and a question,
    the text of an image in that prompt (which llama-server's media marker replaces) and the token it is written out
    as."""

    name: str
    write_folder: Callable[[Path], None]
    prompt: Callable[[Path], str]
    image_text: str
    image_token: str


def model_files(model: BenchModel, gguf_type: str) -> tuple[Path, Path, Path]:
    """The safetensors folder and llama.cpp's text and projector GGUF files of it, written if missing."""
    folder = CACHE / f"{model.name}-safetensors-bf16"
    if not folder.exists():
        print(f"writing {folder}", flush=True)
        model.write_folder(folder)
    text = CACHE / f"{model.name}-gguf-{gguf_type}.gguf"
    projector = CACHE / f"{model.name}-mmproj-{gguf_type}.gguf"
    for path, options in ((text, ()), (projector, ("--mmproj",))):
        if not path.exists():
            print(f"converting {folder.name} to {path}", flush=True)
            convert_with_llama_cpp(folder, path, gguf_type, options=options)
    return folder, text, projector


MODELS = {
    "smolvlm-256m": BenchModel("smolvlm-256m", write_smolvlm_folder, lambda folder: rendered_prompt(folder), "<image>", "<image>"),
    "qwen2.5-vl-3b": BenchModel("qwen2.5-vl-3b", write_qwen2_5_vl_folder, qwen_prompt, "<|vision_start|><|image_pad|><|vision_end|>", "<|image_pad|>"),
}


# ---- the request -----------------------------------------------------------------------------------------------


def picture_png(seed: int) -> bytes:
    """A 448 x 448 picture drawn from `seed`: smooth colour fields with fine noise on top (so that PNG does not
    shrink it to nothing), as PNG bytes."""
    rng = np.random.default_rng(seed)
    coarse = Image.fromarray(rng.integers(0, 256, size=(8, 8, 3), dtype=np.uint8)).resize((IMAGE_SIDE, IMAGE_SIDE), Image.Resampling.BICUBIC)
    noise = rng.integers(-12, 13, size=(IMAGE_SIDE, IMAGE_SIDE, 3))
    pixels = np.clip(np.asarray(coarse, dtype=np.int16) + noise, 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def question(tokenizer: Any) -> str:
    """QUESTION_TEXT cut to its first QUESTION_TOKENS tokens (a `tokenizers.Tokenizer`)."""
    ids = tokenizer.encode(QUESTION_TEXT, add_special_tokens=False).ids[:QUESTION_TOKENS]
    text = tokenizer.decode(ids)
    if len(tokenizer.encode(text, add_special_tokens=False).ids) != QUESTION_TOKENS:
        raise RuntimeError(f"the question does not tokenize to {QUESTION_TOKENS} tokens again: {text!r}")
    return text


def rendered_prompt(folder: Path) -> str:
    """One user turn (the image, then the question) as SmolVLM's chat template renders it."""
    import tokenizers
    from jinja2 import Template

    tokenizer = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    template = (folder / "chat_template.jinja").read_text()
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question(tokenizer)}]}]
    return Template(template).render(messages=messages, add_generation_prompt=True)


GREEDY_ONE_TOKEN = {"temperature": 0.0, "max_new_tokens": 1, "ignore_eos": True}


# ---- rsgl, in a process of its own (these run in the worker; the engine stays loaded between calls) -------------

_engine: Any = None


def rsgl_load(model: str, mmproj: str | None, threads: int) -> dict:
    global _engine
    import rsgl

    started = time.perf_counter()
    _engine = rsgl.Engine(model, mmproj=mmproj, dtype="bfloat16", threads=threads, progress=False)
    return {"load_seconds": time.perf_counter() - started, "kernel_isa": rsgl._core.kernel_isa(), "pid": os.getpid()}


def rsgl_ttft(prompt: str, png: bytes) -> dict:
    started = time.perf_counter()
    result = _engine.generate(prompt, GREEDY_ONE_TOKEN, image_data=[png])
    seconds = time.perf_counter() - started
    meta = result["meta_info"]
    return {"ttft_seconds": seconds, "prompt_tokens": meta["prompt_tokens"], "cached_tokens": meta["cached_tokens"]}


def rsgl_split(prompt: str, png: bytes, seed: int, image_token: str) -> dict:
    """Where one request's time goes: the image's preparation (decode, tiles, hash), a text-only prefill of as many
    tokens (random ids), and the rest, the vision tower's (with its scheduling around it)."""
    from rsgl.vision.prompt_images import prompt_images_for

    images = prompt_images_for(_engine.model)
    started = time.perf_counter()
    expanded, _ = images.prepare(prompt, [png], "image_data")
    prepare_seconds = time.perf_counter() - started
    whole = rsgl_ttft(prompt, png)
    prompt_tokens = whole["prompt_tokens"]
    ids = np.random.default_rng(seed).integers(1000, 40000, size=prompt_tokens).tolist()
    started = time.perf_counter()
    _engine.generate(input_ids=ids, sampling_params=GREEDY_ONE_TOKEN)
    text_prefill_seconds = time.perf_counter() - started
    return {
        "ttft_seconds": whole["ttft_seconds"],
        "image_preparation_seconds": prepare_seconds,
        "text_prefill_seconds": text_prefill_seconds,
        "vision_tower_seconds": whole["ttft_seconds"] - prepare_seconds - text_prefill_seconds,
        "image_tokens": expanded.count(image_token),
        "prompt_tokens": prompt_tokens,
    }


def rsgl_peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---- llama.cpp -------------------------------------------------------------------------------------------------


def llama_server(binaries: Path, text: Path, projector: Path, threads: int) -> tuple[ServerProcess, str]:
    """llama-server with the text and projector GGUF files, and its media marker (drawn at random by each server)."""
    server = ServerProcess.llama_server(binaries, text, threads, "--mmproj", str(projector), "-c", "4096", "-np", "1")
    with urllib.request.urlopen(f"{server.url}/props", timeout=10) as response:
        return server, json.load(response)["media_marker"]


def llama_server_ttft(server: ServerProcess, media_marker: str, prompt: str, png: bytes, image_text: str) -> dict:
    """`prompt`'s `image_text` is the server's media marker."""
    body = {
        "prompt": {"prompt_string": prompt.replace(image_text, media_marker), "multimodal_data": [base64.b64encode(png).decode()]},
        "n_predict": 1, "temperature": 0.0, "cache_prompt": False,
    }  # fmt: skip
    request = urllib.request.Request(f"{server.url}/completion", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        answer = json.load(response)
    seconds = time.perf_counter() - started
    timings = answer.get("timings", {})
    return {"ttft_seconds": seconds, "server_prompt_ms": timings.get("prompt_ms"), "prompt_tokens": timings.get("prompt_n")}


def mtmd_cli_run(binaries: Path, text: Path, projector: Path, threads: int, folder: Path, png: bytes) -> dict:
    """One llama-mtmd-cli run (-n 1, the question as its prompt; it applies the GGUF's chat template): the projector's
    encoding time (the sum of its "mtmd batch encoding done" lines), the image chunks it encoded, its process's time
    after the model is loaded (from its "main: loading model" log line to its exit), and its peak RSS."""
    import tokenizers

    question_text = question(tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json")))
    with tempfile.NamedTemporaryFile(suffix=".png") as image, tempfile.TemporaryFile(mode="w+") as log_file:
        image.write(png)
        image.flush()
        command = [
            str(binaries / "llama-mtmd-cli"), "-m", str(text), "--mmproj", str(projector), "--image", image.name, "-p", question_text,
            "-n", "1", "--temp", "0", "-t", str(threads), "-c", "4096",
        ]  # fmt: skip
        started = time.perf_counter()
        # Passive OpenMP threads: the projector's OpenMP threads and the CLI's own thread pool otherwise spin against each
        # other on two cores (a request then takes 4x as long; llama-server has no such clash and runs as it is).
        environment = {**os.environ, "OMP_WAIT_POLICY": "passive"}
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log_file, env=environment)
        _, status, rusage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)
        log_file.seek(0)
        log = log_file.read()
    if process.returncode != 0:
        raise RuntimeError(f"llama-mtmd-cli failed ({process.returncode}):\n{log[-3000:]}")
    loaded = re.search(r"^(\d+)\.(\d+)\.(\d+)\.(\d+) I main: loading model", log, re.MULTILINE)
    loaded_seconds = int(loaded[1]) * 60 + int(loaded[2]) + int(loaded[3]) / 1000 + int(loaded[4]) / 1e6 if loaded else None
    encodings = [int(ms) for ms in re.findall(r"mtmd batch encoding done in (\d+) ms", log)]
    return {
        "wall_seconds": wall,
        "after_load_seconds": wall - loaded_seconds if loaded_seconds is not None else None,
        "encode_seconds": sum(encodings) / 1000,
        "image_chunks": len(encodings),
        "peak_rss_mb": rusage.ru_maxrss / 1024,
    }


# ---- profile -----------------------------------------------------------------------------------------------------


def perf_profile(pid: int, run: Any, top: int = 25) -> list[dict]:
    """`perf record` of process `pid` while `run()` runs: its self time by symbol, the `top` largest."""
    with tempfile.TemporaryDirectory() as work:
        data = Path(work) / "perf.data"
        recorder = subprocess.Popen(
            ["perf", "record", "-q", "-F", "499", "-p", str(pid), "-o", str(data)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        time.sleep(0.5)  # perf attaches
        try:
            run()
        finally:
            recorder.send_signal(signal.SIGINT)
            recorder.wait()
        report = subprocess.run(
            ["perf", "report", "-i", str(data), "--no-children", "--stdio", "--sort", "dso,symbol", "--percent-limit", "0.3"],
            check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
    rows = []
    for line in report.splitlines():
        match = re.match(r"\s+([\d.]+)%\s+(\S+)\s+\[[.k]\]\s+(.+)$", line)
        if match:
            rows.append({"percent": float(match[1]), "dso": match[2], "symbol": match[3].strip()})
    return rows[:top]


# ---- the bench ---------------------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="smolvlm-256m", help="the shapes (random weights) of this model")
    parser.add_argument("--runs", type=int, default=3, help="timed requests per engine (TTFT: the best)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--gguf-type", choices=("bf16", "f16"), default="bf16", help="llama.cpp's weights (text model and projector)")
    parser.add_argument("--llama-cpp-bin", type=Path, default=LLAMA_CPP_BIN, help="the folder of llama-server and llama-mtmd-cli")
    parser.add_argument(
        "--rsgl-files", choices=("gguf", "folder"), default="gguf", help="rsgl reads llama.cpp's GGUF and projector, or the Hugging Face folder they came from"
    )
    parser.add_argument("--skip-llama-cpp", action="store_true")
    parser.add_argument("--skip-mtmd-cli", action="store_true", help="no llama-mtmd-cli run")
    parser.add_argument("--perf", action="store_true", help="perf record one more request of each engine: self time by symbol")
    parser.add_argument("--out", default="bench-results/vision_ttft.json")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    with_llama_cpp = not args.skip_llama_cpp
    if with_llama_cpp and not (args.llama_cpp_bin / "llama-server").exists():
        raise SystemExit(LLAMA_CPP_BUILD.format(bin=args.llama_cpp_bin))
    model = MODELS[args.model]
    folder, text, projector = model_files(model, args.gguf_type)
    prompt = model.prompt(folder)
    load_average = {"start": os.getloadavg()}
    runs: dict[str, list[dict]] = {"rsgl": [], "llama.cpp": []}
    report: dict[str, Any] = {}
    server = None
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as rsgl_worker:
        rsgl_files = (str(text), str(projector)) if args.rsgl_files == "gguf" else (str(folder), None)
        info = {**rsgl_worker.submit(rsgl_load, *rsgl_files, args.threads).result(), "files": args.rsgl_files}
        try:
            if with_llama_cpp:
                server, media_marker = llama_server(args.llama_cpp_bin, text, projector, args.threads)
            measure = {"rsgl": lambda prompt, png: rsgl_worker.submit(rsgl_ttft, prompt, png).result()}
            if server is not None:
                measure["llama.cpp"] = lambda prompt, png: llama_server_ttft(server, media_marker, prompt, png, model.image_text)
            for engine, timed in measure.items():
                warm_up = timed(prompt, picture_png(WARM_UP_SEED))
                print(f"{engine} warm-up: {warm_up['ttft_seconds']:.2f} s", flush=True)
            for run in range(args.runs):
                png = picture_png(run)
                order = list(measure) if run % 2 == 0 else list(reversed(measure))
                for engine in order:
                    runs[engine].append({**measure[engine](prompt, png), "load_average_1min": os.getloadavg()[0]})
                print(f"run {run + 1}: " + ", ".join(f"{engine} {runs[engine][-1]['ttft_seconds']:.2f} s" for engine in measure), flush=True)
            split = rsgl_worker.submit(rsgl_split, prompt, picture_png(WARM_UP_SEED + 1), WARM_UP_SEED, model.image_token).result()
            if args.perf:
                report["rsgl_perf"] = perf_profile(info["pid"], lambda: measure["rsgl"](prompt, picture_png(WARM_UP_SEED + 2)))
                if server is not None:
                    report["llama_cpp_perf"] = perf_profile(server.process.pid, lambda: measure["llama.cpp"](prompt, picture_png(WARM_UP_SEED + 2)))
            report["rsgl"] = {
                **info, "ttft_seconds": min(r["ttft_seconds"] for r in runs["rsgl"]), "runs": runs["rsgl"], "split": split,
                "image_tokens": split["image_tokens"], "peak_rss_mb": rsgl_worker.submit(rsgl_peak_rss_mb).result(),
            }  # fmt: skip
            if server is not None:
                report["llama_cpp"] = {
                    "server": {
                        "ttft_seconds": min(r["ttft_seconds"] for r in runs["llama.cpp"]), "runs": runs["llama.cpp"],
                        "load_seconds": server.load_seconds, "peak_rss_mb": server.peak_rss_mb(),
                    },
                    "gguf_type": args.gguf_type, "files": [str(text), str(projector)],
                }  # fmt: skip
        finally:
            if server is not None:
                server.stop()
    if with_llama_cpp and not args.skip_mtmd_cli:
        report["llama_cpp"]["mtmd_cli"] = mtmd_cli_run(args.llama_cpp_bin, text, projector, args.threads, folder, picture_png(0))
    load_average["end"] = os.getloadavg()
    print_table(report)
    write_json(
        args.out,
        {
            "bench": "vision_ttft", "model": str(folder), "image": f"{IMAGE_SIDE}x{IMAGE_SIDE} PNG", "question_tokens": QUESTION_TOKENS,
            "prompt": prompt, "load_average": load_average, **machine_fields(args.threads, report["rsgl"]["kernel_isa"]), **report,
        },
    )  # fmt: skip


def print_table(report: dict) -> None:
    rsgl, llama = report["rsgl"], report.get("llama_cpp")
    print(f"\n{'engine':<24} {'TTFT best s':>11}  {'runs s':<24} {'prompt tok':>10} {'image tok':>9} {'load s':>7} {'peak RSS MB':>11}")

    def row(name: str, stats: dict, image_tokens: Any) -> None:
        spread = " ".join(f"{r['ttft_seconds']:.2f}" for r in stats["runs"])
        prompt_tokens = stats["runs"][0]["prompt_tokens"]
        print(
            f"{name:<24} {stats['ttft_seconds']:>11.2f}  {spread:<24} {prompt_tokens!s:>10} {image_tokens!s:>9} {stats['load_seconds']:>7.2f}"
            f" {stats['peak_rss_mb']:>11.0f}"
        )

    row(f"rsgl ({rsgl['files']}, {rsgl['kernel_isa']})", rsgl, rsgl["image_tokens"])
    if llama:
        server, cli = llama["server"], llama.get("mtmd_cli")
        row(f"llama-server ({llama['gguf_type']})", server, f"{cli['image_chunks']} chunks" if cli else "?")
        print(f"llama.cpp / rsgl TTFT: {server['ttft_seconds'] / rsgl['ttft_seconds']:.2f}x (issue 47 asks for >= 1.5x)")
        print("llama-server's own prompt_ms: " + " ".join(f"{r['server_prompt_ms'] / 1000:.2f}" for r in server["runs"]) + " s")
        if cli:
            print(
                f"llama-mtmd-cli: {cli['image_chunks']} image chunks encoded in {cli['encode_seconds']:.2f} s; {cli['after_load_seconds']:.2f} s after"
                f" loading, {cli['wall_seconds']:.2f} s in all; peak RSS {cli['peak_rss_mb']:.0f} MB"
            )
    split = rsgl["split"]
    print(
        f"rsgl, one request of {split['ttft_seconds']:.2f} s: image preparation {split['image_preparation_seconds']:.2f} s, text-only prefill of"
        f" {split['prompt_tokens']} tokens {split['text_prefill_seconds']:.2f} s, the rest (vision tower) {split['vision_tower_seconds']:.2f} s"
    )
    for key, name in (("rsgl_perf", "rsgl"), ("llama_cpp_perf", "llama-server")):
        if key in report:
            print(f"\n{name}, perf self time by symbol:")
            for entry in report[key]:
                print(f"  {entry['percent']:5.1f}%  {entry['dso']:<22} {entry['symbol'][:110]}")


if __name__ == "__main__":
    main()
