//! Tensor parallelism (`tp_size`): two ranks, each with a slice of every layer and of the KV
//! cache, give the greedy tokens of one rank, for every architecture and precision, with LoRA
//! adapters too; ranks must hold whole kv heads.

mod common;

use common::*;
use rsgl_engine::model::PeftAdapter;
use rsgl_engine::{Engine, EngineError, EngineOptions, ModelConfig, WeightStore};

fn greedy(e: &Engine, prompts: &[Vec<u32>]) -> Vec<Vec<u32>> {
    // Submitted together: a batched step over chunked prefills and decodes.
    let streams: Vec<_> = prompts.iter().enumerate().map(|(i, p)| e.submit(request(&format!("r{i}"), p.clone(), 12)).unwrap()).collect();
    streams.into_iter().map(|s| collect(s).0).collect()
}

fn opts(tp: usize, precision: &str) -> String {
    format!(r#"{{"page_size": 4, "chunked_prefill_size": 16, "max_total_tokens": 512, "threads": 2, "tp_size": {tp}, {precision}}}"#)
}

#[test]
fn two_ranks_generate_what_one_does() {
    let prompts: Vec<Vec<u32>> = (0..5).map(|i| prompt(i, 1 + 9 * i as usize)).collect();
    for arch in ["llama", "qwen2", "qwen3", "mixtral", "qwen2_moe"] {
        for precision in [r#""dtype": "float32""#, r#""dtype": "bfloat16""#] {
            let (one, two) = (engine(arch, &opts(1, precision)), engine(arch, &opts(2, precision)));
            assert_eq!(two.stats().tp_size, 2);
            assert_eq!(greedy(&one, &prompts), greedy(&two, &prompts), "{arch} {precision}");
            assert_drained(&two);
        }
    }
}

#[test]
fn two_ranks_of_4_bit_blocks_generate_what_one_does() {
    // Heads and MLP columns of whole 32-column blocks, so each rank's slices stay 4-bit; 16-bit
    // activations (see `two_w8a8_ranks_generate_nearly_what_one_does` for 8-bit ones).
    let run = |tp: usize| {
        let mut cfg = config("llama");
        (cfg.hidden_size, cfg.head_dim, cfg.intermediate_size) = (64, 32, 64);
        let opts = EngineOptions::from_json(&opts(tp, r#""quantization": "w4a8", "activation_bits": 16"#)).unwrap();
        let e = Engine::start(cfg.clone(), weights(&cfg), None, vec![], opts).unwrap();
        let prompts: Vec<Vec<u32>> = (0..4).map(|i| prompt(i, 5 + 7 * i as usize)).collect();
        greedy(&e, &prompts)
    };
    assert_eq!(run(1), run(2));
}

#[test]
fn two_w8a8_ranks_generate_nearly_what_one_does() {
    // W8A8 quantizes each row of activations with one scale; a rank quantizes its slice of the
    // o and down inputs with a scale of its own, so a near-tie may go the other way.
    let precision = r#""quantization": "w8a8_int8", "quantize_lm_head": true"#;
    let prompts: Vec<Vec<u32>> = (0..5).map(|i| prompt(i, 1 + 9 * i as usize)).collect();
    for arch in ["llama", "qwen2", "mixtral"] {
        let (one, two) = (greedy(&engine(arch, &opts(1, precision)), &prompts), greedy(&engine(arch, &opts(2, precision)), &prompts));
        let same = one.concat().iter().zip(two.concat()).filter(|(a, b)| *a == b).count();
        assert!(same * 10 >= 60 * 9, "{arch}: {same} of 60 tokens agree");
        assert!(one.iter().zip(&two).all(|(a, b)| a[0] == b[0]), "{arch}: the first token of every prompt agrees");
    }
}

#[test]
fn more_ranks_than_kv_heads_is_refused() {
    let cfg = config("llama");
    let opts = EngineOptions::from_json(r#"{"tp_size": 3, "threads": 1}"#).unwrap();
    match Engine::start(cfg.clone(), weights(&cfg), None, vec![], opts) {
        Err(EngineError::InvalidRequest(message)) => assert!(message.contains("tp_size"), "{message}"),
        Err(other) => panic!("another error: {other}"),
        Ok(_) => panic!("3 ranks over 2 kv heads were accepted"),
    }
}

#[test]
fn two_ranks_embed_what_one_does() {
    let embed = |tp: usize| {
        let mut cfg = config("llama");
        cfg.pooling = Some(rsgl_engine::pooling::Pooling::Mean);
        let opts = EngineOptions { is_embedding: true, ..EngineOptions::from_json(&opts(tp, r#""dtype": "float32""#)).unwrap() };
        let e = Engine::start(cfg.clone(), weights(&cfg), None, vec![], opts).unwrap();
        let (_, out) = collect(e.embed(rsgl_engine::EmbedRequest { rid: "e".into(), input_ids: prompt(3, 23) }, None).unwrap());
        out.embedding.expect("an embedding")
    };
    let (one, two) = (embed(1), embed(2));
    let diff = one.iter().zip(&two).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
    assert!(diff < 1e-5, "max difference {diff}");
}

/// A LoRA adapter `name` of rank 4 over every projection of the base weights `w` that adapters
/// update (attention's, a dense MLP's, a shared expert's), its A and B random.
fn adapter_over(w: &WeightStore, cfg: &ModelConfig, name: &str, seed: u64) -> PeftAdapter {
    const MODULES: [&str; 10] = [
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
        "mlp.shared_expert.gate_proj",
        "mlp.shared_expert.up_proj",
        "mlp.shared_expert.down_proj",
    ];
    let r = 4;
    let mut weights = WeightStore::new();
    for l in 0..cfg.num_hidden_layers {
        for (i, module) in MODULES.iter().enumerate() {
            let Some(&[out, inp]) = w.shape(&format!("model.layers.{l}.{module}.weight")) else { continue };
            let (prefix, seed) = (format!("base_model.model.model.layers.{l}.{module}"), seed * 1000 + (l * MODULES.len() + i) as u64 * 2);
            weights.insert_random(&format!("{prefix}.lora_A.weight"), vec![r, inp], 0.3, seed);
            weights.insert_random(&format!("{prefix}.lora_B.weight"), vec![out, r], 0.3, seed + 1);
        }
    }
    let config = serde_json::from_value(serde_json::json!({"r": r, "lora_alpha": 8, "target_modules": "all-linear"})).unwrap();
    PeftAdapter { name: name.into(), config, weights }
}

#[test]
fn two_ranks_with_lora_adapters_generate_what_one_does() {
    // Each rank holds B's rows of its q/k/v heads and MLP columns, and A's columns of its o and
    // down inputs (the MoE models' shared expert split as a dense MLP; Mixtral's attention alone).
    let shared = prompt(0, 9);
    let cases = [(shared.clone(), None), (shared.clone(), Some("a")), (shared, Some("b")), (prompt(1, 5), Some("b")), (prompt(2, 14), None)];
    for arch in ["llama", "qwen2", "qwen3", "mixtral", "qwen2_moe"] {
        let run = |tp: usize| {
            let cfg = config(arch);
            let w = weights(&cfg);
            let adapters = [adapter_over(&w, &cfg, "a", 1), adapter_over(&w, &cfg, "b", 2)];
            let e = Engine::start(cfg, w, None, vec![], EngineOptions::from_json(&opts(tp, r#""dtype": "float32""#)).unwrap()).unwrap();
            for adapter in adapters {
                e.load_adapter(adapter).unwrap();
            }
            let streams: Vec<_> = cases
                .iter()
                .enumerate()
                .map(|(i, (ids, lora))| {
                    let mut req = request(&format!("r{i}"), ids.clone(), 12);
                    req.lora_path = lora.map(String::from);
                    e.submit(req).unwrap()
                })
                .collect();
            let tokens: Vec<Vec<u32>> = streams.into_iter().map(|s| collect(s).0).collect();
            assert_drained(&e);
            tokens
        };
        let (one, two) = (run(1), run(2));
        assert_eq!(one, two, "{arch}");
        assert!(one[0] != one[1] && one[1] != one[2] && one[0] != one[2], "{arch}: the adapters change the tokens");
    }
}
