//! A tiny random Llama-family model and helpers shared by the engine's integration tests.
#![allow(dead_code)] // each test file uses its own subset

use rsgl_engine::config::{ExpertScoring, GatedDeltaNet, LatentAttention, SlidingWindow};
use rsgl_engine::sample::Rng;
use rsgl_engine::{Engine, EngineOptions, GenerateRequest, ModelConfig, Output, WeightStore};
use std::sync::Arc;
use std::time::Duration;

pub const VOCAB: usize = 97;

/// Dense "llama", "qwen2", "qwen3", the hybrid "qwen3_5_text", the MoE "mixtral" (top-2 of 4) and "qwen2_moe" (with a
/// shared expert), or "deepseek_v3": latent attention (q through a rank-16 bottleneck, a 32-wide latent, 16 + 8 q/k and
/// 12 v dimensions per head), a dense first layer, then top-2 of 4 experts from the better of 2 groups by sigmoid
/// scores plus a choice bias, scaled by 2.5, beside an unscaled shared expert.
pub fn config(arch: &str) -> ModelConfig {
    if arch == "deepseek_v3" {
        return ModelConfig::from_json(&format!(
            r#"{{"architecture": "deepseek_v3", "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 40, "rotary_dim": 8, "vocab_size": {VOCAB},
                "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": null, "attention_bias": false, "qk_norm": false,
                "tie_word_embeddings": true, "max_position_embeddings": 4096,
                "scales": {{"embedding": 1.0, "residual": 1.0, "attention": 0.2, "logits_divisor": 1.0}},
                "moe": {{"num_experts": 4, "experts_per_token": 2, "expert_intermediate_size": 24, "norm_topk_prob": true,
                        "shared_expert_intermediate_size": 24, "scoring": "sigmoid", "routed_scaling_factor": 2.5, "dense_layers": 1,
                        "expert_groups": {{"groups": 2, "groups_per_token": 1, "score": "best_two"}}}},
                "latent_attention": {{"q_lora_rank": 16, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 12}}}}"#
        ))
        .unwrap();
    }
    let moe = match arch {
        "mixtral" => {
            r#"{"num_experts": 4, "experts_per_token": 2, "expert_intermediate_size": 48, "norm_topk_prob": true, "shared_expert_intermediate_size": null}"#
        }
        "qwen2_moe" => {
            r#"{"num_experts": 4, "experts_per_token": 2, "expert_intermediate_size": 24, "norm_topk_prob": false, "shared_expert_intermediate_size": 40}"#
        }
        _ => "null",
    };
    // Qwen3.5: layer 0 a Gated DeltaNet, layer 1 gated attention.
    let delta_net = match arch {
        "qwen3_5_text" => r#"{"layers": [0], "key_heads": 2, "value_heads": 4, "key_head_dim": 8, "value_head_dim": 8, "conv_kernel": 4}"#,
        _ => "null",
    };
    ModelConfig::from_json(&format!(
        r#"{{"architecture": "{arch}", "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": {VOCAB},
            "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": null,
            "attention_bias": {bias}, "qk_norm": {qk}, "tie_word_embeddings": true, "max_position_embeddings": 4096,
            "moe": {moe}, "gated_delta_net": {delta_net}}}"#,
        bias = arch.starts_with("qwen2"),
        qk = arch == "qwen3" || arch == "qwen3_5_text"
    ))
    .unwrap()
}

/// A SwiGLU block's three matrices under `prefix` (names `[gate, up, down]`).
fn swiglu(add: &mut impl FnMut(String, Vec<usize>, f32), prefix: &str, [gate, up, down]: [&str; 3], h: usize, inter: usize) {
    add(format!("{prefix}.{gate}.weight"), vec![inter, h], 0.3);
    add(format!("{prefix}.{up}.weight"), vec![inter, h], 0.3);
    add(format!("{prefix}.{down}.weight"), vec![h, inter], 0.3);
}

