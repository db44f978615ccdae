//! Tensor parallelism (`tp_size`): two ranks, each with a slice of every layer and of the KV
//! cache, give the greedy tokens of one rank, for every architecture and precision; ranks must
//! hold whole kv heads.

mod common;

use common::*;
use rsgl_engine::{Engine, EngineError, EngineOptions};

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
