"""LoRA adapters (PEFT folders) over more architectures than test_lora.py's: checkpoints that fuse projections (Phi-3's
qkv_proj and gate_up_proj, GLM-4's gate_up_proj), vision-language models' language layers (SmolVLM, Gemma 3,
Qwen2.5-VL), mixture-of-experts models' attention, dense MLP and shared-expert layers (Qwen2-MoE's gated shared
expert, GLM-4.5's dense first layer and shared experts, Mixtral's attention) and hybrid models' attention layers and
MLPs (Qwen3.5's and Qwen3-Next's gated attention, Granite 4's shared MLP). Greedy tokens of the base model and two
adapters submitted together equal transformers + peft's for each alone; adapters of what rsgl does not apply (a vision
tower, routed experts, recurrent layers) are refused naming it."""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import pytest
import rsgl
from lora_adapters import Built, family_builder, greedy, save_adapter
from tiny_models import build_tiny
from vision_models import build_tiny_gemma3, build_tiny_qwen2_5_vl, build_tiny_smolvlm
from zoo_models import build_family

GREEDY = {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True}
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]


def text_layers(text_model: str, modules: list[str]) -> str:
    """A target_modules pattern (PEFT full-matches it against module names) of `modules` in the layers of `text_model`
    alone, not in the vision tower's."""
    return rf"{re.escape(text_model)}\.layers\.\d+\.\w+\.({'|'.join(modules)})"


