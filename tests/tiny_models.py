"""The shape of the tiny random Llama-family models the tests build with transformers (offline),
and a byte-level tokenizer for them."""

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

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