fn attention(add: &mut impl FnMut(String, Vec<usize>, f32), prefix: &str, cfg: &ModelConfig) {
    // Qwen3.5's q_proj also gives each head's output gate.
    let q_rows = if cfg.architecture == "qwen3_5_text" { 2 * cfg.q_size() } else { cfg.q_size() };
    for (name, out) in [("q_proj", q_rows), ("k_proj", cfg.kv_size()), ("v_proj", cfg.kv_size())] {
        add(format!("{prefix}.{name}.weight"), vec![out, cfg.hidden_size], 0.3);
        if cfg.attention_bias {
            add(format!("{prefix}.{name}.bias"), vec![out], 0.3);
        }
    }
    if cfg.qk_norm {
        add(format!("{prefix}.q_norm.weight"), vec![cfg.head_dim], 1.0);
        add(format!("{prefix}.k_norm.weight"), vec![cfg.head_dim], 1.0);
    }
    add(format!("{prefix}.o_proj.weight"), vec![cfg.hidden_size, cfg.q_size()], 0.3);
}

/// A latent attention layer's tensors, as DeepSeek names them.
fn latent_attention(add: &mut impl FnMut(String, Vec<usize>, f32), prefix: &str, latent: &LatentAttention, cfg: &ModelConfig) {
    let (h, heads) = (cfg.hidden_size, cfg.num_attention_heads);
    let rank = latent.q_lora_rank.expect("the tiny DeepSeek has a q bottleneck");
    add(format!("{prefix}.q_a_proj.weight"), vec![rank, h], 0.3);
    add(format!("{prefix}.q_a_layernorm.weight"), vec![rank], 1.0);
    add(format!("{prefix}.q_b_proj.weight"), vec![heads * latent.qk_head_dim(), rank], 0.3);
    add(format!("{prefix}.kv_a_proj_with_mqa.weight"), vec![latent.latent_key_dim(), h], 0.3);
    add(format!("{prefix}.kv_a_layernorm.weight"), vec![latent.kv_lora_rank], 1.0);
    add(format!("{prefix}.kv_b_proj.weight"), vec![heads * (latent.qk_nope_head_dim + latent.v_head_dim), latent.kv_lora_rank], 0.3);
    add(format!("{prefix}.o_proj.weight"), vec![h, heads * latent.v_head_dim], 0.3);
}

/// A Gated DeltaNet layer's tensors, as Qwen3.5 names them.
fn delta_net(add: &mut impl FnMut(String, Vec<usize>, f32), prefix: &str, net: &GatedDeltaNet, h: usize) {
    let values = net.value_heads * net.value_head_dim;
    for (name, rows) in [("in_proj_qkv", net.conv_channels()), ("in_proj_z", values), ("in_proj_b", net.value_heads), ("in_proj_a", net.value_heads)] {
        add(format!("{prefix}.{name}.weight"), vec![rows, h], 0.3);
    }
    add(format!("{prefix}.conv1d.weight"), vec![net.conv_channels(), 1, net.conv_kernel], 0.5);
    add(format!("{prefix}.A_log"), vec![net.value_heads], 1.0);
    add(format!("{prefix}.dt_bias"), vec![net.value_heads], 1.0);
    add(format!("{prefix}.norm.weight"), vec![net.value_head_dim], 1.0);
    add(format!("{prefix}.out_proj.weight"), vec![h, values], 0.3);
}

