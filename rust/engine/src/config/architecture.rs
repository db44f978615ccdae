//! The architectures rsgl runs, one row each: what every checkpoint format calls it, and the
//! facts of its layers that a checkpoint's config leaves unsaid. The config readers, the
//! binding and the Python loader all take them from here.

use super::ExpertScoring;
use crate::model::archs::{deepseek, gemma, glm4, gpt_oss, granite, llama, olmo2, qwen3_next, Assembly};
use serde::Serialize;

#[derive(Debug, Serialize)]
pub struct Architecture {
    /// rsgl's name, which is also the transformers `model_type`.
    pub name: &'static str,
    /// The transformers model class (config.json's `architectures`).
    pub hf_class: &'static str,
    /// GGUF's `general.architecture` (llama.cpp files a Mixtral as a llama with experts); None:
    /// rsgl reads this architecture from Hugging Face folders only, so far.
    pub gguf_name: Option<&'static str>,
    /// How its layers are put together (`model::archs`).
    pub assembly: Assembly,
    /// q/k/v projections with biases, whatever config.json's `attention_bias` says.
    pub attention_bias: bool,
    /// config.json's `sliding_window` applies even without `use_sliding_window`.
    pub sliding_window: bool,
    /// Every layer slides but each `n`th, which attends to all positions: the pattern where a
    /// checkpoint does not list each layer's kind (transformers 4 configs, GGUF files).
    pub global_layer_every: Option<usize>,
    /// The sliding layers' rope base where the files do not say (their rotation is unscaled).
    pub local_rope_theta: Option<f64>,
    /// Each `n`th layer leaves q and k unrotated where a checkpoint does not list its NoPE
    /// layers (GGUF files: llama.cpp hard-codes SmolLM3's every 4th).
    pub no_rope_layer_every: Option<usize>,
    /// transformers rounds YaRN's blend bounds out to whole indices unless the config says
    /// `truncate: false`, which GGUF files cannot say (ggml always rounds): false for the
    /// families whose released configs say so.
    pub yarn_truncates: bool,
    /// Mixture-of-experts MLPs in every layer; None: dense MLPs.
    pub moe: Option<MoeFacts>,
    /// The config.json key of the dense MLP's width (Granite 4's shared MLP's).
    pub ffn_key: &'static str,
    /// What the layers config.json's `layer_types` calls `linear_attention` (or `mamba`) mix
    /// tokens with; None: every layer attends.
    pub recurrent_mixer: Option<RecurrentMixer>,
    /// llama.cpp's converter reorders the Gated DeltaNet's value heads from grouped by key head
    /// to tiled (see `ValueHeadOrder`).
    pub gguf_tiles_value_heads: bool,
    /// transformers' defaults for this model's config (JSON), for the `text_config` of a
    /// vision-language checkpoint, where transformers 4 writes only the keys that differ.
    pub nested_config_defaults: Option<&'static str>,
}

#[derive(Debug, Serialize)]
pub struct MoeFacts {
    /// The config.json key of each expert's FFN size.
    pub expert_ffn_key: &'static str,
    /// transformers always renormalizes the top-k routing weights (else config.json's
    /// `norm_topk_prob` says).
    pub renormalizes_top_k: bool,
    /// llama.cpp renormalizes them where a GGUF file has no `expert_weights_norm`.
    pub gguf_renormalizes_top_k: bool,
    /// The config.json key of the shared expert's FFN size, where the model has one (DeepSeek's
    /// configs count shared experts instead: `n_shared_experts`).
    pub shared_expert_ffn_key: &'static str,
    /// How the router scores experts where config.json's `scoring_func` does not say.
    pub scoring: ExpertScoring,
}

/// A recurrent token mixer in place of attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RecurrentMixer {
    /// Qwen3-Next's and Qwen3.5's Gated DeltaNet.
    GatedDeltaNet,
    /// Granite 4's Mamba-2.
    Mamba2,
}

