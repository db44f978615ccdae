"""Tiny random checkpoints of more model families, saved by transformers' own config and model classes.

`build_family(family, path)` writes config.json, model.safetensors (float32), and a byte-level
tokenizer.json / tokenizer_config.json to `path`, and returns the transformers model. The models
are tiny (tiny_models.TINY: hidden 64, 4 heads, 2 KV heads, head_dim 16) but each family's own
features occur: 8-token sliding windows, Gemma 3's global layer, SmolLM3's NoPE layer, partial
rotary, LongRoPE's long factors and Ministral 3's YaRN / Llama 4 query scaling past 64 tokens,
DeepSeek-V2/V3's latent attention (YaRN with DeepSeek's mscale_all_dim) and DeepSeek's and GLM-4.5's
expert routing (groups, scores with a correction bias, scaled weights: each changes the tokens).
Weights are random (std 0.15; Gemma's embeddings 0.05), norm weights and biases too (around their
neutral values), so a misplaced norm, a missed (1 + w), bias or multiplier changes the tokens.
"""

import json
from pathlib import Path

import torch
import transformers
from tiny_models import TINY, byte_tokenizer
from tokenizers import Tokenizer

NUL = "\u0100"  # byte 0 in the byte-level BPE alphabet

PHI3_ROPE = dict(rope_theta=10000.0, partial_rotary_factor=0.5)  # 8 rotary dims: 4 frequencies

HYBRID = dict(
    num_hidden_layers=5,
    head_dim=16,
    layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention", "linear_attention"],
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=8,
    linear_conv_kernel_dim=4,
)

# Granite 4: Mamba-2 in layers 0, 1 and 3 (4 heads of 16 in 2 groups sharing B and C, an 8-wide state), attention in
# 2 and 4 (the Hub's legacy layer names), Granite's multipliers.
GRANITE_HYBRID = dict(
    model_type="granitemoehybrid",
    num_hidden_layers=5,
    layer_types=["mamba", "mamba", "attention", "mamba", "attention"],
    mamba_n_heads=4,
    mamba_d_head=16,
    mamba_expand=1,
    mamba_n_groups=2,
    mamba_d_state=8,
    mamba_d_conv=4,
    shared_intermediate_size=48,
    embedding_multiplier=3.0,
    residual_multiplier=0.5,
    attention_multiplier=0.2,
    logits_scaling=2.0,
)

# DeepSeek's multi-head latent attention: one 32-wide latent and an 8-wide rotary key per token shared by 4 heads,
# whose non-rotary query/key parts (16) are wider than their values (12); MoE from layer 1 on.
MLA = dict(
    num_hidden_layers=3,
    num_key_value_heads=4,  # MLA has no KV groups: transformers repeats the expanded keys if this differs from the heads
    kv_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=12,
    moe_intermediate_size=24,
    first_k_dense_replace=1,
)
# DeepSeek-V2's softmax routing: 8 routed experts (2 per token) beside 2 shared ones, weights scaled by 1.5.
# scoring_func, which transformers does not read, as the Hub's config.json files have it: llama.cpp's converter
# writes the GGUF gating function from it (without it, llama.cpp takes softmax).
DEEPSEEK_V2 = dict(
    model_type="deepseek_v2",
    **MLA,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_shared_experts=2,
    routed_scaling_factor=1.5,
    scoring_func="softmax",
)
# DeepSeek-V3's sigmoid routing (GLM-4.5's too): experts chosen by score + e_score_correction_bias among the best
# groups (by their two best scores), weighted by their scores without the bias, renormalized and scaled.
SIGMOID_ROUTING = dict(n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, norm_topk_prob=True)

