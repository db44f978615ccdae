"""PEFT LoRA adapters of the tiny models (tests/tiny_models.py), made and run by `peft` for the LoRA
tests to compare with. torch and peft are imported by the functions, when a test calls them."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

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


@contextmanager
def module_targets_kept() -> Iterator[None]:
    """PEFT as it makes and loads adapters of models whose layers transformers 5 holds as transformers 4 did. Over the
    mixture-of-experts models whose experts transformers 5 stacks (Qwen2-MoE, GLM-4.5, Qwen3-Next, Mixtral, ...), PEFT
    rewrites every gate_proj, up_proj and down_proj of target_modules, whatever module it names, into target_parameters
    of the stacked routed experts (to load adapters trained on transformers 4's per-expert modules); the names then miss
    the shared experts and dense MLPs they name, as an adapter trained on transformers 4 with those alone updates them."""
    from unittest import mock

    with mock.patch("peft.utils.transformers_weight_conversion.convert_peft_config_for_transformers", lambda *args, **kwargs: None):
        yield


# A family's (base folder, {name: adapter folder}, {None: transformers model, name: the model with that adapter}).
Built = tuple[str, dict[str, str], dict]


def family_builder(tmp_path_factory, make_base: Callable[[str, Any], Any], adapter_configs: Callable[[str], dict[str, dict]]) -> Callable[[str], Built]:
    """`build(family)`: the family's Built, made on first use: the base model by `make_base(family, folder)`, its
    adapters by peft from `adapter_configs(family)` ({name: LoraConfig arguments}), with module_targets_kept."""
    cache: dict[str, Built] = {}

    def build(family: str) -> Built:
        if family not in cache:
            base_path = tmp_path_factory.mktemp(f"lora-{family}")
            base = make_base(family, base_path)
            folders, models = {}, {None: base}
            with module_targets_kept():
                for seed, (name, config) in enumerate(adapter_configs(family).items()):
                    folder = tmp_path_factory.mktemp(f"lora-{family}-{name}")
                    save_adapter(base, folder, seed, **config)
                    folders[name], models[name] = str(folder), with_adapter(base, folder)
            cache[family] = (str(base_path), folders, models)
        return cache[family]

    return build
