"""The model families beside Llama and Qwen, from tiny random checkpoints transformers' own classes
wrote (tests/zoo_models.py): float32 greedy tokens identical to transformers' for prompts of 1, 11
and 81 tokens (past Gemma's 8-token sliding windows and Ministral 3's 64-token original context),
alone and batched, again with their prefixes cached, from the Hugging Face folder and from the GGUF
file llama.cpp's converter writes of it; families rsgl does not run yet are refused with an error naming
what it runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import rsgl
import safetensors.torch
import torch
import transformers
from gguf_convert import convert
from loader_helpers import normalized
from rsgl import _core
from tiny_models import with_weights_rounded
from zoo_models import FAMILIES, build_family

SUPPORTED = ("gemma2", "gemma3", "glm4", "gpt_oss", "granite", "ministral3", "olmo2", "phi3", "phi3_longrope", "smollm3")
# Hybrid families, whose recurrent layers tests/engine/test_hybrid.py covers.
HYBRID = ("qwen3_5", "qwen3_next", "granitemoehybrid", "granitemoehybrid_dense")
# Multi-head latent attention and DeepSeek-style routing, which tests/engine/test_mla_moe.py covers.
MLA_MOE = ("deepseek_v2", "deepseek_v2_qlora", "deepseek_v3", "glm4_moe")
# Families rsgl reads from GGUF files as well.
GGUF_SUPPORTED = SUPPORTED
NEW_TOKENS = 12
PROMPTS = [[1], [1, *range(60, 70)], [1, *range(3, 83)]]
# rsgl rotates positions below LongRoPE's original context (64 here) with its short factors and those from
# there on with its long ones. transformers rotates a whole sequence with one set: once it passes 64 tokens,
# it drops its cache and rotates every position again with the long factors (a prefix cache cannot). So the
# LongRoPE checkpoint is compared on prompts that stay below 64 tokens, then with its original context set
# to 0, where both rotate every position with the long factors.
SHORT_PROMPTS = [*PROMPTS[:2], [1, *range(3, 40)]]


@pytest.fixture(scope="module", params=SUPPORTED)
def family(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return request.param, path, build_family(request.param, path)


def transformers_greedy(model, ids: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(ids) :].tolist()


def rsgl_greedy(model_path, prompts, **options) -> tuple[list[list[int]], list[list[int]]]:
    """Each prompt's greedy tokens alone, then all of them batched (their prefixes cached by then).
    Float32 pages unless `options` say otherwise: parity measures the weights' numerics."""
    params = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
    with rsgl.Engine(str(model_path), threads=1, progress=False, **{"kv_cache_dtype": "float32", **options}) as engine:
        alone = [engine.generate(input_ids=ids, sampling_params=params)["output_ids"] for ids in prompts]
        batched = [out["output_ids"] for out in engine.generate(input_ids=prompts, sampling_params=params)]
        assert engine.get_server_info()["cache_hit_tokens"] > 0  # the batch reused the prompts' cached pages
    return alone, batched


def test_float32_greedy_tokens_match_transformers(family):
    name, path, model = family
    prompts = SHORT_PROMPTS if name == "phi3_longrope" else PROMPTS
    want = [transformers_greedy(model, ids) for ids in prompts]
    alone, batched = rsgl_greedy(path, prompts, dtype="float32")
    assert alone == want
    assert batched == want
    if name in GGUF_SUPPORTED:
        gguf_file = convert(path, path.parent / f"{name}.gguf")
        assert rsgl_greedy(gguf_file, prompts, dtype="float32") == (want, want)


def test_gpt_oss_gguf_config_is_its_folders(tmp_path):
    """What a gpt-oss GGUF file cannot say (its YaRN's unrounded blend, which layers slide) comes from the
    architecture: rsgl reads the file llama.cpp's converter writes as the folder it came from."""
    build_family("gpt_oss", tmp_path / "gpt_oss")
    from_folder = normalized(json.loads((tmp_path / "gpt_oss" / "config.json").read_text()))
    from_gguf = _core.ModelConfig.from_gguf(convert(tmp_path / "gpt_oss", tmp_path / "gpt_oss.gguf")).fields
    assert from_gguf["rope_scaling"]["truncate"] is False and from_gguf["sliding_window"]["layers"] == [0]
    assert from_gguf == from_folder | {"pooling": None}


def test_bfloat16_weights_match_the_rounded_model(family):
    """bf16 weights against transformers with the same weights rounded; bf16 dot products (AVX-512 BF16, Arm BF16)
    round activations too, where the tolerance is wider, as in test_parity."""
    name, path, model = family
    rounded = with_weights_rounded(model, "bfloat16")
    prompts = SHORT_PROMPTS if name == "phi3_longrope" else PROMPTS
    with rsgl.Engine(str(path), dtype="bfloat16", kv_cache_dtype="float32", threads=1, progress=False) as engine:
        rounds_activations = engine.get_server_info()["kernels"] != "avx2"
        for ids in prompts:
            out = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 0}, return_prompt_logits=True)
            got = np.array(out["meta_info"]["prompt_logits"], dtype=np.float32)
            with torch.no_grad():
                want = rounded(torch.tensor([ids])).logits[0, -1].numpy()
            assert np.abs(got - want).max() <= (3e-2 * np.abs(want).max() if rounds_activations else 1e-3)