# Per family: the transformers model_type, and what differs from TINY.
OVERRIDES = {
    # Layers 0 and 2 slide, 1 and 3 are global. query_pre_attn_scalar stays head_dim: llama.cpp assumes so (GGUF has no field for it).
    "gemma2": dict(
        model_type="gemma2",
        num_hidden_layers=4,
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=8,
        attn_logit_softcapping=5.0,
        final_logit_softcapping=4.0,
    ),
    # Layers 0-4 slide, layer 5 is global: pattern 6, the one llama.cpp assumes for Gemma 3 GGUF files.
    "gemma3": dict(model_type="gemma3_text", num_hidden_layers=6, head_dim=16, query_pre_attn_scalar=16, sliding_window=8, sliding_window_pattern=6),
    "phi3": dict(model_type="phi3", original_max_position_embeddings=256, rope_parameters=dict(rope_type="default", **PHI3_ROPE)),
    # Prompts past 64 tokens switch to the long factors (and attention scales by sqrt(1 + ln 4 / ln 64)).
    "phi3_longrope": dict(
        model_type="phi3",
        original_max_position_embeddings=64,
        rope_parameters=dict(
            rope_type="longrope",
            **PHI3_ROPE,
            original_max_position_embeddings=64,
            short_factor=[1.0, 1.1, 1.3, 1.6],
            long_factor=[1.5, 3.0, 6.0, 12.0],
        ),
    ),
    "smollm3": dict(model_type="smollm3", num_hidden_layers=4),  # layer 3 has no RoPE (no_rope_layer_interval 4)
    "olmo2": dict(model_type="olmo2"),
    "glm4": dict(model_type="glm4", head_dim=16, partial_rotary_factor=0.5, attention_bias=True),
    "granite": dict(model_type="granite", embedding_multiplier=3.0, residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=2.0),
    # Ministral 3's default YaRN parameters, with a 64-token original context (factor 256 / 64).
    "ministral3": dict(
        model_type="ministral3",
        head_dim=16,
        rope_parameters=dict(
            rope_type="yarn",
            rope_theta=1e6,
            factor=4.0,
            original_max_position_embeddings=64,
            max_position_embeddings=256,
            beta_fast=32.0,
            beta_slow=1.0,
            mscale=1.0,
            mscale_all_dim=1.0,
            llama_4_scaling_beta=0.1,
        ),
    ),
    # Alternating 8-token sliding and global layers, attention sinks, 4 experts (2 per token) with biases and the
    # clamped SwiGLU, YaRN past 64 tokens.
    "gpt_oss": dict(
        model_type="gpt_oss",
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=8,
        rope_parameters=dict(
            rope_type="yarn", rope_theta=150000.0, factor=4.0, original_max_position_embeddings=64, beta_fast=32.0, beta_slow=1.0, truncate=False
        ),
    ),
    # Gated DeltaNet in layers 0-2 and 4 (a q/k head shared by two value heads, value heads narrower than keys),
    # gated attention in layer 3 (4 of its 16 dims rotary).
    "qwen3_5": dict(model_type="qwen3_5_text", **HYBRID),
    # The same with 4 experts (2 per token) beside a gated shared expert in every layer.
    "qwen3_next": dict(
        model_type="qwen3_next",
        **HYBRID,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        norm_topk_prob=True,
    ),
    # With rope, and 4 experts (2 per token) beside the shared MLP in every layer.
    "granitemoehybrid": dict(**GRANITE_HYBRID, position_embedding_type="rope", num_local_experts=4, num_experts_per_tok=2, intermediate_size=32),
    # Without rope ("nope", as Granite 4.0-H) and without experts: the shared MLP alone.
    "granitemoehybrid_dense": dict(**GRANITE_HYBRID, position_embedding_type="nope", num_local_experts=0),
    # Softmax routing to the best 2 of 8 experts within the best 1 of 2 groups (by their best score: with as many groups
    # kept as experts chosen, the limit could not change the choice); YaRN past 64 tokens, with DeepSeek's
    # mscale_all_dim, which also scales the softmax by mscale(4, 0.8)^2.
    "deepseek_v2": dict(
        **DEEPSEEK_V2,
        q_lora_rank=None,
        topk_method="group_limited_greedy",
        n_group=2,
        topk_group=1,
        rope_parameters=dict(
            rope_type="yarn",
            rope_theta=10000.0,
            factor=4.0,
            original_max_position_embeddings=64,
            beta_fast=32.0,
            beta_slow=1.0,
            mscale=1.0,
            mscale_all_dim=0.8,
        ),
    ),
    # Queries through a 24-wide low-rank projection and its norm; plain top-2 routing, plain rope.
    "deepseek_v2_qlora": dict(**DEEPSEEK_V2, q_lora_rank=24, topk_method="greedy", n_group=1, topk_group=1),
    # The best 2 of 8 experts within the best 2 of 4 groups, scaled by 2.5; rotary dims in interleaved pairs.
    "deepseek_v3": dict(
        model_type="deepseek_v3",
        **MLA,
        **SIGMOID_ROUTING,
        q_lora_rank=24,
        n_group=4,
        topk_group=2,
        routed_scaling_factor=2.5,
        scoring_func="sigmoid",
        topk_method="noaux_tc",
        rope_interleave=True,
        num_mtp_layers=0,  # transformers builds no multi-token prediction layers
    ),
    # GLM-4.5: grouped-query attention (q/k/v biases, per-head q/k norms, half the dims rotary) and sigmoid routing
    # within the best 1 of 2 groups.
    "glm4_moe": dict(
        model_type="glm4_moe",
        **SIGMOID_ROUTING,
        num_hidden_layers=3,
        first_k_dense_replace=1,
        head_dim=16,
        partial_rotary_factor=0.5,
        attention_bias=True,
        use_qk_norm=True,
        moe_intermediate_size=24,
        n_group=2,
        topk_group=1,
        routed_scaling_factor=1.7,
        num_mtp_layers=0,
    ),
    # A family rsgl does not run (LayerNorm, an ungated MLP): it must be refused with a clear error.
    "starcoder2": dict(model_type="starcoder2"),
}
FAMILIES = tuple(OVERRIDES)

