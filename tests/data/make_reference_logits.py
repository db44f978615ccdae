"""Writes the reference data of rust/engine/tests/reference_logits.rs: a tiny random Llama built by
transformers from a config (offline), saved as float32 safetensors with its config.json; the
config as rsgl's loader normalizes it (rsgl_config.json, what the Rust engine reads); and
transformers' logits at every position of a fixed prompt (logits.json).

    python tests/data/make_reference_logits.py
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers
from rsgl.loader.hf import normalize_config

OUTPUT = Path(__file__).resolve().parents[2] / "rust" / "engine" / "tests" / "data" / "tiny-llama"
CONFIG = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    # Larger than the usual 0.02 so the logits are spread out, not all near zero.
    initializer_range=0.15,
    bos_token_id=1,
    eos_token_id=2,
)
PROMPT = [1, 17, 200, 43, 5, 255, 88, 3, 121, 64, 9, 230, 77, 150, 31, 4]


def main() -> None:
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).eval().float()
    OUTPUT.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(OUTPUT)
    (OUTPUT / "generation_config.json").unlink(missing_ok=True)  # not read by the test
    hf_config = json.loads((OUTPUT / "config.json").read_text())
    (OUTPUT / "rsgl_config.json").write_text(json.dumps(normalize_config(hf_config), indent=1) + "\n")
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT])).logits[0]
    # repr of a float32 widened to float64 round-trips it exactly.
    reference = {"transformers": transformers.__version__, "prompt": PROMPT, "logits": [[float(v) for v in row] for row in logits]}
    (OUTPUT / "logits.json").write_text(json.dumps(reference) + "\n")
    print(f"wrote {OUTPUT}")


if __name__ == "__main__":
    main()