def test_longrope_long_factors_match_transformers(tmp_path):
    build_family("phi3_longrope", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    # Its factor and attention factor given, as they would derive from the original context.
    config["rope_parameters"].update(original_max_position_embeddings=0, factor=4.0, attention_factor=1.25)
    config["original_max_position_embeddings"] = 0
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    want = [transformers_greedy(model, ids) for ids in PROMPTS]
    assert rsgl_greedy(tmp_path, PROMPTS, dtype="float32") == (want, want)


def gemma3_vision_language_checkpoint(path: Path, layout: str) -> transformers.Gemma3ForConditionalGeneration:
    """The tiny Gemma 3 text model inside a Gemma3ForConditionalGeneration with a tiny SigLIP tower, saved by
    transformers 5 (`layout="transformers5"`) or as the Hub's Gemma 3 4B-27B folders are (transformers 4: weights
    under `language_model.model.*`, a text_config that lists only the keys differing from Gemma3TextConfig's)."""
    text = build_family("gemma3", path)
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14)
    # Gemma3TextConfig's query_pre_attn_scalar (256), which the transformers 4 layout then leaves to the defaults.
    text_config = text.config.to_dict() | {"query_pre_attn_scalar": 256}
    config = transformers.Gemma3Config(text_config=text_config, vision_config=vision, mm_tokens_per_image=4)
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    model.model.language_model.load_state_dict(text.model.state_dict())
    model.lm_head.weight = model.model.language_model.embed_tokens.weight
    (path / "model.safetensors").unlink()
    model.save_pretrained(path)
    if layout == "transformers4":
        weights = safetensors.torch.load_file(path / "model.safetensors")
        renamed = {
            name.replace("model.language_model.", "language_model.model.").replace("model.vision_tower.", "vision_tower."): w for name, w in weights.items()
        }
        safetensors.torch.save_file(renamed, path / "model.safetensors", metadata={"format": "pt"})
        saved = json.loads((path / "config.json").read_text())
        text_config = saved["text_config"]
        rope = text_config.pop("rope_parameters")
        text_config.update(rope_theta=rope["full_attention"]["rope_theta"], rope_local_base_freq=rope["sliding_attention"]["rope_theta"])
        text_config["sliding_window_pattern"] = text_config.pop("layer_types").index("full_attention") + 1
        defaults = transformers.Gemma3TextConfig().to_dict() | {"rope_local_base_freq": 10000.0, "sliding_window_pattern": 6}
        saved["text_config"] = {key: value for key, value in text_config.items() if key == "model_type" or defaults.get(key) != value}
        assert "query_pre_attn_scalar" not in saved["text_config"]
        (path / "config.json").write_text(json.dumps(saved))
    return model


@pytest.mark.parametrize("layout", ["transformers5", "transformers4"])
def test_a_vision_language_checkpoint_runs_its_language_model_on_text(layout, tmp_path):
    model = gemma3_vision_language_checkpoint(tmp_path, layout)
    want = [transformers_greedy(model, ids) for ids in PROMPTS]
    assert rsgl_greedy(tmp_path, PROMPTS, dtype="float32") == (want, want)


def test_yarn_attention_factor_matches_transformers(tmp_path):
    """Ministral 3's mscales cancel (attention factor 1); without them YaRN scales cos and sin by 1 + 0.1 ln 4."""
    build_family("ministral3", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["rope_parameters"]["mscale"], config["rope_parameters"]["mscale_all_dim"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert model.model.rotary_emb.attention_scaling == pytest.approx(1.1386, abs=1e-4)
    want = [transformers_greedy(model, ids) for ids in PROMPTS]
    assert rsgl_greedy(tmp_path, PROMPTS, dtype="float32") == (want, want)


def test_a_mistral3_vision_language_checkpoint_runs_its_ministral3_language_model_on_text(tmp_path):
    """Ministral 3 as the Hub has it: its text model inside a Mistral3ForConditionalGeneration (here with a
    tiny Pixtral tower), whose greedy tokens on text are the text model's."""
    text = build_family("ministral3", tmp_path)
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, head_dim=8, image_size=28, patch_size=14)
    model = transformers.Mistral3ForConditionalGeneration(transformers.Mistral3Config(text_config=text.config.to_dict(), vision_config=vision)).eval()
    model.model.language_model.load_state_dict(text.model.state_dict())
    model.lm_head.load_state_dict(text.lm_head.state_dict())
    (tmp_path / "model.safetensors").unlink()
    model.save_pretrained(tmp_path)
    want = [transformers_greedy(model, ids) for ids in PROMPTS]
    assert rsgl_greedy(tmp_path, PROMPTS, dtype="float32") == (want, want)


@pytest.mark.parametrize("family", [name for name in FAMILIES if name not in SUPPORTED + HYBRID + MLA_MOE])
def test_families_not_run_yet_are_refused_naming_what_runs(family, tmp_path):
    build_family(family, tmp_path)
    with pytest.raises(rsgl.UnsupportedModelError, match="rsgl does not support the '.*' architecture; it runs LlamaForCausalLM, .*Olmo2ForCausalLM"):
        rsgl.Engine(str(tmp_path), progress=False)


def test_a_gguf_file_of_a_family_not_run_yet_is_refused_naming_what_runs(tmp_path):
    """llama.cpp's converter writes the GGUF file of a family rsgl does not run (Starcoder 2)."""
    build_family("starcoder2", tmp_path / "starcoder2")
    gguf_file = convert(tmp_path / "starcoder2", tmp_path / "starcoder2.gguf")
    runs = "llama, mistral, qwen2, qwen2vl, qwen3, smollm3, .*qwen3next, deepseek2, glm4moe"
    with pytest.raises(rsgl.UnsupportedModelError, match=f"holds a 'starcoder2' model; rsgl runs {runs} GGUF"):
        rsgl.Engine(str(gguf_file), progress=False)
