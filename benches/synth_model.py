"""Writes random-weight checkpoints at real model shapes, to measure speed, load time and memory
at sizes that matter without downloading anything.

    python benches/synth_model.py --shape llama-1b|llama-8b|qwen3-moe|gemma3-1b|gemma3-4b|phi4-mini \\
        --format gguf-f16|gguf-q8_0|gguf-q4_0|gguf-q4_k_m|safetensors-bf16 [--layers N] [--out PATH] [--force]
    python benches/synth_model.py --shape gpt-oss-20b --format safetensors-mxfp4|gguf-mxfp4 [--layers N] ...
    python benches/synth_model.py --shape qwen3.5-4b|qwen3-next --format safetensors-bf16|gguf-f16|gguf-q8_0|gguf-q4_k_m ...
    python benches/synth_model.py --shape deepseek-v2-lite --format gguf-q8_0|gguf-q4_0|gguf-q4_k_m ...

Shapes (the tokenizer stays the default model's, 49,152 tokens; the Gemma and Phi shapes pad its
token list to their vocabularies, 262,144 and 200,064 entries, see below):
- llama-1b: Llama-3.2-1B (hidden 2048, 16 layers, 32 heads / 8 kv heads, ffn 8192, tied).
- llama-8b: Llama-3.1-8B (hidden 4096, 32 layers, 32 heads / 8 kv heads, ffn 14336, untied).
- qwen3-moe: a Qwen3-30B-A3B layer (hidden 2048, 32 heads / 4 kv heads of 128, q/k norms, 128
  experts of ffn 768, 8 active) with 6 layers instead of 48, so that it fits here (7.4 GB in F16).
- gemma3-1b: Gemma-3-1B (hidden 1152, 26 layers, 4 heads / 1 kv head of 256, ffn 6912, tied,
  sliding window 512 on 5 layers of 6, rope base 1e6 global / 1e4 local, 32k context).
- gemma3-4b: Gemma-3-4B's text model (hidden 2560, 34 layers, 8 heads / 4 kv heads of 256, ffn
  10240, tied, sliding window 1024, linear rope scaling 8 on the global layers); its context is
  written as 32k, not the real 128k, like the Llama shapes' 8k.
- phi4-mini: Phi-4-mini-instruct (3.8B: hidden 3072, 32 layers, 24 heads / 8 kv heads of 128,
  ffn 8192, tied, 200,064 tokens), as Phi3ForCausalLM lays it out: fused qkv_proj and gate_up_proj
  (GGUF attn_qkv and ffn_up, gate rows first), rope over the first 96 of each head's 128 dims
  (partial_rotary_factor 0.75), LongRoPE (48 short and 48 long factors, made up, rising; original
  context 4k, real context 128k, attention factor sqrt(1 + ln 32 / ln 4096) = 1.19), no sliding
  window. Its GGUF context is written as 8k; its config.json keeps max_position_embeddings 131072,
  from which transformers derives LongRoPE's attention factor.
- gpt-oss-20b: OpenAI's gpt-oss-20b (hidden 2880, 24 layers, 64 heads / 8 kv heads of 64, 32
  experts of ffn 2880, 4 active, 201,088 tokens, untied), as OpenAI released it: experts in MXFP4
  (`*_blocks`: 32 4-bit e2m1 values in 16 bytes, `*_scales`: one e8m0 byte per block), everything
  else in bf16, q/k/v/o, router and expert biases, a sink logit per head, sliding window 128 on
  even layers, YaRN (factor 32 over an original 4k context, rope base 150000, unrounded blend).
  Its context is written as 8k (the real 128k would size engines' KV caches past this machine).
  `safetensors-mxfp4` writes that folder; `gguf-mxfp4` is the GGUF file llama.cpp's converter
  makes of it (the experts repacked to ggml's MXFP4, the rest bf16; the folder is written first
  if missing). Block bytes are random (every 4-bit code equally likely); scales are 2^-8 to 2^-5,
  so that weights have the magnitude of trained ones (|w| up to 6 * 2^-5).
- qwen3.5-4b, qwen3-next: hybrid models (Gated DeltaNet beside gated attention), built from
  transformers' own classes and saved by transformers (see TRANSFORMERS_SHAPES); their GGUF files
  are llama.cpp's converter's output of that folder (F16, Q8_0) or its quantizer's of the F16 file.
- deepseek-v2-lite: DeepSeek-V2-Lite (multi-head latent attention, 64 experts beside 2 shared),
  likewise, but too large here for a whole folder or F16 file: its Q8_0 file repeats the layers of
  the one converted from a 2-layer folder, and its 4-bit files are quantized from that Q8_0 file.

Gemma's vocabulary (262,144 entries) is a large share of a small model's work (the tied lm_head
of gemma3-1b is 30% of its weights), so the Gemma shapes keep it, as phi4-mini keeps Phi-4's
(200,064, 16% of its weights): their token_embd has that many rows and the default model's
tokenizer is padded to that many tokens with unreachable fillers
"<unused0>", "<unused1>", ... (no merge makes them). They are NORMAL tokens (GGUF) or plain
vocabulary entries (tokenizer.json), not added tokens: neither llama.cpp nor rsgl then matches
150k-213k extra strings in every text, so tokenization costs what the default model's does.

GGUF files are written as llama.cpp's converter writes them (names, dimension order, q/k rows,
which it permutes for Llama but not for Gemma or Phi, stacked experts, Gemma's norms as the 1 + w
they scale by, Phi's LongRoPE factors as tensors, the tokenizer's metadata copied from the default
model's file); safetensors folders as
transformers saves them (sharded at 5 GB, with config.json, tokenizer.json and the chat template;
Gemma's norm weights as the w of 1 + w, drawn around 0 where GGUF's are around 1). The 4-bit GGUF
files are the F16 file quantized by llama.cpp's own quantizer (llama-cpp-python), so they hold the
tensor types llama.cpp picks for Q4_0 and Q4_K_M (an F16 file is written first if missing). Weight
values do not change speed: every value is drawn from one pool of normal numbers (std 0.02) at a
random offset per tensor, written tensor by tensor, so a 16 GB file takes about a minute and little
memory. Default output: ~/.cache/rsgl-bench/synth/<shape>-<format>.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import tokenizers

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
    context: int = 8192
    vocab: int = 0  # 0: the default model's; more: its token list padded to this many (Gemma)
    sliding_window: int = 0  # Gemma 3: the local layers' window (every GEMMA_GLOBAL_EVERY-th layer is global)
    rope_linear_factor: float = 0.0  # Gemma-3-4B: linear rope scaling of the global layers
    partial_rotary: float = 1.0  # Phi-4-mini: rope turns the first 0.75 of each head's dims
    longrope_original: int = 0  # Phi-4-mini: LongRoPE's original context (its long factors apply past it)
    longrope_context: int = 0  # ... and the real context (config.json's max_position_embeddings)
    yarn_factor: float = 0.0  # gpt-oss: YaRN over GPT_OSS_ORIGINAL_CONTEXT

    @property
    def gemma(self) -> bool:
        return self.architecture == "gemma3"

    @property
    def phi3(self) -> bool:
        return self.architecture == "phi3"

    @property
    def gpt_oss(self) -> bool:
        return self.architecture == "gpt-oss"

    @property
    def rotary_dim(self) -> int:
        """The dims rope turns in each head (Phi3MiniModel computes int(factor * hidden) // heads, the
        same where head_dim is hidden / heads, as in Phi; Qwen3's head_dim is not)."""
        return int(self.partial_rotary * self.head_dim)

    @property
    def rms_eps(self) -> float:
        return 1e-5 if self.architecture in ("llama", "phi3", "gpt-oss") else 1e-6


GEMMA_VOCAB = 262144
GEMMA_GLOBAL_EVERY = 6  # sliding_window_pattern: layers 5, 11, 17, ... attend globally
GEMMA_LOCAL_ROPE_THETA = 10000.0
PHI4_VOCAB = 200064
GPT_OSS_VOCAB = 201088
GPT_OSS_ORIGINAL_CONTEXT = 4096
MXFP4_BLOCK = 32  # values per block: 16 bytes of 4-bit codes and one scale byte
MXFP4_SCALES = (119, 123)  # e8m0 scale bytes drawn from [119, 123): 2^-8 to 2^-5


SHAPES = {
    "llama-1b": Shape("llama", 2048, 16, 32, 8, 64, 8192, True, 500000.0, context=131072),  # Llama-3.2-1B: 128k context
    "llama-8b": Shape("llama", 4096, 32, 32, 8, 128, 14336, False, 500000.0),
    "qwen3-moe": Shape("qwen3moe", 2048, 6, 32, 4, 128, 6144, False, 1000000.0, experts=128, experts_used=8, expert_ffn=768),
    "gemma3-1b": Shape("gemma3", 1152, 26, 4, 1, 256, 6912, True, 1000000.0, context=32768, vocab=GEMMA_VOCAB, sliding_window=512),
    # Gemma-3-4B's context is 131072; written as 32768 (GGUF context_length, HF max_position_embeddings)
    # so that engines sizing their KV cache from it stay small, as the Llama shapes write 8192.
    "gemma3-4b": Shape("gemma3", 2560, 34, 8, 4, 256, 10240, True, 1000000.0, context=32768, vocab=GEMMA_VOCAB, sliding_window=1024, rope_linear_factor=8.0),
    # Phi-4-mini's context is 131072 (the converter's phi3.context_length); the GGUF file says 8192,
    # as the Llama shapes do. Its LongRoPE keeps the real numbers: original context 4096 (GGUF
    # rope.scaling.original_context_length), and the attention factor that 131072 / 4096 gives.
    "phi4-mini": Shape(
        "phi3", 3072, 32, 24, 8, 128, 8192, True, 10000.0, vocab=PHI4_VOCAB, partial_rotary=0.75, longrope_original=4096, longrope_context=131072
    ),
    # gpt-oss-20b's ffn is its experts' (it has no dense MLP).
    "gpt-oss-20b": Shape(
        "gpt-oss",
        2880,
        24,
        64,
        8,
        64,
        2880,
        False,
        150000.0,
        experts=32,
        experts_used=4,
        expert_ffn=2880,
        vocab=GPT_OSS_VOCAB,
        sliding_window=128,
        yarn_factor=32.0,
    ),
}
# Shapes written through transformers' own config and model classes (tensor names, shapes and
# config.json as transformers saves them; their GGUF files are llama.cpp's converter's, then its
# quantizer's). Keyword arguments of AutoConfig.for_model; vocab_size is the padded vocabulary.
TRANSFORMERS_SHAPES = {
    # Qwen3.5-4B's text model as we know its config (hidden 2560, 32 layers: Gated DeltaNet in three
    # of every four, 16 key / 32 value heads of 128; gated attention in the fourth, 16 q / 4 kv
    # heads of 256, a quarter of each rotary; ffn 9216; tied; 248,320 tokens).
    "qwen3.5-4b": dict(
        model_type="qwen3_5_text", architectures=["Qwen3_5ForCausalLM"], hidden_size=2560, intermediate_size=9216,
        num_hidden_layers=32, num_attention_heads=16, num_key_value_heads=4, head_dim=256, linear_num_key_heads=16,
        linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
        max_position_embeddings=32768, vocab_size=248320,
    ),
    # Qwen3-Next-80B-A3B's layers (transformers' defaults: hidden 2048, 512 experts of ffn 512, 10
    # active, a shared expert of 512; DeltaNet 16 key / 32 value heads of 128; attention 16 q / 2 kv
    # heads of 256) with 4 layers instead of 48 (three DeltaNet, one attention), so that it fits
    # here (12.9 GB in bf16).
    "qwen3-next": dict(
        model_type="qwen3_next", architectures=["Qwen3NextForCausalLM"], num_hidden_layers=4, max_position_embeddings=32768, vocab_size=151936
    ),
    # DeepSeek-V2-Lite (15.7B: hidden 2048, 27 layers; multi-head latent attention, 16 heads, no query
    # low-rank, a 512-wide latent, 128 + 64 rotary query/key dims, values of 128; a dense first layer
    # of ffn 10944, then 64 experts of ffn 1408, 6 active by softmax, beside 2 shared; YaRN factor 40
    # over a 4k context, mscale = mscale_all_dim 0.707; 102,400 tokens, untied). Its bf16 folder
    # (31 GB) and Q8_0 file (16.7 GB) do not fit on this disk together: its GGUF files come from the
    # Q8_0 file of a 2-layer folder with its layers repeated (see REPEATED_LAYER_SHAPES).
    "deepseek-v2-lite": dict(
        model_type="deepseek_v2", architectures=["DeepseekV2ForCausalLM"], hidden_size=2048, num_hidden_layers=27,
        num_attention_heads=16, num_key_value_heads=16, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, intermediate_size=10944, first_k_dense_replace=1, moe_intermediate_size=1408,
        n_routed_experts=64, num_experts_per_tok=6, n_shared_experts=2, n_group=1, topk_group=1, topk_method="greedy",
        scoring_func="softmax", norm_topk_prob=False, routed_scaling_factor=1.0, rms_norm_eps=1e-6,
        rope_parameters={
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096,
            "mscale": 0.707, "mscale_all_dim": 0.707, "beta_fast": 32.0, "beta_slow": 1.0,
        },
        max_position_embeddings=163840, tie_word_embeddings=False, vocab_size=102400,
    ),
}  # fmt: skip
# Options of llama.cpp's converter per shape: the random Qwen checkpoints have no multi-token
# prediction layer (its DeepSeek converter takes no --no-mtp).
CONVERTER_OPTIONS = {"qwen3.5-4b": ("--no-mtp",), "qwen3-next": ("--no-mtp",)}
# Shapes whose GGUF files repeat the layers of a small one's (the dense first layers', then the
# last's, with new random values), written in Q8_0 without a folder or F16 file of the whole model,
# then quantized by llama.cpp from that Q8_0 file: (layers of the small one, dense first layers).
# DeepSeek-V2-Lite: 3.3 GB of 2-layer folder and Q8_0 file, then 16.7 GB of Q8_0, 10.4 GB of Q4_K_M
# and 8.9 GB of Q4_0; the peak while quantizing is the Q8_0 file beside the quantized one (27 GB,
# 30 GB with the 2-layer files). On 2 cores: 2 min for the 2-layer files, 4 for the Q8_0 file, 21 for
# Q4_K_M, 1 for Q4_0.
# llama.cpp's quantizer reads a DeepSeek-V2 file without query low-rank only at Lite's 27 layers
# (its loader tells Lite by the layer count): smaller --layers stop at Q8_0.
REPEATED_LAYER_SHAPES = {"deepseek-v2-lite": (2, 1)}
# Models whose RMS norms scale by 1 + w (their weights drawn around 0).
ONE_PLUS_W_NORMS = ("qwen3_5_text", "qwen3_next")
# Formats llama.cpp's quantizer makes from the F16 file.
LLAMA_CPP_QUANTIZED = ("gguf-q4_0", "gguf-q4_k_m")
# gpt-oss's formats: OpenAI's MXFP4 folder, and the GGUF file llama.cpp's converter makes of it.
MXFP4_FORMATS = ("safetensors-mxfp4", "gguf-mxfp4")
FORMATS = ("gguf-f16", "gguf-q8_0", *LLAMA_CPP_QUANTIZED, "safetensors-bf16", *MXFP4_FORMATS)


def longrope_factors(shape: Shape) -> tuple[list[float], list[float]]:
    """Made-up LongRoPE factors (short, long), one per rotated pair of dims, rising as real ones do
    (Phi-4-mini's short ones from 1 to about 3, its long ones from 1 to tens)."""
    pairs = shape.rotary_dim // 2
    short = np.linspace(1.0, 3.0, pairs).round(6).tolist()
    long = np.geomspace(1.0, 50.0, pairs).round(6).tolist()
    return short, long


def longrope_attention_factor(shape: Shape) -> float:
    """sqrt(1 + ln(s) / ln(original)) of the context's growth s, as llama.cpp's converter and
    transformers compute it (1.190 for Phi-4-mini's 131072 / 4096)."""
    scale = shape.longrope_context / shape.longrope_original
    return math.sqrt(1 + math.log(scale) / math.log(shape.longrope_original)) if scale > 1 else 1.0


def tensors(shape: Shape, vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    """(GGUF name, shape outermost first) of every tensor, in llama.cpp's order (its converter
    writes Phi's LongRoPE factors first)."""
    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    out: list[tuple[str, tuple[int, ...]]] = []
    if shape.longrope_original:
        out += [("rope_factors_long.weight", (shape.rotary_dim // 2,)), ("rope_factors_short.weight", (shape.rotary_dim // 2,))]
    out.append(("token_embd.weight", (vocab, h)))
    for layer in range(shape.layers):
        p = f"blk.{layer}."
        if shape.phi3:  # q, k, v rows in one attn_qkv (not permuted); gate and up rows in one ffn_up, gate first
            out += [(p + "attn_norm.weight", (h,)), (p + "attn_qkv.weight", (q + 2 * kv, h)), (p + "attn_output.weight", (h, q))]
            out += [(p + "ffn_norm.weight", (h,)), (p + "ffn_up.weight", (2 * shape.ffn, h)), (p + "ffn_down.weight", (h, shape.ffn))]
            continue
        if shape.gemma:  # q/k norms, and norms after attention and after the MLP; ffn_norm is pre_feedforward_layernorm
            out += [(p + "attn_norm.weight", (h,)), (p + "attn_q.weight", (q, h)), (p + "attn_k.weight", (kv, h)), (p + "attn_v.weight", (kv, h))]
            out += [(p + "attn_q_norm.weight", (shape.head_dim,)), (p + "attn_k_norm.weight", (shape.head_dim,))]
            out += [(p + "attn_output.weight", (h, q)), (p + "post_attention_norm.weight", (h,)), (p + "ffn_norm.weight", (h,))]
            out += [(p + "ffn_gate.weight", (shape.ffn, h)), (p + "ffn_up.weight", (shape.ffn, h)), (p + "ffn_down.weight", (h, shape.ffn))]
            out.append((p + "post_ffw_norm.weight", (h,)))
            continue
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
    """Norms, the MoE router and LongRoPE's factors stay float32, as llama.cpp's converter keeps them."""
    return name.endswith("norm.weight") or "ffn_gate_inp" in name or name.startswith("rope_factors_")


class Values:
    """Random tensors drawn from one pool of normal values."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.pool = self.rng.normal(0.0, 0.02, size=POOL_VALUES).astype(np.float32)

    def draw(self, count: int) -> np.ndarray:
        start = int(self.rng.integers(0, POOL_VALUES))
        return np.resize(np.roll(self.pool, -start)[: min(count, POOL_VALUES)], count)

    def tensor(self, name: str, dims: tuple[int, ...], norm_offset: float = 1.0) -> np.ndarray:
        """Norm weights are drawn around `norm_offset`: 1 where they are the scale itself (GGUF, HF
        Llama / Qwen), 0 in HF Gemma files (they store w and scale by 1 + w)."""
        if name.endswith("norm.weight"):
            return (norm_offset + self.draw(int(np.prod(dims)))).reshape(dims)
        return self.draw(int(np.prod(dims))).reshape(dims)

    def q8_0(self, dims: tuple[int, ...]) -> np.ndarray:
        """Valid Q8_0 blocks (an f16 scale, 32 int8 values) as bytes shaped [..., row bytes]."""
        blocks = int(np.prod(dims)) // 32
        out = np.empty((blocks, 34), dtype=np.uint8)
        out[:, :2] = np.abs(self.draw(blocks) / 40 + 1e-4).astype(np.float16).reshape(-1, 1).view(np.uint8)
        out[:, 2:] = np.resize(np.roll(self.pool.view(np.uint8), -int(self.rng.integers(0, POOL_VALUES))), (blocks, 32))
        return out.reshape(*dims[:-1], dims[-1] // 32 * 34)

    def bytes_between(self, count: int, low: int, high: int) -> np.ndarray:
        return self.rng.integers(low, high, size=count, dtype=np.uint8)


def default_model_gguf() -> gguf.GGUFReader:
    from rsgl.loader.default_model import default_model_path

    return gguf.GGUFReader(default_model_path())


def filler_tokens(existing: list[str], vocab: int) -> list[str]:
    """Token spellings "<unused0>", "<unused1>", ... padding `existing` to `vocab` tokens."""
    filler = [f"<unused{index}>" for index in range(vocab - len(existing))]
    if not set(filler).isdisjoint(existing):
        raise RuntimeError("the default model's vocabulary already spells a filler token")
    return filler


def write_gguf(shape: Shape, kind: str, path: Path) -> None:
    source = default_model_gguf()
    source_tokens = source.fields["tokenizer.ggml.tokens"].contents()
    vocab = max(shape.vocab, len(source_tokens))
    filler = filler_tokens(source_tokens, vocab)
    writer = gguf.GGUFWriter(path, shape.architecture)
    writer.add_name(path.stem)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if kind == "gguf-f16" else gguf.LlamaFileType.MOSTLY_Q8_0)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    if not shape.phi3:  # Phi3MiniModel writes neither (llama.cpp takes hidden / heads)
        writer.add_key_length(shape.head_dim)
        writer.add_value_length(shape.head_dim)
    if not shape.gemma:  # Gemma3Model writes no rope.dimension_count (llama.cpp takes head_dim)
        writer.add_rope_dimension_count(shape.rotary_dim)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(shape.rms_eps)
    if not shape.phi3:  # nor vocab_size (llama.cpp counts the tokens)
        writer.add_vocab_size(vocab)
    if shape.experts:
        writer.add_expert_count(shape.experts)
        writer.add_expert_used_count(shape.experts_used)
        writer.add_expert_feed_forward_length(shape.expert_ffn)
    if shape.sliding_window:
        # As llama.cpp's Gemma3Model writes them: no sliding_window_pattern (llama.cpp assumes 6),
        # the local layers' rope base, and the global layers' rope scaling.
        writer.add_sliding_window(shape.sliding_window)
        writer.add_rope_freq_base_swa(GEMMA_LOCAL_ROPE_THETA)
    if shape.rope_linear_factor:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(shape.rope_linear_factor)
    if shape.longrope_original:
        # As Phi3MiniModel writes LongRoPE: no rope.scaling.type, the factors as tensors.
        writer.add_rope_scaling_orig_ctx_len(shape.longrope_original)
        writer.add_rope_scaling_attn_factors(longrope_attention_factor(shape))
    if shape.phi3:
        # Phi3MiniModel writes config.json's sliding_window, 0 where it is null (llama.cpp then runs
        # no sliding window). Microsoft's Phi-4-mini config says 262144, which would give a window
        # wider than any context run here: the same attention, but llama.cpp's sliding-window cache.
        writer.add_sliding_window(0)
    # The filler tokens are NORMAL (not USER_DEFINED: llama.cpp would match each in every text),
    # scored below every real token.
    padding = {"tokenizer.ggml.tokens": filler, "tokenizer.ggml.token_type": [int(gguf.TokenType.NORMAL)] * len(filler)}
    if "tokenizer.ggml.scores" in source.fields:
        padding["tokenizer.ggml.scores"] = [min(source.fields["tokenizer.ggml.scores"].contents()) - 1.0] * len(filler)
    for key, field in source.fields.items():
        if key.startswith("tokenizer."):
            sub_type = field.types[1] if len(field.types) > 1 else None
            value = field.contents() + padding[key] if key in padding else field.contents()
            writer.add_key_value(key, value, field.types[0], sub_type)
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
    short, long = longrope_factors(shape)
    factors = {"rope_factors_short.weight": short, "rope_factors_long.weight": long}
    for name, dims in layout:
        if name in factors:
            writer.write_tensor_data(np.array(factors[name], dtype=np.float32))
        elif is_float32(name):
            writer.write_tensor_data(values.tensor(name, dims).astype(np.float32))
        elif kind == "gguf-f16":
            writer.write_tensor_data(values.tensor(name, dims).astype(np.float16))
        else:
            writer.write_tensor_data(values.q8_0(dims))
    writer.close()


def quantize_with_llama_cpp(source: Path, kind: str, path: Path) -> None:
    """`source` (F16, or Q8_0) quantized by llama.cpp to `kind` (gguf-q4_0, gguf-q4_k_m)."""
    import ctypes

    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{kind.removeprefix('gguf-').upper()}")
    params.allow_requantize = True  # a Q8_0 source (REPEATED_LAYER_SHAPES)
    partial = path.with_suffix(".partial")
    if llama_cpp.llama_model_quantize(str(source).encode(), str(partial).encode(), ctypes.byref(params)) != 0:
        raise RuntimeError(f"llama.cpp could not quantize {source} to {kind}")
    partial.replace(path)


def hf_name(gguf_name: str, shape: Shape) -> list[tuple[str, int | None]]:
    """The Hugging Face names of a GGUF tensor (per expert for stacked ones, with the index; none
    for LongRoPE's factors, which config.json holds). Gemma's ffn_norm is its
    pre_feedforward_layernorm (its post_attention_layernorm is post_attention_norm); Llama's,
    Qwen's and Phi's is their post_attention_layernorm."""
    globals_ = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
    if gguf_name in globals_:
        return [(globals_[gguf_name], None)]
    if gguf_name.startswith("rope_factors_"):
        return []
    _, layer, module, _ = gguf_name.split(".")
    p = f"model.layers.{layer}."
    layer_names = {
        "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
        "attn_k_norm": "self_attn.k_norm", "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj", "ffn_gate_inp": "mlp.gate",
    }  # fmt: skip
    if shape.phi3:
        layer_names |= {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
    if shape.gemma:
        layer_names |= {
            "post_attention_norm": "post_attention_layernorm",
            "ffn_norm": "pre_feedforward_layernorm",
            "post_ffw_norm": "post_feedforward_layernorm",
        }
    experts = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
    if module in experts:
        return [(f"{p}mlp.experts.{e}.{experts[module]}.weight", e) for e in range(shape.experts)]
    return [(f"{p}{layer_names[module]}.weight", None)]


def gpt_oss_tensors(shape: Shape, vocab: int) -> list[list[tuple[str, str, tuple[int, ...]]]]:
    """(name, safetensors dtype, shape) of every tensor of OpenAI's gpt-oss layout, grouped: the
    embedding, each layer, then the final norm and lm_head (a layer's MXFP4 blocks stay beside
    their scales, as llama.cpp's converter reads them in order)."""
    h, q, kv, e, f = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.experts, shape.expert_ffn
    groups: list[list[tuple[str, str, tuple[int, ...]]]] = [[("model.embed_tokens.weight", "BF16", (vocab, h))]]
    for layer in range(shape.layers):
        p = f"model.layers.{layer}."
        attention = [(p + "input_layernorm.weight", "BF16", (h,)), (p + "post_attention_layernorm.weight", "BF16", (h,))]
        for proj, rows, cols in (("q_proj", q, h), ("k_proj", kv, h), ("v_proj", kv, h), ("o_proj", h, q)):
            attention += [(f"{p}self_attn.{proj}.weight", "BF16", (rows, cols)), (f"{p}self_attn.{proj}.bias", "BF16", (rows,))]
        attention.append((p + "self_attn.sinks", "BF16", (shape.heads,)))
        router = [(p + "mlp.router.weight", "BF16", (e, h)), (p + "mlp.router.bias", "BF16", (e,))]
        experts = []
        for proj, rows, cols in (("gate_up_proj", 2 * f, h), ("down_proj", h, f)):
            experts += [
                (f"{p}mlp.experts.{proj}_blocks", "U8", (e, rows, cols // MXFP4_BLOCK, MXFP4_BLOCK // 2)),
                (f"{p}mlp.experts.{proj}_scales", "U8", (e, rows, cols // MXFP4_BLOCK)),
                (f"{p}mlp.experts.{proj}_bias", "BF16", (e, rows)),
            ]
        groups.append(attention + router + experts)
    groups.append([("model.norm.weight", "BF16", (h,)), ("lm_head.weight", "BF16", (vocab, h))])
    return groups


def bf16_bytes(weights: np.ndarray) -> bytes:
    """float32 values as bfloat16 bytes (truncated, as the checkpoints' random values need no rounding)."""
    return (np.asarray(weights, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()


def write_gpt_oss_tensor(out, values: Values, name: str, dims: tuple[int, ...]) -> None:
    """One tensor's bytes, a slab of rows at a time (the 201,088-row embedding is 1.2 GB of bf16)."""
    if name.endswith("_scales"):
        out.write(values.bytes_between(int(np.prod(dims)), *MXFP4_SCALES).tobytes())
        return
    if name.endswith("_blocks"):
        for _ in range(dims[0]):  # an expert at a time
            out.write(values.bytes_between(int(np.prod(dims[1:])), 0, 256).tobytes())
        return
    rows_per_slab = max(1, (1 << 24) // int(np.prod(dims[1:])))
    for start in range(0, dims[0], rows_per_slab):
        slab = (min(rows_per_slab, dims[0] - start), *dims[1:])
        # Sinks around 0, as trained ones are (a few units at most).
        weights = values.tensor(name, slab).astype(np.float32) * (50.0 if name.endswith("sinks") else 1.0)
        out.write(bf16_bytes(weights))


def write_gpt_oss_folder(shape: Shape, folder: Path) -> None:
    """OpenAI's gpt-oss layout (MXFP4 experts, the rest bf16), whole layers per shard."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab, eos_token_id = write_tokenizer_files(shape.vocab, folder)
    write_safetensors_shards(folder, gpt_oss_tensors(shape, vocab), write_gpt_oss_tensor)
    (folder / "config.json").write_text(json.dumps(hf_config(shape, vocab, eos_token_id), indent=1))


def write_safetensors_shards(
    folder: Path, groups: list[list[tuple[str, str, tuple[int, ...]]]], write_tensor: Callable[[Any, Values, str, tuple[int, ...]], None]
) -> None:
    """Groups of (name, safetensors dtype, shape) into shards of about SHARD_BYTES (a group never
    split), each tensor's bytes from `write_tensor`, and the index naming each tensor's shard."""
    item_bytes = {"BF16": 2, "U8": 1}
    shards: list[list[tuple[str, str, tuple[int, ...]]]] = [[]]
    size = 0
    for group in groups:
        group_bytes = sum(item_bytes[dtype] * int(np.prod(dims)) for _, dtype, dims in group)
        if size + group_bytes > SHARD_BYTES and shards[-1]:
            shards.append([])
            size = 0
        shards[-1] += group
        size += group_bytes
    values = Values()
    weight_map = {}
    for index, shard in enumerate(shards):
        file_name = f"model-{index + 1:05d}-of-{len(shards):05d}.safetensors"
        header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for name, dtype, dims in shard:
            nbytes = item_bytes[dtype] * int(np.prod(dims))
            header[name] = {"dtype": dtype, "shape": list(dims), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
            weight_map[name] = file_name
        encoded = json.dumps(header).encode()
        encoded += b" " * (-len(encoded) % 8)
        with (folder / file_name).open("wb") as out:
            out.write(len(encoded).to_bytes(8, "little"))
            out.write(encoded)
            for name, _, dims in shard:
                write_tensor(out, values, name, dims)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))


def convert_with_llama_cpp(folder: Path, path: Path, outtype: str = "bf16", options: tuple[str, ...] = ()) -> None:
    """The GGUF file llama.cpp's converter writes of `folder` (in `outtype`, with its further
    `options`; gpt-oss's MXFP4 experts stay MXFP4), through the tests' wrapper, which teaches it the
    default model's byte-level tokenizer."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from gguf_convert import convert

    partial = path.with_suffix(".partial")
    convert(folder, partial, outtype=outtype, options=options)
    partial.replace(path)


def hf_config(shape: Shape, vocab: int, eos_token_id: int) -> dict[str, Any]:
    config: dict[str, Any] = {
        "hidden_size": shape.hidden, "num_hidden_layers": shape.layers, "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads, "head_dim": shape.head_dim, "intermediate_size": shape.ffn,
        "vocab_size": vocab, "rms_norm_eps": shape.rms_eps,
        "rope_theta": shape.rope_theta, "max_position_embeddings": shape.context, "tie_word_embeddings": shape.tied,
        "torch_dtype": "bfloat16", "bos_token_id": None, "eos_token_id": eos_token_id,
    }  # fmt: skip
    if shape.gemma:
        # As Google's config.json files have it (transformers 4.50), with the layer_types that
        # transformers 4.53 and later write besides sliding_window_pattern.
        layer_types = ["full_attention" if (layer + 1) % GEMMA_GLOBAL_EVERY == 0 else "sliding_attention" for layer in range(shape.layers)]
        rope_scaling = {"rope_type": "linear", "factor": shape.rope_linear_factor} if shape.rope_linear_factor else None
        gemma = {
            "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": shape.head_dim,
            "sliding_window": shape.sliding_window, "sliding_window_pattern": GEMMA_GLOBAL_EVERY, "layer_types": layer_types,
            "rope_local_base_freq": GEMMA_LOCAL_ROPE_THETA, "rope_scaling": rope_scaling,
            "final_logit_softcapping": None, "attn_logit_softcapping": None, "attention_bias": False,
        }  # fmt: skip
        return {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", **config, **gemma}
    config["hidden_act"] = "silu"
    if shape.gpt_oss:
        # As OpenAI's gpt-oss-20b config.json has it (transformers 4.55), but for the context (see the shapes).
        gpt_oss = {
            "attention_bias": True, "attention_dropout": 0.0, "num_local_experts": shape.experts,
            "num_experts_per_tok": shape.experts_used, "experts_per_token": shape.experts_used,
            "initial_context_length": GPT_OSS_ORIGINAL_CONTEXT, "sliding_window": shape.sliding_window,
            "layer_types": ["sliding_attention" if layer % 2 == 0 else "full_attention" for layer in range(shape.layers)],
            "rope_scaling": {
                "rope_type": "yarn", "factor": shape.yarn_factor, "original_max_position_embeddings": GPT_OSS_ORIGINAL_CONTEXT,
                "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
            },
            "swiglu_limit": 7.0, "router_aux_loss_coef": 0.9, "output_router_logits": False, "pad_token_id": eos_token_id,
            "quantization_config": {
                "quant_method": "mxfp4",
                "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
            },
        }  # fmt: skip
        return {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", **config, **gpt_oss}
    if shape.phi3:
        # As Microsoft's Phi-4-mini-instruct config.json has it (transformers 4.45 layout), but for
        # its sliding_window (262144 there, null here: see write_gguf). max_position_embeddings stays
        # 131072: transformers derives LongRoPE's attention factor from it, as the GGUF file holds it.
        short, long = longrope_factors(shape)
        del config["head_dim"]  # Microsoft's has none (hidden / heads)
        phi3 = {
            "max_position_embeddings": shape.longrope_context, "original_max_position_embeddings": shape.longrope_original,
            "partial_rotary_factor": shape.partial_rotary, "rope_scaling": {"type": "longrope", "short_factor": short, "long_factor": long},
            "sliding_window": None, "attention_bias": False, "mlp_bias": False, "lm_head_bias": False,
            "attention_dropout": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0, "pad_token_id": eos_token_id,
        }  # fmt: skip
        return {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", **config, **phi3}
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


def write_tokenizer_files(shape_vocab: int, folder: Path) -> tuple[int, int]:
    """The default model's tokenizer (padded to `shape_vocab` tokens) and chat template, as
    transformers saves them; returns the vocabulary size and the end-of-sequence token id."""
    from rsgl.loader import load_model

    model = load_model(None, progress=False)
    if model.tokenizer is None or model.chat_template is None:
        raise RuntimeError("the default model loaded without its tokenizer or chat template")
    tokenizer = json.loads(model.tokenizer.to_str())
    source = tokenizers.Tokenizer.from_str(model.tokenizer.to_str())
    source_vocab = source.get_vocab_size(with_added_tokens=True)
    vocab = max(shape_vocab, model.config.fields["vocab_size"])
    # Gemma's vocabulary: the filler tokens as plain BPE vocabulary entries (no merge reaches them).
    filler = filler_tokens(list(source.get_vocab(with_added_tokens=True)), vocab) if vocab > source_vocab else []
    tokenizer["model"]["vocab"] |= {token: source_vocab + index for index, token in enumerate(filler)}
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    # tokenizer_class: else transformers 5 builds the tokenizer its config's model_type names (Llama's,
    # Gemma's) from tokenizer.json's vocabulary, which is not that tokenizer's.
    tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": model.eos_token, "add_bos_token": False}
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    (folder / "chat_template.jinja").write_text(model.chat_template)
    return vocab, model.eos_token_ids[0]


def write_safetensors_folder(shape: Shape, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    vocab, eos_token_id = write_tokenizer_files(shape.vocab, folder)
    groups = []
    for gguf_name, dims in tensors(shape, vocab):
        for name, expert in hf_name(gguf_name, shape):
            groups.append([(name, "BF16", dims[1:] if expert is not None else dims)])

    def write_bf16(out, values: Values, name: str, dims: tuple[int, ...]) -> None:
        weights = values.tensor(name, dims, norm_offset=0.0 if shape.gemma else 1.0).astype(np.float32)
        out.write(bf16_bytes(weights))

    write_safetensors_shards(folder, groups, write_bf16)
    (folder / "config.json").write_text(json.dumps(hf_config(shape, vocab, eos_token_id), indent=1))


def write_transformers_folder(shape_name: str, layers: int | None, folder: Path) -> None:
    """A TRANSFORMERS_SHAPES model with random weights, laid out as transformers saves it. The
    tensor names and shapes come from transformers' model class built on the meta device (no
    memory), its fused experts written per expert as its save_pretrained writes them; norms are
    drawn around 0 where the model scales by 1 + w (Qwen3.5's and Qwen3-Next's, but for the
    DeltaNet's gated norm, which scales by w), around 1 elsewhere."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = dict(TRANSFORMERS_SHAPES[shape_name])
    if layers:
        spec["num_hidden_layers"] = layers
    folder.mkdir(parents=True, exist_ok=True)
    vocab, eos_token_id = write_tokenizer_files(spec.pop("vocab_size"), folder)
    config = AutoConfig.for_model(**spec, vocab_size=vocab, eos_token_id=eos_token_id, dtype="bfloat16")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    groups = []
    for name, tensor in model.state_dict().items():
        dims = tuple(tensor.shape)
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        if name.endswith("mlp.experts.gate_up_proj"):  # [experts, 2 ffn, hidden]: gate rows, then up rows
            prefix = name.removesuffix("gate_up_proj")
            half = (dims[1] // 2, dims[2])
            groups += [[(f"{prefix}{e}.gate_proj.weight", "BF16", half), (f"{prefix}{e}.up_proj.weight", "BF16", half)] for e in range(dims[0])]
        elif name.endswith("mlp.experts.down_proj"):
            groups += [[(f"{name.removesuffix('down_proj')}{e}.down_proj.weight", "BF16", dims[1:])] for e in range(dims[0])]
        else:
            groups.append([(name, "BF16", dims)])

    scale_is_one_plus_w = spec["model_type"] in ONE_PLUS_W_NORMS

    def write_bf16(out, values: Values, name: str, dims: tuple[int, ...]) -> None:
        mean = 1.0 if name.endswith("linear_attn.norm.weight") or (name.endswith("norm.weight") and not scale_is_one_plus_w) else 0.0
        weights = (mean + values.draw(int(np.prod(dims)))).astype(np.float32)
        out.write(bf16_bytes(weights))

    write_safetensors_shards(folder, groups, write_bf16)
    (folder / "config.json").write_text(config.to_json_string())


def output_path(shape_name: str, kind: str, layers: int | None) -> Path:
    stem = f"{shape_name}{f'-{layers}l' if layers else ''}-{kind}"
    return CACHE / (f"{stem}.gguf" if kind.startswith("gguf") else stem)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=[*SHAPES, *TRANSFORMERS_SHAPES], required=True)
    parser.add_argument("--format", choices=FORMATS, required=True)
    parser.add_argument("--layers", type=int, default=None, help="override the layer count (small checks)")
    parser.add_argument("--out", type=Path, default=None, help="file (GGUF) or folder (safetensors) to write")
    parser.add_argument("--force", action="store_true", help="rewrite an existing output")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    out = args.out or output_path(args.shape, args.format, args.layers)
    if out.exists() and not args.force:
        print(out)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if args.shape in TRANSFORMERS_SHAPES:
        write_through_transformers(args.shape, args.format, args.layers, out)
    else:
        write_shape(SHAPES[args.shape] if args.layers is None else replace(SHAPES[args.shape], layers=args.layers), args, out)
    size = sum(f.stat().st_size for f in ([out] if out.is_file() else out.iterdir()))
    print(f"wrote {out} ({size / 1e9:.2f} GB in {time.perf_counter() - started:.0f} s)")


def write_shape(shape: Shape, args: argparse.Namespace, out: Path) -> None:
    if shape.gpt_oss != (args.format in MXFP4_FORMATS):
        raise SystemExit(f"--shape {args.shape} is not written as {args.format}: gpt-oss-20b is written as {' or '.join(MXFP4_FORMATS)}, the other shapes not")
    if args.format == "gguf-mxfp4":
        source = output_path(args.shape, "safetensors-mxfp4", args.layers)
        if not source.exists():
            write_gpt_oss_folder(shape, source)
        convert_with_llama_cpp(source, out)
    elif args.format == "safetensors-mxfp4":
        write_gpt_oss_folder(shape, out)
    elif args.format in LLAMA_CPP_QUANTIZED:
        source = output_path(args.shape, "gguf-f16", args.layers)
        if not source.exists():
            write_gguf(shape, "gguf-f16", source)
        quantize_with_llama_cpp(source, args.format, out)
    elif args.format.startswith("gguf"):
        write_gguf(shape, args.format, out)
    else:
        write_safetensors_folder(shape, out)


def write_through_transformers(shape_name: str, kind: str, layers: int | None, out: Path) -> None:
    """The safetensors folder from transformers; GGUF files converted from it by llama.cpp (F16,
    Q8_0), or quantized from the F16 file (Q4_0, Q4_K_M)."""
    if kind in MXFP4_FORMATS:
        raise SystemExit(f"--shape {shape_name} is not written as {kind}: only gpt-oss-20b is")
    if kind == "safetensors-bf16":
        write_transformers_folder(shape_name, layers, out)
        return
    repeated = REPEATED_LAYER_SHAPES.get(shape_name)
    if kind in LLAMA_CPP_QUANTIZED:
        source = output_path(shape_name, "gguf-q8_0" if repeated else "gguf-f16", layers)
        if not source.exists():
            write_through_transformers(shape_name, "gguf-q8_0" if repeated else "gguf-f16", layers, source)
        quantize_with_llama_cpp(source, kind, out)
        return
    if repeated:
        small_layers, dense_layers = repeated
        if kind != "gguf-q8_0":
            raise SystemExit(f"--shape {shape_name} is written as safetensors-bf16 (with --layers) or gguf-q8_0, gguf-q4_0, gguf-q4_k_m")
        if layers != small_layers:
            small = output_path(shape_name, kind, small_layers)
            if not small.exists():
                write_through_transformers(shape_name, kind, small_layers, small)
            repeat_layers(small, layers or TRANSFORMERS_SHAPES[shape_name]["num_hidden_layers"], dense_layers, out)
            return
    folder = output_path(shape_name, "safetensors-bf16", layers)
    if not folder.exists():
        write_transformers_folder(shape_name, layers, folder)
    convert_with_llama_cpp(folder, out, kind.removeprefix("gguf-"), options=CONVERTER_OPTIONS.get(shape_name, ()))


def repeat_layers(small: Path, layers: int, dense_layers: int, out: Path) -> None:
    """The GGUF file `small` (F32 and Q8_0 tensors) grown to `layers` blocks: those below `dense_layers`
    shaped as its own, the others as its last, every tensor with new random values."""
    source = gguf.GGUFReader(small)
    arch = source.fields["general.architecture"].contents()
    last = max(int(t.name.split(".")[1]) for t in source.tensors if t.name.startswith("blk."))
    layout = [(t.name, t) for t in source.tensors if not t.name.startswith("blk.")]
    for layer in range(layers):
        model = f"blk.{layer if layer < dense_layers else last}."
        layout += [(f"blk.{layer}." + t.name.removeprefix(model), t) for t in source.tensors if t.name.startswith(model)]
    partial = out.with_suffix(".partial")
    writer = gguf.GGUFWriter(partial, arch)
    # Not the small model's size label.
    for key, field in source.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.size_label"):
            continue
        value = layers if key == f"{arch}.block_count" else field.contents()
        writer.add_key_value(key, value, field.types[0], field.types[1] if len(field.types) > 1 else None)
    for name, tensor in layout:
        if tensor.tensor_type not in (gguf.GGMLQuantizationType.F32, Q8_0):
            raise RuntimeError(f"{small} holds {name} as {tensor.tensor_type.name}, not F32 or Q8_0")
        raw_dtype = Q8_0 if tensor.tensor_type == Q8_0 else None
        writer.add_tensor_info(name, tensor.data.shape, tensor.data.dtype, int(tensor.n_bytes), raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    values = Values()
    for name, tensor in layout:
        dims = tuple(int(d) for d in reversed(tensor.shape))  # outermost first
        writer.write_tensor_data(values.q8_0(dims) if tensor.tensor_type == Q8_0 else values.tensor(name, dims).astype(np.float32))
    writer.close()
    partial.replace(out)


if __name__ == "__main__":
    main()