# Parameters re-drawn as normal(mean, std) by name suffix, beyond the norm weights and biases every family gets.
# Gemma scales embeddings by sqrt(64) = 8, ties them to the LM head, and normalizes each attention output
# (the context's mean, under flat attention): at std 0.15 every prompt generates one token over and over.
# Smaller embeddings and sharper attention give varied tokens.
# gpt-oss: its expert biases (`*_proj_bias`) are not `.bias`; sinks around 1 take a real share of each softmax;
# gate/up at std 0.6 put many values past the SwiGLU's clamp at 7, so a missed sink or clamp changes the tokens.
GRANITE_MAMBA_INITS = {"mamba.A_log": (0.0, 0.5), "mamba.dt_bias": (0.0, 0.5), "mamba.D": (1.0, 0.3)}
FAMILY_INITS = {
    "gemma2": {"embed_tokens.weight": (0.0, 0.05), "q_proj.weight": (0.0, 0.45)},
    "gemma3": {"embed_tokens.weight": (0.0, 0.05), "q_norm.weight": (2.0, 0.1)},  # q scaled by 1 + 2: q_norm flattens a larger q_proj
    "gpt_oss": {"gate_up_proj": (0.0, 0.6), "_proj_bias": (0.0, 0.15), "sinks": (1.0, 1.0)},
    # The DeltaNet's gated norm scales by its weight (the other norms by 1 + weight).
    "qwen3_5": {"linear_attn.norm.weight": (1.0, 0.1)},
    "qwen3_next": {"linear_attn.norm.weight": (1.0, 0.1)},
    # Mamba-2's decay rates, step biases and skips spread around transformers' initial values.
    "granitemoehybrid": GRANITE_MAMBA_INITS,
    "granitemoehybrid_dense": GRANITE_MAMBA_INITS,
    # Wider experts (transformers holds them stacked, and saves them one by one): at std 0.15 the shared experts and the
    # dense layer set the tokens, and the prompt of one token repeats one token.
    "deepseek_v2": {"experts.gate_up_proj": (0.0, 0.4)},
    # A buffer, not a parameter (transformers leaves it 0): spread so that it changes which experts run.
    "deepseek_v3": {"e_score_correction_bias": (0.0, 0.1)},
    "glm4_moe": {"e_score_correction_bias": (0.0, 0.1)},
}
# GLM's special tokens, which llama.cpp's GLM-4.5 converter looks up (for its BOS, EOT, UNK and EOM).
FAMILY_SPECIAL_TOKENS = {"glm4_moe": ("<|endoftext|>", "[gMASK]", "<|user|>", "<|observation|>")}
# Families whose RMS norms scale by (1 + weight).
ZERO_CENTERED_NORMS = ("gemma2", "gemma3", "qwen3_5", "qwen3_next")


def zoo_tokenizer() -> Tokenizer:
    """tiny_models.byte_tokenizer() plus one merge, NUL NUL (id 259): a GGUF file cannot store an empty
    merge list, and llama.cpp and rsgl refuse byte-level BPE without one. Text that has no two NUL
    bytes in a row still gets one token per byte."""
    spec = json.loads(byte_tokenizer().to_str())
    spec["model"]["vocab"][NUL + NUL] = len(spec["model"]["vocab"])
    spec["model"]["merges"] = [[NUL, NUL]]
    return Tokenizer.from_str(json.dumps(spec))


def build_family(family: str, path, special_tokens: tuple[str, ...] = (), **config_overrides):
    """Saves a random model of one of FAMILIES, and its tokenizer (with `special_tokens` added after
    its own and the family's), to `path`; returns the transformers model."""
    path = Path(path)
    overrides = {**OVERRIDES[family], **config_overrides}
    model_type = overrides.pop("model_type")
    tokenizer = zoo_tokenizer()
    tokenizer.add_special_tokens([*FAMILY_SPECIAL_TOKENS.get(family, ()), *special_tokens])
    config = transformers.AutoConfig.for_model(model_type, **{**TINY, "vocab_size": tokenizer.get_vocab_size(), "pad_token_id": 0, **overrides})
    torch.manual_seed(sum(map(ord, family)))
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    neutral = 0.0 if family in ZERO_CENTERED_NORMS else 1.0
    inits = {**FAMILY_INITS.get(family, {}), "norm.weight": (neutral, 0.1), ".bias": (0.0, config.initializer_range)}
    with torch.no_grad():
        for name, weight in [*model.named_parameters(), *model.named_buffers()]:
            for suffix, (mean, std) in inits.items():
                if name.endswith(suffix):
                    weight.normal_(mean, std)
                    break
    model.save_pretrained(path)
    tokenizer.save(str(path / "tokenizer.json"))
    # The class named, or AutoTokenizer picks one by model type (GemmaTokenizer rebuilds the tokenizer and adds tokens).
    (path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>"}))
    return model