/// The usual facts of a mixture of experts (Qwen's); each row says how it differs.
const MOE: MoeFacts = MoeFacts {
    expert_ffn_key: "moe_intermediate_size",
    renormalizes_top_k: false,
    gguf_renormalizes_top_k: true,
    shared_expert_ffn_key: "shared_expert_intermediate_size",
    scoring: ExpertScoring::Softmax,
};

/// DeepSeek-V3's routing (sigmoid scores, GLM-4.5's too); DeepSeek-V2 scores with a softmax.
const SIGMOID_MOE: MoeFacts = MoeFacts { gguf_renormalizes_top_k: false, scoring: ExpertScoring::Sigmoid, ..MOE };

/// A dense Llama-built architecture without biases or a sliding window; each row says how it differs.
const PLAIN: Architecture = Architecture {
    name: "",
    hf_class: "",
    gguf_name: None,
    assembly: llama::LLAMA,
    attention_bias: false,
    sliding_window: false,
    global_layer_every: None,
    local_rope_theta: None,
    no_rope_layer_every: None,
    yarn_truncates: true,
    moe: None,
    ffn_key: "intermediate_size",
    recurrent_mixer: None,
    gguf_tiles_value_heads: false,
    nested_config_defaults: None,
};

pub const ARCHITECTURES: &[Architecture] = &[
    Architecture { name: "llama", hf_class: "LlamaForCausalLM", gguf_name: Some("llama"), ..PLAIN },
    Architecture { name: "mistral", hf_class: "MistralForCausalLM", gguf_name: Some("mistral"), sliding_window: true, ..PLAIN },
    Architecture { name: "qwen2", hf_class: "Qwen2ForCausalLM", gguf_name: Some("qwen2"), attention_bias: true, ..PLAIN },
    // Qwen2.5-VL's language model: Qwen2's, its rope turned by 3D positions at image tokens (M-RoPE;
    // llama.cpp files Qwen2-VL's and Qwen2.5-VL's as qwen2vl, their sections in `rope.dimension_sections`).
    Architecture { name: "qwen2_5_vl_text", hf_class: "Qwen2_5_VLForConditionalGeneration", gguf_name: Some("qwen2vl"), attention_bias: true, ..PLAIN },
    Architecture { name: "qwen3", hf_class: "Qwen3ForCausalLM", gguf_name: Some("qwen3"), assembly: llama::QWEN3, ..PLAIN },
    Architecture { name: "smollm3", hf_class: "SmolLM3ForCausalLM", gguf_name: Some("smollm3"), no_rope_layer_every: Some(4), ..PLAIN },
    Architecture { name: "granite", hf_class: "GraniteForCausalLM", gguf_name: Some("granite"), ..PLAIN },
    Architecture { name: "olmo2", hf_class: "Olmo2ForCausalLM", gguf_name: Some("olmo2"), assembly: olmo2::OLMO2, ..PLAIN },
    Architecture { name: "phi3", hf_class: "Phi3ForCausalLM", gguf_name: Some("phi3"), sliding_window: true, ..PLAIN },
    Architecture { name: "glm4", hf_class: "Glm4ForCausalLM", gguf_name: Some("glm4"), assembly: glm4::GLM4, ..PLAIN },
    Architecture { name: "gemma2", hf_class: "Gemma2ForCausalLM", gguf_name: Some("gemma2"), assembly: gemma::GEMMA2, global_layer_every: Some(2), ..PLAIN },
    Architecture {
        name: "gemma3_text",
        hf_class: "Gemma3ForCausalLM",
        gguf_name: Some("gemma3"),
        assembly: gemma::GEMMA3,
        global_layer_every: Some(6),
        local_rope_theta: Some(10000.0),
        // Gemma3TextConfig's defaults (the 2B-sized text model of transformers 4.50).
        nested_config_defaults: Some(
            r#"{"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "query_pre_attn_scalar": 256,
                "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
                "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "sliding_window": 4096,
                "sliding_window_pattern": 6, "tie_word_embeddings": true}"#,
        ),
        ..PLAIN
    },
    // Its YaRN and query temperature come from the config.
    Architecture { name: "ministral3", hf_class: "Ministral3ForCausalLM", gguf_name: Some("mistral3"), sliding_window: true, ..PLAIN },
    Architecture {
        name: "mixtral",
        hf_class: "MixtralForCausalLM",
        gguf_name: Some("llama"),
        sliding_window: true,
        moe: Some(MoeFacts { expert_ffn_key: "intermediate_size", renormalizes_top_k: true, ..MOE }),
        ..PLAIN
    },
    Architecture {
        name: "qwen2_moe",
        hf_class: "Qwen2MoeForCausalLM",
        gguf_name: Some("qwen2moe"),
        attention_bias: true,
        moe: Some(MoeFacts { gguf_renormalizes_top_k: false, ..MOE }),
        ..PLAIN
    },
    Architecture { name: "qwen3_moe", hf_class: "Qwen3MoeForCausalLM", gguf_name: Some("qwen3moe"), assembly: llama::QWEN3, moe: Some(MOE), ..PLAIN },
    Architecture {
        name: "gpt_oss",
        hf_class: "GptOssForCausalLM",
        gguf_name: Some("gpt-oss"),
        assembly: gpt_oss::GPT_OSS,
        attention_bias: true,
        // Even layers slide, odd ones attend to every position (transformers' default layer_types,
        // and llama.cpp's pattern for gpt-oss files).
        global_layer_every: Some(2),
        // OpenAI's configs set `truncate: false`.
        yarn_truncates: false,
        moe: Some(MoeFacts { expert_ffn_key: "intermediate_size", renormalizes_top_k: true, ..MOE }),
        ..PLAIN
    },
    // Qwen3.5's language model (its vision-language checkpoints' `text_config`).
    Architecture {
        name: "qwen3_5_text",
        hf_class: "Qwen3_5ForCausalLM",
        gguf_name: Some("qwen35"),
        assembly: qwen3_next::QWEN3_NEXT,
        recurrent_mixer: Some(RecurrentMixer::GatedDeltaNet),
        gguf_tiles_value_heads: true,
        ..PLAIN
    },
    Architecture {
        name: "qwen3_next",
        hf_class: "Qwen3NextForCausalLM",
        gguf_name: Some("qwen3next"),
        assembly: qwen3_next::QWEN3_NEXT,
        moe: Some(MOE),
        recurrent_mixer: Some(RecurrentMixer::GatedDeltaNet),
        ..PLAIN
    },
    // Its experts' softmax over the top k logits is the renormalized top k of the softmax over all;
    // a config without experts (`num_local_experts` 0) runs the shared MLP alone.
    Architecture {
        name: "granitemoehybrid",
        hf_class: "GraniteMoeHybridForCausalLM",
        assembly: granite::GRANITE_MOE_HYBRID,
        moe: Some(MoeFacts {
            expert_ffn_key: "intermediate_size",
            renormalizes_top_k: true,
            gguf_renormalizes_top_k: true,
            shared_expert_ffn_key: "shared_intermediate_size",
            scoring: ExpertScoring::Softmax,
        }),
        ffn_key: "shared_intermediate_size",
        recurrent_mixer: Some(RecurrentMixer::Mamba2),
        ..PLAIN
    },
    // Multi-head latent attention where the config has a `kv_lora_rank`; llama.cpp files both
    // DeepSeek versions as deepseek2, their routing in the metadata.
    Architecture {
        name: "deepseek_v2",
        hf_class: "DeepseekV2ForCausalLM",
        gguf_name: Some("deepseek2"),
        assembly: deepseek::DEEPSEEK,
        moe: Some(MoeFacts { gguf_renormalizes_top_k: false, ..MOE }),
        ..PLAIN
    },
    Architecture {
        name: "deepseek_v3",
        hf_class: "DeepseekV3ForCausalLM",
        gguf_name: Some("deepseek2"),
        assembly: deepseek::DEEPSEEK,
        moe: Some(SIGMOID_MOE),
        ..PLAIN
    },
    Architecture { name: "glm4_moe", hf_class: "Glm4MoeForCausalLM", gguf_name: Some("glm4moe"), assembly: glm4::GLM4_MOE, moe: Some(SIGMOID_MOE), ..PLAIN },
];

