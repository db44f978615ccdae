//! The engine end to end on a tiny random Llama-family model, no Python: batching does not
//! change greedy outputs, pages all come back, aborts and bad requests are handled.

use rsgl_engine::sample::Rng;
use rsgl_engine::{Engine, EngineError, EngineOptions, GenerateRequest, ModelConfig, Output, WeightStore};
use std::time::Duration;

const VOCAB: usize = 97;

fn config(arch: &str) -> ModelConfig {
    ModelConfig::from_json(&format!(
        r#"{{"architecture": "{arch}", "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": {VOCAB},
            "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": null,
            "attention_bias": {bias}, "qk_norm": {qk}, "tie_word_embeddings": true, "max_position_embeddings": 4096}}"#,
        bias = arch == "qwen2",
        qk = arch == "qwen3"
    ))
    .unwrap()
}

fn weights(cfg: &ModelConfig) -> WeightStore {
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
        for (name, out) in [("q_proj", cfg.q_size()), ("k_proj", cfg.kv_size()), ("v_proj", cfg.kv_size())] {
            add(format!("{p}.self_attn.{name}.weight"), vec![out, h], 0.3);
            if cfg.attention_bias {
                add(format!("{p}.self_attn.{name}.bias"), vec![out], 0.3);
            }
        }
        if cfg.qk_norm {
            add(format!("{p}.self_attn.q_norm.weight"), vec![cfg.head_dim], 1.0);
            add(format!("{p}.self_attn.k_norm.weight"), vec![cfg.head_dim], 1.0);
        }
        add(format!("{p}.self_attn.o_proj.weight"), vec![h, cfg.q_size()], 0.3);
        add(format!("{p}.mlp.gate_proj.weight"), vec![i, h], 0.3);
        add(format!("{p}.mlp.up_proj.weight"), vec![i, h], 0.3);
        add(format!("{p}.mlp.down_proj.weight"), vec![h, i], 0.3);
    }
    w
}

fn engine(arch: &str, opts: &str) -> Engine {
    let cfg = config(arch);
    let w = weights(&cfg);
    Engine::start(cfg, w, None, vec![], EngineOptions::from_json(opts).unwrap()).unwrap()
}

fn request(rid: &str, prompt: Vec<u32>, max_new: usize) -> GenerateRequest {
    GenerateRequest::from_json(&format!(
        r#"{{"rid": "{rid}", "input_ids": {prompt:?}, "sampling_params": {{"temperature": 0, "max_new_tokens": {max_new}}}}}"#
    ))
    .unwrap()
}

fn collect(mut stream: rsgl_engine::RequestStream) -> (Vec<u32>, Output) {
    let mut tokens = Vec::new();
    loop {
        let out = stream.next(Duration::from_secs(30)).unwrap().expect("engine answered in time");
        tokens.extend(&out.token_ids);
        if out.finished.is_some() {
            return (tokens, out);
        }
    }
}

fn prompt(seed: u64, len: usize) -> Vec<u32> {
    let mut rng = Rng::new(seed);
    (0..len).map(|_| (rng.next_u64() % VOCAB as u64) as u32).collect()
}

fn wait_for_empty_pool(e: &Engine) {
    for _ in 0..200 {
        let s = e.stats();
        if s.kv_pages_free == s.kv_pages_total && s.running_requests == 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("KV pages did not all come back: {:?}", e.stats());
}

#[test]
fn batched_greedy_equals_one_at_a_time() {
    for arch in ["llama", "qwen2", "qwen3"] {
        // A small prefill budget forces chunked prefills next to decodes.
        let e = engine(arch, r#"{"page_size": 4, "chunked_prefill_size": 16, "max_total_tokens": 512, "threads": 2}"#);
        let prompts: Vec<Vec<u32>> = (0..6).map(|i| prompt(i, 1 + 7 * i as usize)).collect();
        let alone: Vec<Vec<u32>> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| collect(e.submit(request(&format!("a{i}"), p.clone(), 12)).unwrap()).0)
            .collect();
        let streams: Vec<_> = prompts.iter().enumerate().map(|(i, p)| e.submit(request(&format!("b{i}"), p.clone(), 12)).unwrap()).collect();
        let together: Vec<Vec<u32>> = streams.into_iter().map(|s| collect(s).0).collect();
        assert_eq!(alone, together, "{arch}");
        assert!(alone.iter().all(|t| t.len() == 12));
        wait_for_empty_pool(&e);
    }
}

#[test]
fn requests_wait_for_pages_and_all_finish() {
    // Room for two requests at a time; ten are queued.
    let e = engine("llama", r#"{"page_size": 4, "max_total_tokens": 64, "threads": 1}"#);
    let streams: Vec<_> = (0..10).map(|i| e.submit(request(&format!("r{i}"), prompt(i, 10), 20)).unwrap()).collect();
    for s in streams {
        let (tokens, out) = collect(s);
        assert_eq!(tokens.len(), 20);
        let fin = out.finished.unwrap();
        assert_eq!((fin.prompt_tokens, fin.completion_tokens), (10, 20));
    }
    wait_for_empty_pool(&e);
}

#[test]
fn abort_and_dropped_streams_free_their_pages() {
    // Thousands of tokens to go when the abort arrives, microseconds later.
    let e = engine("llama", r#"{"page_size": 4, "max_total_tokens": 8192, "threads": 1}"#);
    let mut long = e.submit(request("long", prompt(1, 5), 4000)).unwrap();
    let dropped = e.submit(request("gone", prompt(2, 5), 4000)).unwrap();
    drop(dropped);
    long.next(Duration::from_secs(30)).unwrap();
    e.abort("long");
    let (_, last) = collect(long);
    assert!(matches!(last.finished.unwrap().finish_reason, rsgl_engine::request::FinishReason::Abort { .. }));
    wait_for_empty_pool(&e);
}

#[test]
fn bad_requests_are_refused_and_the_engine_keeps_serving() {
    let e = engine("llama", r#"{"page_size": 4, "max_total_tokens": 64, "threads": 1}"#);
    let too_long = e.submit(request("x", prompt(1, 5000), 1));
    assert!(matches!(too_long, Err(EngineError::InvalidRequest(m)) if m.contains("context length")));
    let too_big = e.submit(request("y", prompt(1, 10), 100));
    assert!(matches!(too_big, Err(EngineError::InvalidRequest(m)) if m.contains("pool")));
    let bad_token = e.submit(request("z", vec![VOCAB as u32], 1));
    assert!(matches!(bad_token, Err(EngineError::InvalidRequest(_))));
    let (tokens, _) = collect(e.submit(request("ok", prompt(1, 3), 4)).unwrap());
    assert_eq!(tokens.len(), 4);
}

#[test]
fn missing_tensor_is_a_load_error() {
    let cfg = config("llama");
    let mut w = weights(&cfg);
    w.take("model.norm.weight", &[32]).unwrap();
    let err = Engine::start(cfg, w, None, vec![], EngineOptions::default()).err().unwrap();
    assert!(matches!(err, EngineError::ModelLoad(m) if m.contains("model.norm.weight")));
}