pub fn weights(cfg: &ModelConfig) -> WeightStore {
    let mut rng = Rng::new(42);
    let mut w = WeightStore::new();
    let mut add = |name: String, shape: Vec<usize>, scale: f32| {
        let n = shape.iter().product();
        let data = (0..n).map(|_| (rng.next_f64() as f32 * 2.0 - 1.0) * scale).collect();
        w.insert(&name, shape, data).unwrap();
    };
    let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
    add("model.embed_tokens.weight".into(), vec![VOCAB, h], 1.0);
    add("model.norm.weight".into(), vec![h], 1.0);
    for l in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{l}");
        add(format!("{p}.input_layernorm.weight"), vec![h], 1.0);
        add(format!("{p}.post_attention_layernorm.weight"), vec![h], 1.0);
        match (cfg.gated_delta_net.as_ref().filter(|net| net.layers.contains(&l)), &cfg.latent_attention) {
            (Some(net), _) => delta_net(&mut add, &format!("{p}.linear_attn"), net, h),
            (None, Some(latent)) => latent_attention(&mut add, &format!("{p}.self_attn"), latent, cfg),
            (None, None) => attention(&mut add, &format!("{p}.self_attn"), cfg),
        }
        match cfg.moe.as_ref().filter(|moe| l >= moe.dense_layers) {
            None => swiglu(&mut add, &format!("{p}.mlp"), ["gate_proj", "up_proj", "down_proj"], h, i),
            Some(moe) => {
                let (block, names) = if cfg.architecture == "mixtral" {
                    (format!("{p}.block_sparse_moe"), ["w1", "w3", "w2"])
                } else {
                    (format!("{p}.mlp"), ["gate_proj", "up_proj", "down_proj"])
                };
                add(format!("{block}.gate.weight"), vec![moe.num_experts, h], 1.0);
                for e in 0..moe.num_experts {
                    swiglu(&mut add, &format!("{block}.experts.{e}"), names, h, moe.expert_intermediate_size);
                }
                match (moe.shared_expert_intermediate_size, moe.scoring) {
                    (None, _) => {}
                    (Some(shared), ExpertScoring::Sigmoid) => {
                        swiglu(&mut add, &format!("{block}.shared_experts"), names, h, shared);
                        add(format!("{block}.gate.e_score_correction_bias"), vec![moe.num_experts], 0.3);
                    }
                    (Some(shared), ExpertScoring::Softmax) => {
                        swiglu(&mut add, &format!("{block}.shared_expert"), names, h, shared);
                        add(format!("{block}.shared_expert_gate.weight"), vec![1, h], 0.3);
                    }
                }
            }
        }
    }
    w
}

pub fn engine(arch: &str, opts: &str) -> Engine {
    engine_of(config(arch), opts)
}

/// The tiny Llama with its first layer sliding over `window` tokens (which, shorter than the
/// context, keeps only its window's KV in window pages).
pub fn sliding_engine(window: usize, opts: &str) -> Engine {
    let mut cfg = config("llama");
    cfg.sliding_window = Some(SlidingWindow { size: window, layers: vec![0], rope_theta: None });
    engine_of(cfg, opts)
}

fn engine_of(cfg: ModelConfig, opts: &str) -> Engine {
    let w = weights(&cfg);
    Engine::start(cfg, w, None, vec![], EngineOptions::from_json(opts).unwrap()).unwrap()
}