# Per family: its builder, and adapter a's and b's target_modules (a at rank 8; b at rank 4 with rsLoRA's scaling).
FAMILIES: dict[str, tuple[Callable, object, object]] = {
    "phi3": (lambda path: build_family("phi3", path), ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"], ["qkv_proj"]),
    "glm4": (lambda path: build_family("glm4", path), [*ATTENTION, "gate_up_proj", "down_proj"], ["q_proj", "gate_up_proj"]),
    "smolvlm": (build_tiny_smolvlm, text_layers("model.text_model", ATTENTION + MLP), text_layers("model.text_model", ["q_proj", "v_proj"])),
    "gemma3": (build_tiny_gemma3, text_layers("model.language_model", ATTENTION + MLP), text_layers("model.language_model", ["k_proj", "down_proj"])),
    "qwen2_5_vl": (build_tiny_qwen2_5_vl, text_layers("model.language_model", ATTENTION + MLP), text_layers("model.language_model", ["q_proj", "up_proj"])),
    # MLP's names are the shared expert's projections (transformers holds the routed experts stacked, not as modules).
    "qwen2_moe": (lambda path: build_tiny("qwen2_moe", path), ATTENTION + MLP, ["q_proj", "v_proj"]),
    # Layer 0 is dense; layers 1 and 2 have routed experts and shared ones.
    "glm4_moe": (lambda path: build_family("glm4_moe", path), ATTENTION + MLP, ["o_proj", "down_proj"]),
    "mixtral": (lambda path: build_tiny("mixtral", path), ATTENTION, ["q_proj", "v_proj"]),
    # Hybrids: Gated DeltaNet layers beside a gated attention layer (q_proj's rows: each head's q, then its gate), with
    # dense MLPs (Qwen3.5) or experts and a shared one (Qwen3-Next); Granite 4's Mamba-2 layers beside attention ones,
    # with its shared MLP (input_linear: gate's rows, then up's).
    "qwen3_5": (lambda path: build_family("qwen3_5", path), ATTENTION + MLP, ["q_proj", "down_proj"]),
    "qwen3_next": (lambda path: build_family("qwen3_next", path), ATTENTION + MLP, ["q_proj", "gate_proj"]),
    "granitemoehybrid_dense": (
        lambda path: build_family("granitemoehybrid_dense", path),
        [*ATTENTION, "input_linear", "output_linear"],
        ["v_proj", "input_linear"],
    ),
}


def prompt(length: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 256, size=length).tolist()


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Callable[[str], Built]:
    def adapter_configs(family: str) -> dict[str, dict]:
        _, a_targets, b_targets = FAMILIES[family]
        return {"a": dict(r=8, lora_alpha=16, target_modules=a_targets), "b": dict(r=4, lora_alpha=6, use_rslora=True, target_modules=b_targets)}

    return family_builder(tmp_path_factory, lambda family, folder: FAMILIES[family][0](folder), adapter_configs)


def engine_for(base_path: str, folders: dict[str, str]) -> rsgl.Engine:
    return rsgl.Engine(base_path, dtype="float32", threads=2, max_total_tokens=2048, progress=False, lora_paths=folders)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_base_and_two_adapters_in_one_batch_match_peft(built, family):
    base_path, folders, models = built(family)
    shared = prompt(9, 0)
    cases = [(shared, None), (shared, "a"), (shared, "b"), (prompt(5, 1), "b"), (prompt(14, 2), None), (prompt(3, 3), "a")]
    with engine_for(base_path, folders) as engine:
        outs = engine.generate(input_ids=[ids for ids, _ in cases], sampling_params=GREEDY, lora_path=[lora for _, lora in cases])
    for (ids, lora), out in zip(cases, outs):
        assert out["output_ids"] == greedy(models[lora], ids, GREEDY["max_new_tokens"]), lora
    # The adapters change what the model says (else this test could not fail).
    assert len({tuple(out["output_ids"]) for out in outs[:3]}) == 3


# Modules of the vision tower that a list of module names reaches as well as the language model's.
VISION_TARGETS = {"smolvlm": ["q_proj", "v_proj"], "gemma3": ["k_proj"], "qwen2_5_vl": ["gate_proj"]}


@pytest.mark.parametrize("family", list(VISION_TARGETS))
def test_an_adapter_of_the_vision_tower_is_refused_naming_it(built, family, tmp_path):
    base_path, _, models = built(family)
    save_adapter(models[None], tmp_path / "tower", 0, r=4, lora_alpha=8, target_modules=VISION_TARGETS[family])
    tower = r"\(base_model\.model\.model\.(vision_model|vision_tower|visual)\."
    with pytest.raises(rsgl.ModelLoadError, match=r'LoRA adapter "tower": it updates the vision tower or its projector ' + tower):
        engine_for(base_path, {"tower": str(tmp_path / "tower")})


@pytest.mark.parametrize("family", ["qwen3_5", "granitemoehybrid_dense"])
def test_an_adapter_of_recurrent_layers_is_refused_naming_them(built, family, tmp_path):
    base_path, _, models = built(family)
    # Every linear layer but the LM head: Gated DeltaNet's and Mamba-2's projections too.
    save_adapter(models[None], tmp_path / "recurrent", 0, r=4, lora_alpha=8, target_modules="all-linear")
    layer = r"\(base_model\.model\.model\.layers\.0\.(linear_attn|mamba)\."
    with pytest.raises(rsgl.ModelLoadError, match=r'LoRA adapter "recurrent": it updates a recurrent layer\'s projections ' + layer):
        engine_for(base_path, {"recurrent": str(tmp_path / "recurrent")})


def test_an_adapter_of_routed_experts_is_refused_naming_them(built, tmp_path):
    base_path, _, models = built("glm4_moe")
    # As PEFT makes it (see module_targets_kept): the MLP's names become target_parameters of the stacked routed experts.
    save_adapter(models[None], tmp_path / "experts", 0, r=4, lora_alpha=8, target_modules=["q_proj", "gate_proj", "up_proj", "down_proj"])
    parameters = r'\(\[.*"down_proj".*\], target_parameters\)'
    with pytest.raises(rsgl.ModelLoadError, match=r'LoRA adapter "experts": it updates parameters ' + parameters + ", such as routed experts"):
        engine_for(base_path, {"experts": str(tmp_path / "experts")})
