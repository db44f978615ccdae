"""The tiny random Llama-family models the tests build with transformers (offline): their shape,
the builders, and byte-level tokenizers for them. torch and transformers are imported by the
builders, when a test calls them (one torch thread: tests leave a core to whatever else runs)."""

import json

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

TINY = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    # Larger than the usual 0.02 so logits are far apart and greedy choices are not coin flips.
    initializer_range=0.15,
    bos_token_id=1,
    eos_token_id=2,
)

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2: the tiny config's BOS and EOS


def byte_tokenizer() -> Tokenizer:
    """One token per byte (ids 3 to 258) after the special tokens; BOS put first by the post-processor."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {**{token: i for i, token in enumerate(SPECIAL_TOKENS)}, **{char: i + len(SPECIAL_TOKENS) for i, char in enumerate(alphabet)}}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tokenizer


def with_weights_rounded(model, dtype: str):
    """A copy of `model` whose matrices rsgl holds in a 16-bit `dtype` (every linear layer's and expert's,
    lm_head's and the embedding's) are rounded to it, computing in float32 as rsgl does."""
    import copy

    import torch

    rounded = copy.deepcopy(model)
    for module in rounded.modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            module.weight.data = module.weight.data.to(getattr(torch, dtype)).float()
    # Experts stored stacked (gpt-oss's `experts.gate_up_proj`, `experts.down_proj`), which rsgl splits into linear layers.
    for name, param in rounded.named_parameters():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            param.data = param.data.to(getattr(torch, dtype)).float()
    return rounded


SAMPLE_TEXTS = [
    "Hello world!",
    "The capital of France is Paris.",
    "def add(a, b):\n    return a + b  # 12345\n",
    "naïve café, Straße, Ελληνικά, 日本語のテキスト",
    "emoji 🙂🚀 and  double  spaces\t\ttabs",
    "\n\n\nnewlines\r\n",
    "<|im_start|>user\nhi<|im_end|>\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n",
    "  leading and trailing spaces  ",
    "1,000,000 + 3.14159 = x^2",
]


def train_byte_level_tokenizer(vocab_size=300) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(SAMPLE_TEXTS * 20, trainer)
    # Like Llama's tokenizer.json: the post-processor itself puts BOS first.
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tokenizer


DENSE_ARCHS = ("llama", "llama3", "mistral", "qwen2", "qwen3")
# Mixtral (top-2 of 4, renormalized), Qwen2-MoE (top-2 of 4 unnormalized, plus the gated shared
# expert) and Qwen3-MoE (top-2 of 4, norm_topk_prob, q/k norm).
MOE_ARCHS = ("mixtral", "qwen2_moe", "qwen3_moe")
MOE = dict(num_experts_per_tok=2, moe_intermediate_size=48)


def build_tiny(arch: str, path, **overrides):
    """Saves a random model of one of DENSE_ARCHS or MOE_ARCHS to `path`; returns the transformers model."""
    import torch
    import transformers

    torch.set_num_threads(1)

    llama3_rope = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
        "rope_theta": 500000.0,
    }
    classes = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {"rope_theta": 10000.0}),
        # Short original context so the 64-token prompts reach the scaled frequencies.
        "llama3": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {"rope_parameters": llama3_rope, "tie_word_embeddings": True}),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM, {"sliding_window": None}),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {}),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, {"head_dim": 16}),
        "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM, {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None}),
        "qwen2_moe": (transformers.Qwen2MoeConfig, transformers.Qwen2MoeForCausalLM, {**MOE, "num_experts": 4, "shared_expert_intermediate_size": 80}),
        "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM, {**MOE, "num_experts": 4, "norm_topk_prob": True, "head_dim": 16}),
    }
    config_cls, model_cls, extra = classes[arch]
    torch.manual_seed(sum(map(ord, arch)))
    config = config_cls(**{**TINY, **extra, **overrides})
    model = model_cls(config).eval().float()
    model.save_pretrained(path)
    return model


def build_byte_llama(path, model_overrides: dict | None = None, **tokenizer_config):
    """A tiny random Llama in `path` (its config changed by `model_overrides`) with one token per
    byte (tiny_models.byte_tokenizer) and `tokenizer_config` (beside its BOS and EOS); returns
    (transformers model, tokenizer)."""
    model = build_tiny("llama", path, vocab_size=len(SPECIAL_TOKENS) + 256, **(model_overrides or {}))
    tokenizer = byte_tokenizer()
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>", **tokenizer_config}))
    return model, tokenizer
