"""PEFT LoRA adapters of the tiny models (tests/tiny_models.py), made and run by `peft` for the LoRA
tests to compare with. torch and peft are imported by the functions, when a test calls them."""

from __future__ import annotations

import copy

ALL_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Adapter a: every projection at rank 8; adapter b: q and v at rank 4 with rsLoRA's scaling (alpha / sqrt(r)).
ADAPTERS = {
    "a": dict(r=8, lora_alpha=16, target_modules=ALL_PROJECTIONS),
    "b": dict(r=4, lora_alpha=6, use_rslora=True, target_modules=["q_proj", "v_proj"]),
}


def save_adapter(base, path, seed: int, **config) -> None:
    """A PEFT adapter of the transformers model `base` with random A and B (init_lora_weights=False:
    B is not zero, so the adapter changes outputs), saved in `path` as PEFT's save_pretrained does."""
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    peft_model = get_peft_model(copy.deepcopy(base), LoraConfig(init_lora_weights=False, lora_dropout=0.0, **config))
    peft_model.save_pretrained(path)


def with_adapter(base, path):
    """A copy of `base` running the PEFT adapter in `path`."""
    from peft import PeftModel

    return PeftModel.from_pretrained(copy.deepcopy(base), path).eval()


def save_adapters(base, folder_of) -> tuple[dict[str, str], dict]:
    """ADAPTERS saved in `folder_of(name)`: ({name: folder}, {None: base, name: base with the adapter})."""
    folders, models = {}, {None: base}
    for seed, (name, config) in enumerate(ADAPTERS.items()):
        folder = folder_of(name)
        save_adapter(base, folder, seed, **config)
        folders[name], models[name] = str(folder), with_adapter(base, folder)
    return folders, models


def greedy(model, ids: list[int], n: int) -> list[int]:
    """Plain argmax decoding of `n` tokens after `ids`."""
    import torch

    seq = list(ids)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(ids) :]
