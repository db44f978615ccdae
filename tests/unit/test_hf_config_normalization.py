"""rsgl._core.ModelConfig.from_hf on Hugging Face config.json contents: the scales of Granite,
SmolLM3's layers without RoPE, transformers 4's and 5's RoPE layouts (llama3, yarn) normalizing
alike, a sliding window capping the context, and the mixture-of-experts configs of Mixtral,
Qwen2-MoE and DeepSeek-V3; and the configs rsgl refuses, with typed errors."""

from __future__ import annotations

import pytest
from loader_helpers import BASE_CONFIG, NO_SCALES, normalized
from rsgl.errors import ModelLoadError, UnsupportedModelError


def test_granite_scales_and_smollm3_nope_layers_are_normalized():
    granite = {**BASE_CONFIG, "architectures": ["GraniteForCausalLM"], "embedding_multiplier": 12.0, "residual_multiplier": 0.22}
    scales = normalized({**granite, "attention_multiplier": 0.015625, "logits_scaling": 8.0})["scales"]
    assert scales == {**NO_SCALES, "embedding": 12.0, "residual": 0.22, "attention": 0.015625, "logits_divisor": 8.0}
    smollm3 = {**BASE_CONFIG, "architectures": ["SmolLM3ForCausalLM"], "num_hidden_layers": 8, "no_rope_layers": [1, 1, 1, 0, 1, 1, 1, 0]}
    assert normalized(smollm3)["no_rope_layers"] == [3, 7]


