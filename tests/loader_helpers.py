"""Helpers shared by the loader's tests (tests/engine/test_hf_folders.py, test_hf_config_normalization.py,
test_gguf_files.py, test_default_model_file.py, test_quantized_gguf_as_stored.py): the tiny shape they
write and the config that normalizes from it, loading a model and comparing its tensors, and the pieces
of a GGUF file written as llama.cpp writes one (a SentencePiece vocabulary, where quantized blocks keep
their scales)."""

from __future__ import annotations

import numpy as np
from rsgl._core import ModelConfig
from rsgl.loader import load_model

TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=320,
    max_position_embeddings=512,
    rope_theta=50000.0,
    rms_norm_eps=1e-5,
)
# A config.json of that shape.
BASE_CONFIG = {"architectures": ["LlamaForCausalLM"], **TINY}
# The normalized scales of a model without any.
NO_SCALES = {
    "embedding": 1.0,
    "residual": 1.0,
    "attention": None,
    "logits_divisor": 1.0,
    "attention_logit_cap": None,
    "final_logit_cap": None,
    "query_temperature": None,
}


def load(path, **options):
    return load_model(str(path), progress=False, **options)


def normalized(raw_config: dict) -> dict:
    """The fields of the config the core normalizes a config.json's contents into."""
    return ModelConfig.from_hf(raw_config).fields


def loaded_tensors(model) -> dict[str, np.ndarray]:
    tensors = {}
    for name, values in model.tensors():
        assert values.dtype == np.float32 and values.flags.c_contiguous, name
        tensors[name] = values
    return tensors


def detokenize(model, ids: list[int]) -> str:
    """Decoding the way the engine's detokenizer does it, from the token table's bytes."""
    return b"".join(model.tokenizer.token_bytes(i) for i in ids).decode()


def state_dict(model) -> dict[str, np.ndarray]:
    return {name: value.float().numpy() for name, value in model.state_dict().items()}


def assert_tensors_equal(actual: dict, expected: dict, atol=0.0):
    assert list(actual) == [name for name in actual if name in expected] and set(actual) == set(expected)
    for name, values in expected.items():
        np.testing.assert_allclose(actual[name], values, rtol=0, atol=atol, err_msg=name)


SPM_PIECES = (
    ["\u2581" + word for word in ("hello", "world", "the", "test", "token", "he", "wor", "te", "th", "t", "h", "w")]
    + ["ll", "llo", "or", "ld", "in", "ing", "er", "st", "en", "izer", "iz"]
    + ["\u2581", *"abcdefghijklmnopqrstuvwxyzHW!.,\n"]
)


def spm_vocabulary():
    """(tokens, scores, token types) of a small SentencePiece vocabulary with byte fallback."""
    byte_tokens = [f"<0x{byte:02X}>" for byte in range(256)]
    tokens = ["<unk>", "<s>", "</s>", *byte_tokens, *SPM_PIECES, "<|user|>", "<|end|>"]
    types_ = [2, 3, 3] + [6] * 256 + [1] * len(SPM_PIECES) + [4, 3]
    scores = [0.0] * 259 + [-float(rank) for rank in range(len(SPM_PIECES))] + [0.0, 0.0]
    return tokens, scores, types_


# Where each quantized block keeps its f16 scales (and minimums): set to sane values so random
# blocks dequantize to finite numbers.
SCALE_OFFSETS = {
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
}  # fmt: skip