pub fn request(rid: &str, prompt: Vec<u32>, max_new: usize) -> GenerateRequest {
    GenerateRequest::from_json(&format!(r#"{{"rid": "{rid}", "input_ids": {prompt:?}, "sampling_params": {{"temperature": 0, "max_new_tokens": {max_new}}}}}"#))
        .unwrap()
}

pub fn collect(mut stream: rsgl_engine::RequestStream) -> (Vec<u32>, Output) {
    let mut tokens = Vec::new();
    loop {
        let out = stream.next(Duration::from_secs(30)).unwrap().expect("engine answered in time");
        tokens.extend(&out.token_ids);
        if out.finished.is_some() {
            return (tokens, out);
        }
    }
}

pub fn prompt(seed: u64, len: usize) -> Vec<u32> {
    let mut rng = Rng::new(seed);
    (0..len).map(|_| (rng.next_u64() % VOCAB as u64) as u32).collect()
}

/// Waits until no request is queued or running, checks that every page (and window page) is
/// free or cached, then flushes the cache and checks that every page is free.
pub fn assert_drained(e: &Engine) {
    for _ in 0..500 {
        let s = e.stats();
        if s.running_requests == 0 && s.waiting_requests == 0 {
            assert_eq!(s.kv_pages_free + s.cached_pages, s.kv_pages_total, "pages leaked: {s:?}");
            assert_eq!(s.kv_window_pages_free + s.window_cached_pages, s.kv_window_pages_total, "window pages leaked: {s:?}");
            assert!(e.flush_cache().unwrap(), "flush refused on an idle engine");
            let s = e.stats();
            assert_eq!((s.kv_pages_free, s.cached_pages), (s.kv_pages_total, 0), "{s:?}");
            assert_eq!((s.kv_window_pages_free, s.window_cached_pages), (s.kv_window_pages_total, 0), "{s:?}");
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("requests still in flight: {:?}", e.stats());
}

/// Token id of the "ab" merge in [`ascii_tokenizer`]; id 0 is the EOS token `</s>`, ids 1..=95
/// the printable ASCII characters from space to `~`.
pub const AB: u32 = 96;

pub fn ascii_id(c: char) -> u32 {
    assert!((' '..='~').contains(&c), "{c:?} is not printable ASCII");
    c as u32 - ' ' as u32 + 1
}

/// A byte-level BPE tokenizer over the tiny model's vocabulary: printable ASCII, one merge
/// ("a" + "b"), and `</s>` as EOS. It tokenizes forced text canonically.
pub fn ascii_tokenizer() -> Arc<rsgl_engine::Tokenizer> {
    ascii_tokenizer_with_normalizer(serde_json::Value::Null)
}

/// [`ascii_tokenizer`] with a `tokenizer.json` normalizer, such as one prepending a space
/// (SentencePiece style), which makes it unfit to tokenize pieces of text.
pub fn ascii_tokenizer_with_normalizer(normalizer: serde_json::Value) -> Arc<rsgl_engine::Tokenizer> {
    let mut bytes = vec![b"</s>".to_vec()];
    bytes.extend((b' '..=b'~').map(|b| vec![b]));
    bytes.push(b"ab".to_vec());
    assert_eq!(bytes.len(), VOCAB);
    // Byte-level BPE spells a space as U+0120 and printable ASCII as itself.
    let spelling = |token: &[u8]| -> String { token.iter().map(|&b| if b == b' ' { '\u{120}' } else { b as char }).collect() };
    // `</s>` is in the model's vocabulary too, as real tokenizers keep their added tokens.
    let vocab: serde_json::Map<String, serde_json::Value> = bytes.iter().enumerate().map(|(id, token)| (spelling(token), id.into())).collect();
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [{"id": 0, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
        "normalizer": normalizer,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": false, "byte_fallback": false, "vocab": vocab, "merges": ["a b"]}
    });
    let tokenizer = rsgl_engine::Tokenizer::from_json(&json.to_string(), Some(VOCAB)).unwrap();
    for (id, token) in bytes.iter().enumerate() {
        assert_eq!(tokenizer.table().bytes(id as u32, false), token.as_slice());
    }
    Arc::new(tokenizer)
}

/// The tiny Llama with [`ascii_tokenizer`] (EOS `</s>`).
pub fn engine_with_tokenizer(opts: &str) -> Engine {
    let cfg = config("llama");
    let w = weights(&cfg);
    Engine::start(cfg, w, Some(ascii_tokenizer()), vec![0], EngineOptions::from_json(opts).unwrap()).unwrap()
}

/// The text of `tokens` under [`ascii_tokenizer`].
pub fn ascii_text(tokens: &[u32]) -> String {
    tokens
        .iter()
        .map(|&t| match t {
            0 => String::new(),
            AB => "ab".into(),
            t => char::from(b' ' + (t - 1) as u8).to_string(),
        })
        .collect()
}