LLAMA3_SCALING = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def test_transformers_4_and_5_rope_layouts_normalize_alike():
    v4 = {**BASE_CONFIG, "rope_theta": 500000.0, "rope_scaling": {"type": "llama3", **LLAMA3_SCALING}}
    v5 = {**BASE_CONFIG, "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, **LLAMA3_SCALING}}
    del v5["rope_theta"]
    config = normalized(v4)
    assert config == normalized(v5)
    assert config["rope_theta"] == 500000.0
    assert config["rope_scaling"] == {"rope_type": "llama3", **LLAMA3_SCALING}

    plain_v4 = {**BASE_CONFIG, "rope_scaling": None}
    plain_v5 = {**BASE_CONFIG, "rope_parameters": {"rope_type": "default", "rope_theta": 50000.0}}
    assert normalized(plain_v4) == normalized(plain_v5)

    yarn = {"factor": 16.0, "original_max_position_embeddings": 16384, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
    yarn_v4 = {**BASE_CONFIG, "rope_theta": 1e6, "rope_scaling": {"type": "yarn", **yarn, "llama_4_scaling_beta": 0.1}}
    yarn_v5 = {**BASE_CONFIG, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, **yarn, "llama_4_scaling_beta": 0.1}}
    config = normalized(yarn_v4)
    assert config == normalized(yarn_v5)
    del yarn["mscale"], yarn["mscale_all_dim"]
    assert config["rope_scaling"] == {"rope_type": "yarn", **yarn, "truncate": True, "attention_factor": 1.0}
    assert config["scales"]["query_temperature"] == {"beta": 0.1, "length": 16384}

    with pytest.raises(UnsupportedModelError, match="'dynamic' RoPE scaling"):
        normalized({**BASE_CONFIG, "rope_scaling": {"rope_type": "dynamic", "factor": 4.0}})


def test_sliding_window_caps_the_context():
    mistral = {**BASE_CONFIG, "architectures": ["MistralForCausalLM"], "max_position_embeddings": 32768}
    assert normalized({**mistral, "sliding_window": 4096})["max_position_embeddings"] == 4096
    assert normalized({**mistral, "sliding_window": None})["max_position_embeddings"] == 32768
    qwen2 = {**BASE_CONFIG, "architectures": ["Qwen2ForCausalLM"], "sliding_window": 16, "use_sliding_window": False}
    assert normalized(qwen2)["max_position_embeddings"] == BASE_CONFIG["max_position_embeddings"]


def test_moe_configs_are_normalized():
    mixtral = {**BASE_CONFIG, "architectures": ["MixtralForCausalLM"], "num_local_experts": 8, "num_experts_per_tok": 2}
    assert normalized(mixtral)["moe"] == {
        "num_experts": 8,
        "experts_per_token": 2,
        "expert_intermediate_size": BASE_CONFIG["intermediate_size"],
        "norm_topk_prob": True,
        "shared_expert_intermediate_size": None,
        "scoring": "softmax",
        "expert_groups": None,
        "routed_scaling_factor": 1.0,
        "dense_layers": 0,
    }
    qwen = {
        **BASE_CONFIG,
        "architectures": ["Qwen2MoeForCausalLM"],
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 24,
        "shared_expert_intermediate_size": 40,
    }
    config = normalized(qwen)
    assert config["attention_bias"] and config["moe"]["shared_expert_intermediate_size"] == 40
    assert config["moe"]["norm_topk_prob"] is False
    with pytest.raises(UnsupportedModelError, match="dense and sparse"):
        normalized({**qwen, "mlp_only_layers": [0]})
    deepseek = {
        **BASE_CONFIG,
        "architectures": ["DeepseekV3ForCausalLM"],
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 24,
        "n_shared_experts": 2,
        "n_group": 4,
        "topk_group": 2,
        "routed_scaling_factor": 2.5,
        "first_k_dense_replace": 1,
    }
    assert normalized(deepseek)["moe"] == {
        "num_experts": 8,
        "experts_per_token": 2,
        "expert_intermediate_size": 24,
        "norm_topk_prob": False,
        "shared_expert_intermediate_size": 48,
        "scoring": "sigmoid",
        "expert_groups": {"groups": 4, "groups_per_token": 2, "score": "best_two"},
        "routed_scaling_factor": 2.5,
        "dense_layers": 1,
    }
    with pytest.raises(UnsupportedModelError, match="dense and sparse"):
        normalized({**deepseek, "moe_layer_freq": 2})
    with pytest.raises(ModelLoadError, match="cannot give 2 experts per token"):
        normalized({**deepseek, "topk_group": 0})


def test_a_vision_language_config_runs_its_text_model_by_model_type():
    """SmolVLM's text config names its own class (VLlama3ForCausalLM): its model_type says Llama."""
    text = {**BASE_CONFIG, "architectures": ["VLlama3ForCausalLM"], "model_type": "llama"}
    vision = {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 32, "patch_size": 8}
    config = normalized({"architectures": ["Idefics3ForConditionalGeneration"], "model_type": "idefics3", "text_config": text,
                         "vision_config": vision, "scale_factor": 2, "image_token_id": 7})  # fmt: skip
    assert config["architecture"] == "llama"
    assert config["vision"] == {
        "tower": "siglip",
        **vision,
        "layer_norm_eps": 1e-6,
        "scale_factor": 2,
        "projector": "pixel_shuffle",
        "image_token_id": 7,
        "bidirectional_image_tokens": False,
        "projector_norm_offset": 0.0,
    }


def test_qwen2_5_vl_configs_nested_and_flat_read_alike():
    """transformers 5 nests the language model's config (its rope parameters too); the Hub's checkpoints keep it flat,
    with transformers 4's `rope_scaling` of type "mrope"."""
    vision = {"depth": 2, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2, "out_hidden_size": 64, "fullatt_block_indexes": [1]}
    text = {**BASE_CONFIG, "model_type": "qwen2_5_vl_text", "rope_parameters": {"rope_type": "default", "rope_theta": 5e5, "mrope_section": [2, 3, 3]}}
    text.pop("architectures", None)
    nested = normalized({"architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl", "text_config": text,
                         "vision_config": vision, "image_token_id": 7})  # fmt: skip
    flat_text = {key: value for key, value in text.items() if key not in ("model_type", "rope_parameters")}
    flat = normalized({**flat_text, "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl", "rope_theta": 5e5,
                       "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}, "vision_config": vision, "image_token_id": 7})  # fmt: skip
    assert nested == flat
    assert (nested["architecture"], nested["rope_theta"], nested["rope_scaling"]) == ("qwen2_5_vl_text", 5e5, None)
    assert nested["vision"] == {"tower": "qwen2_5_vl", **vision, "patch_size": 14, "temporal_patch_size": 2, "spatial_merge_size": 2,
                                "window_size": 112, "rope_theta": 10000.0, "image_token_id": 7, "mrope_section": (2, 3, 3)}  # fmt: skip
