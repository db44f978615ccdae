"""Writes the reference data of rust/engine/tests/reference_logits.rs: a tiny random Llama built by
transformers from a config (offline), saved as float32 safetensors with its config.json; the
config as rsgl's loader normalizes it (rsgl_config.json, what the Rust engine reads); and
transformers' logits at every position of a fixed prompt (logits.json).

    python tests/data/make_reference_logits.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import transformers
from rsgl._core import ModelConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for tiny_models
from tiny_models import TINY  # noqa: E402

OUTPUT = Path(__file__).resolve().parents[2] / "rust" / "engine" / "tests" / "data" / "tiny-llama"
CONFIG = {**TINY, "rope_theta": 10000.0}
PROMPT = [1, 17, 200, 43, 5, 255, 88, 3, 121, 64, 9, 230, 77, 150, 31, 4]


def main() -> None:
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).eval().float()
    OUTPUT.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(OUTPUT)
    (OUTPUT / "generation_config.json").unlink(missing_ok=True)  # not read by the test
    hf_config = json.loads((OUTPUT / "config.json").read_text())
    (OUTPUT / "rsgl_config.json").write_text(json.dumps(ModelConfig.from_hf(hf_config).fields, indent=1) + "\n")
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT])).logits[0]
    # repr of a float32 widened to float64 round-trips it exactly.
    reference = {"transformers": transformers.__version__, "prompt": PROMPT, "logits": [[float(v) for v in row] for row in logits]}
    (OUTPUT / "logits.json").write_text(json.dumps(reference) + "\n")
    print(f"wrote {OUTPUT}")


if __name__ == "__main__":
    main()
