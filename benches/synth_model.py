"""Writes random-weight checkpoints at real model shapes, to measure speed, load time and memory
at sizes that matter without downloading anything.

    python benches/synth_model.py --shape llama-1b|llama-8b|qwen3-moe \\
        --format gguf-f16|gguf-q8_0|gguf-q4_0|gguf-q4_k_m|safetensors-bf16 [--layers N] [--out PATH] [--force]

Shapes (the vocabulary and tokenizer stay the default model's, 49,152 tokens):
- llama-1b: Llama-3.2-1B (hidden 2048, 16 layers, 32 heads / 8 kv heads, ffn 8192, tied).
- llama-8b: Llama-3.1-8B (hidden 4096, 32 layers, 32 heads / 8 kv heads, ffn 14336, untied).
- qwen3-moe: a Qwen3-30B-A3B layer (hidden 2048, 32 heads / 4 kv heads of 128, q/k norms, 128
  experts of ffn 768, 8 active) with 6 layers instead of 48, so that it fits here (7.4 GB in F16).

GGUF files are written as llama.cpp's converter writes them (names, dimension order, q/k rows,
stacked experts, the tokenizer's metadata copied from the default model's file); safetensors
folders as transformers saves them (sharded at 5 GB, with config.json, tokenizer.json and the
chat template). The 4-bit GGUF files are the F16 file quantized by llama.cpp's own quantizer
(llama-cpp-python), so they hold the tensor types llama.cpp picks for Q4_0 and Q4_K_M (an F16
file is written first if missing). Weight values do not change speed: every value is drawn from one pool of normal
numbers (std 0.02) at a random offset per tensor, written tensor by tensor, so a 16 GB file takes
about a minute and little memory. Default output: ~/.cache/rsgl-bench/synth/<shape>-<format>.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path

import gguf
import numpy as np

CACHE = Path.home() / ".cache" / "rsgl-bench" / "synth"
SHARD_BYTES = 5 << 30
POOL_VALUES = 1 << 24  # the pool every tensor's values are drawn from
Q8_0 = gguf.GGMLQuantizationType.Q8_0


@dataclass(frozen=True)
class Shape:
    architecture: str  # GGUF's name
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    tied: bool
    rope_theta: float
    experts: int = 0
    experts_used: int = 0
    expert_ffn: int = 0


SHAPES = {
    "llama-1b": Shape("llama", 2048, 16, 32, 8, 64, 8192, True, 500000.0),
    "llama-8b": Shape("llama", 4096, 32, 32, 8, 128, 14336, False, 500000.0),
    "qwen3-moe": Shape("qwen3moe", 2048, 6, 32, 4, 128, 6144, False, 1000000.0, experts=128, experts_used=8, expert_ffn=768),
}
# Formats llama.cpp's quantizer makes from the F16 file.
LLAMA_CPP_QUANTIZED = ("gguf-q4_0", "gguf-q4_k_m")
FORMATS = ("gguf-f16", "gguf-q8_0", *LLAMA_CPP_QUANTIZED, "safetensors-bf16")


def tensors(shape: Shape, vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    """(GGUF name, shape outermost first) of every tensor, in llama.cpp's order."""
    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    out = [("token_embd.weight", (vocab, h))]
    for layer in range(shape.layers):
        p = f"blk.{layer}."
        out += [(p + "attn_norm.weight", (h,)), (p + "attn_q.weight", (q, h)), (p + "attn_k.weight", (kv, h))]
        out += [(p + "attn_v.weight", (kv, h)), (p + "attn_output.weight", (h, q)), (p + "ffn_norm.weight", (h,))]
        if shape.experts:
            e, f = shape.experts, shape.expert_ffn
            out += [(p + "attn_q_norm.weight", (shape.head_dim,)), (p + "attn_k_norm.weight", (shape.head_dim,))]
            out += [(p + "ffn_gate_inp.weight", (e, h)), (p + "ffn_gate_exps.weight", (e, f, h))]
            out += [(p + "ffn_up_exps.weight", (e, f, h)), (p + "ffn_down_exps.weight", (e, h, f))]
        else:
            out += [(p + "ffn_gate.weight", (shape.ffn, h)), (p + "ffn_up.weight", (shape.ffn, h)), (p + "ffn_down.weight", (h, shape.ffn))]
    out.append(("output_norm.weight", (h,)))
    if not shape.tied:
        out.append(("output.weight", (vocab, h)))
    return out


