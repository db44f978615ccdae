"""LoRA adapters (PEFT folders) over models with multi-head latent attention: DeepSeek-V2 with its q from q_proj, and
DeepSeek-V2 and V3 with theirs through q_a_proj, its norm and q_b_proj (tests/zoo_models.py's tiny checkpoints). The
adapters update the attention's projections (kv_b_proj's update too, which rsgl applies in the absorbed form that decode
steps and short prefill chunks run, and in the expanded form of long prefill chunks), the dense first layer's MLP and the
shared experts. Greedy tokens of the base model and two adapters submitted together equal transformers + peft's for
each alone, over the Hugging Face folder and over the GGUF file llama.cpp's converter writes of it (which splits
kv_b_proj per head); a GGUF LoRA file llama.cpp's converter writes gives its PEFT folder's tokens. (Adapters of routed
experts are refused as test_lora_archs.py checks over GLM-4.5.)"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from gguf_convert import convert, convert_lora
from lora_adapters import Built, family_builder, greedy, module_targets_kept, save_adapter, with_adapter
from test_lora_archs import GREEDY, engine_for, prompt
from zoo_models import build_family

FAMILIES = ("deepseek_v2", "deepseek_v2_qlora", "deepseek_v3")
# Names that match no module of a family (q_proj where q goes through a low rank, q_a_proj and q_b_proj where it does
# not) are harmless to PEFT and rsgl alike.
LATENT_ATTENTION = ["q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]
# Adapter a: the attention's and MLP's projections at rank 8; adapter b: q's up-projection (or q_proj) and kv_b_proj at
# rank 4 with rsLoRA's scaling.
ADAPTERS = {
    "a": dict(r=8, lora_alpha=16, target_modules=LATENT_ATTENTION + MLP),
    "b": dict(r=4, lora_alpha=6, use_rslora=True, target_modules=["q_proj", "q_b_proj", "kv_b_proj"]),
}
# The tiny models' chunks of at least 25 tokens attend in the expanded form (rsgl's expand_from_tokens for a 32-wide
# latent, 16 + 8 wide q heads and values of 12); shorter ones, and decode steps, in the absorbed form.
LONG, SHORT = 30, 9


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Callable[[str], Built]:
    return family_builder(tmp_path_factory, build_family, lambda family: ADAPTERS)


def assert_match_peft(model_path, folders: dict[str, str], models: dict) -> None:
    """The base model and the two adapters, over the model at `model_path`, each in one batch over a long and a short
    prompt: greedy tokens equal to transformers + peft's."""
    long, short = prompt(LONG, 0), prompt(SHORT, 1)
    cases = [(long, None), (long, "a"), (long, "b"), (short, "a"), (short, "b"), (prompt(3, 2), None), (prompt(27, 3), "b")]
    with engine_for(str(model_path), folders) as engine:
        outs = engine.generate(input_ids=[ids for ids, _ in cases], sampling_params=GREEDY, lora_path=[lora for _, lora in cases])
    for (ids, lora), out in zip(cases, outs):
        assert out["output_ids"] == greedy(models[lora], ids, GREEDY["max_new_tokens"]), (len(ids), lora)
    # The adapters change what the model says (else this test could not fail).
    assert len({tuple(out["output_ids"]) for out in outs[:3]}) == 3


@pytest.mark.parametrize("family", FAMILIES)
def test_base_and_two_adapters_in_one_batch_match_peft(built, family):
    base_path, folders, models = built(family)
    assert_match_peft(base_path, folders, models)


def test_adapters_over_the_gguf_file_of_the_base_model(built, tmp_path):
    """llama.cpp's converter splits kv_b_proj into each head's key (transposed) and value up-projections; a kv_b_proj
    update applies over them as over kv_b_proj."""
    base_path, folders, models = built("deepseek_v3")
    assert_match_peft(convert(base_path, tmp_path / "deepseek_v3.gguf"), folders, models)


def test_a_gguf_lora_file_gives_the_tokens_of_its_peft_folder(built, tmp_path):
    """llama.cpp's convert_lora_to_gguf.py writes the updates of q_a_proj, q_b_proj, kv_a_proj_with_mqa, o_proj and the
    MLPs (the shared experts' as ffn_*_shexp); a kv_b_proj update it does not convert (it raises NotImplementedError)."""
    base_path, _, models = built("deepseek_v3")
    with module_targets_kept():
        save_adapter(models[None], tmp_path / "c", 2, r=8, lora_alpha=16, target_modules=["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "o_proj", *MLP])
        want = {None: models[None], "c": with_adapter(models[None], tmp_path / "c")}
    file = convert_lora(tmp_path / "c", base_path, tmp_path / "c.gguf")
    cases = [(prompt(LONG, 0), "c"), (prompt(SHORT, 1), "c"), (prompt(SHORT, 1), None)]
    with engine_for(base_path, {"c": str(file)}) as engine:
        outs = engine.generate(input_ids=[ids for ids, _ in cases], sampling_params=GREEDY, lora_path=[lora for _, lora in cases])
    for (ids, lora), out in zip(cases, outs):
        assert out["output_ids"] == greedy(want[lora], ids, GREEDY["max_new_tokens"]), (len(ids), lora)
    assert outs[1]["output_ids"] != outs[2]["output_ids"]