impl Architecture {
    pub fn named(name: &str) -> Option<&'static Architecture> {
        ARCHITECTURES.iter().find(|a| a.name == name)
    }

    /// The architecture of a transformers class: its causal LM (`Qwen3ForCausalLM`) or its base
    /// model (`Qwen3Model`, as embedding checkpoints may be saved).
    pub fn with_hf_class(class: &str) -> Option<&'static Architecture> {
        let base_of = |a: &Architecture| a.hf_class.strip_suffix("ForCausalLM").map(|base| format!("{base}Model"));
        ARCHITECTURES.iter().find(|a| a.hf_class == class || base_of(a).as_deref() == Some(class))
    }

    /// The architecture of a GGUF file named `gguf_name`, with or without experts (llama.cpp
    /// files a Mixtral as a llama with experts).
    pub fn of_gguf(gguf_name: &str, has_experts: bool) -> Option<&'static Architecture> {
        let named = || ARCHITECTURES.iter().filter(move |a| a.gguf_name == Some(gguf_name));
        named().find(|a| a.moe.is_some() == has_experts).or_else(|| named().next())
    }

    /// One name of every architecture (that has one), for messages saying what rsgl runs:
    /// "llama, mistral, ...".
    pub fn list(name: fn(&Architecture) -> Option<&'static str>) -> String {
        let mut names: Vec<&str> = Vec::new();
        for listed in ARCHITECTURES.iter().filter_map(name) {
            if !names.contains(&listed) {
                names.push(listed); // GGUF names repeat: llama.cpp files a Mixtral as a llama
            }
        }
        names.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_in_each_format() {
        let unique = |name: fn(&Architecture) -> &'static str| {
            let mut names: Vec<&str> = ARCHITECTURES.iter().map(name).collect();
            names.sort();
            names.windows(2).all(|pair| pair[0] != pair[1])
        };
        assert!(unique(|a| a.name) && unique(|a| a.hf_class));
        assert_eq!(Architecture::named("qwen2_moe").map(|a| a.hf_class), Some("Qwen2MoeForCausalLM"));
        assert_eq!(Architecture::with_hf_class("MixtralForCausalLM").map(|a| a.name), Some("mixtral"));
        assert_eq!(Architecture::with_hf_class("Qwen3Model").map(|a| a.name), Some("qwen3"));
        assert_eq!(Architecture::with_hf_class("GraniteMoeHybridForCausalLM").map(|a| a.name), Some("granitemoehybrid"));
        let of_gguf = |name, has_experts| Architecture::of_gguf(name, has_experts).map(|a| a.name);
        assert_eq!((of_gguf("llama", false), of_gguf("llama", true), of_gguf("qwen3moe", true)), (Some("llama"), Some("mixtral"), Some("qwen3_moe")));
        assert_eq!(
            Architecture::list(|a| a.gguf_name),
            "llama, mistral, qwen2, qwen2vl, qwen3, smollm3, granite, olmo2, phi3, glm4, gemma2, gemma3, mistral3, qwen2moe, qwen3moe, gpt-oss, qwen35, qwen3next, deepseek2, glm4moe"
        );
        assert_eq!(Architecture::of_gguf("olmo2", false).map(|a| a.name), Some("olmo2"));
        assert_eq!(Architecture::of_gguf("qwen2vl", false).map(|a| a.name), Some("qwen2_5_vl_text"));
        assert_eq!(Architecture::of_gguf("gpt-oss", true).map(|a| a.name), Some("gpt_oss"));
        assert_eq!(Architecture::of_gguf("starcoder2", false).map(|a| a.name), None);
    }
}