def is_float32(name: str) -> bool:
    """Norms and the MoE router stay float32, as llama.cpp's converter keeps them."""
    return name.endswith("norm.weight") or "ffn_gate_inp" in name


class Values:
    """Random tensors drawn from one pool of normal values."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.pool = self.rng.normal(0.0, 0.02, size=POOL_VALUES).astype(np.float32)

    def draw(self, count: int) -> np.ndarray:
        start = int(self.rng.integers(0, POOL_VALUES))
        return np.resize(np.roll(self.pool, -start)[: min(count, POOL_VALUES)], count)

    def tensor(self, name: str, dims: tuple[int, ...]) -> np.ndarray:
        if name.endswith("norm.weight"):
            return (1.0 + self.draw(int(np.prod(dims)))).reshape(dims)
        return self.draw(int(np.prod(dims))).reshape(dims)

    def q8_0(self, dims: tuple[int, ...]) -> np.ndarray:
        """Valid Q8_0 blocks (an f16 scale, 32 int8 values) as bytes shaped [..., row bytes]."""
        blocks = int(np.prod(dims)) // 32
        out = np.empty((blocks, 34), dtype=np.uint8)
        out[:, :2] = np.abs(self.draw(blocks) / 40 + 1e-4).astype(np.float16).reshape(-1, 1).view(np.uint8)
        out[:, 2:] = np.resize(np.roll(self.pool.view(np.uint8), -int(self.rng.integers(0, POOL_VALUES))), (blocks, 32))
        return out.reshape(*dims[:-1], dims[-1] // 32 * 34)


def default_model_gguf() -> gguf.GGUFReader:
    from rsgl.loader.default_model import default_model_path

    return gguf.GGUFReader(default_model_path())


def write_gguf(shape: Shape, kind: str, path: Path) -> None:
    source = default_model_gguf()
    vocab = len(source.fields["tokenizer.ggml.tokens"].data)
    writer = gguf.GGUFWriter(path, shape.architecture)
    arch = shape.architecture
    writer.add_name(path.stem)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if kind == "gguf-f16" else gguf.LlamaFileType.MOSTLY_Q8_0)
    writer.add_context_length(8192)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(1e-5 if arch == "llama" else 1e-6)
    writer.add_vocab_size(vocab)
    if shape.experts:
        writer.add_expert_count(shape.experts)
        writer.add_expert_used_count(shape.experts_used)
        writer.add_expert_feed_forward_length(shape.expert_ffn)
    for key, field in source.fields.items():
        if key.startswith("tokenizer."):
            sub_type = field.types[1] if len(field.types) > 1 else None
            writer.add_key_value(key, field.contents(), field.types[0], sub_type)
    values = Values()
    layout = tensors(shape, vocab)
    for name, dims in layout:
        if is_float32(name):
            writer.add_tensor_info(name, dims, np.dtype(np.float32), 4 * int(np.prod(dims)))
        elif kind == "gguf-f16":
            writer.add_tensor_info(name, dims, np.dtype(np.float16), 2 * int(np.prod(dims)))
        else:
            byte_dims = (*dims[:-1], dims[-1] // 32 * 34)
            writer.add_tensor_info(name, byte_dims, np.dtype(np.uint8), int(np.prod(byte_dims)), raw_dtype=Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, dims in layout:
        if is_float32(name):
            writer.write_tensor_data(values.tensor(name, dims).astype(np.float32))
        elif kind == "gguf-f16":
            writer.write_tensor_data(values.tensor(name, dims).astype(np.float16))
        else:
            writer.write_tensor_data(values.q8_0(dims))
    writer.close()


def quantize_with_llama_cpp(source: Path, kind: str, path: Path) -> None:
    """`source` (F16) quantized by llama.cpp to `kind` (gguf-q4_0, gguf-q4_k_m)."""
    import ctypes

    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{kind.removeprefix('gguf-').upper()}")
    partial = path.with_suffix(".partial")
    if llama_cpp.llama_model_quantize(str(source).encode(), str(partial).encode(), ctypes.byref(params)) != 0:
        raise RuntimeError(f"llama.cpp could not quantize {source} to {kind}")
    partial.replace(path)


def hf_name(gguf_name: str, shape: Shape) -> list[tuple[str, int | None]]:
    """The Hugging Face names of a GGUF tensor (per expert for stacked ones, with the index)."""
    globals_ = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
    if gguf_name in globals_:
        return [(globals_[gguf_name], None)]
    _, layer, module, _ = gguf_name.split(".")
    p = f"model.layers.{layer}."
    layer_names = {
        "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
        "attn_k_norm": "self_attn.k_norm", "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj", "ffn_gate_inp": "mlp.gate",
    }  # fmt: skip
    experts = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
    if module in experts:
        return [(f"{p}mlp.experts.{e}.{experts[module]}.weight", e) for e in range(shape.experts)]
    return [(f"{p}{layer_names[module]}.weight", None)]


def hf_config(shape: Shape, vocab: int, eos_token_id: int) -> dict:
    config = {
        "hidden_size": shape.hidden, "num_hidden_layers": shape.layers, "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads, "head_dim": shape.head_dim, "intermediate_size": shape.ffn,
        "vocab_size": vocab, "rms_norm_eps": 1e-5 if shape.architecture == "llama" else 1e-6,
        "rope_theta": shape.rope_theta, "max_position_embeddings": 8192, "tie_word_embeddings": shape.tied,
        "hidden_act": "silu", "torch_dtype": "bfloat16", "bos_token_id": None, "eos_token_id": eos_token_id,
    }  # fmt: skip
    if shape.experts:
        moe = {"num_experts": shape.experts, "num_experts_per_tok": shape.experts_used, "moe_intermediate_size": shape.expert_ffn}
        return {
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            **config,
            **moe,
            "norm_topk_prob": True,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
        }
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **config}


def write_safetensors_folder(shape: Shape, folder: Path) -> None:
    from rsgl.loader import load_model

    model = load_model(None, progress=False)
    vocab = model.config["vocab_size"]
    folder.mkdir(parents=True, exist_ok=True)
    # (name, shape) of every tensor, in shards of at most SHARD_BYTES of bf16.
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for gguf_name, dims in tensors(shape, vocab):
        for name, expert in hf_name(gguf_name, shape):
            dims_ = dims[1:] if expert is not None else dims
            nbytes = 2 * int(np.prod(dims_))
            if size + nbytes > SHARD_BYTES and shards[-1]:
                shards.append([])
                size = 0
            shards[-1].append((name, dims_))
            size += nbytes
    values = Values()
    weight_map = {}
    for index, shard in enumerate(shards):
        file_name = f"model-{index + 1:05d}-of-{len(shards):05d}.safetensors"
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for name, dims in shard:
            nbytes = 2 * int(np.prod(dims))
            header[name] = {"dtype": "BF16", "shape": list(dims), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
            weight_map[name] = file_name
        encoded = json.dumps(header).encode()
        encoded += b" " * (-len(encoded) % 8)
        with (folder / file_name).open("wb") as out:
            out.write(len(encoded).to_bytes(8, "little"))
            out.write(encoded)
            for name, dims in shard:
                out.write((values.tensor(name, dims).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes())
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
    (folder / "config.json").write_text(json.dumps(hf_config(shape, vocab, model.eos_token_ids[0]), indent=1))
    (folder / "tokenizer.json").write_text(model.tokenizer.to_str())
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": model.eos_token, "add_bos_token": False}))
    (folder / "chat_template.jinja").write_text(model.chat_template)


def output_path(shape_name: str, kind: str, layers: int | None) -> Path:
    stem = f"{shape_name}{f'-{layers}l' if layers else ''}-{kind}"
    return CACHE / (f"{stem}.gguf" if kind.startswith("gguf") else stem)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=list(SHAPES), required=True)
    parser.add_argument("--format", choices=FORMATS, required=True)
    parser.add_argument("--layers", type=int, default=None, help="override the layer count (small checks)")
    parser.add_argument("--out", type=Path, default=None, help="file (GGUF) or folder (safetensors) to write")
    parser.add_argument("--force", action="store_true", help="rewrite an existing output")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    shape = SHAPES[args.shape] if args.layers is None else replace(SHAPES[args.shape], layers=args.layers)
    out = args.out or output_path(args.shape, args.format, args.layers)
    if out.exists() and not args.force:
        print(out)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if args.format in LLAMA_CPP_QUANTIZED:
        source = output_path(args.shape, "gguf-f16", args.layers)
        if not source.exists():
            write_gguf(shape, "gguf-f16", source)
        quantize_with_llama_cpp(source, args.format, out)
    elif args.format.startswith("gguf"):
        write_gguf(shape, args.format, out)
    else:
        write_safetensors_folder(shape, out)
    size = sum(f.stat().st_size for f in ([out] if out.is_file() else out.iterdir()))
    print(f"wrote {out} ({size / 1e9:.2f} GB in {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
