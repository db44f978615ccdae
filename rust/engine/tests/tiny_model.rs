//! The engine end to end on a tiny random Llama-family model, no Python: batching does not
//! change greedy outputs, pages all come back, aborts and bad requests are handled.

mod common;

use common::*;
use rsgl_engine::{Engine, EngineError, EngineOptions};
use std::time::Duration;

#[test]
fn batched_greedy_equals_one_at_a_time() {
    // Float weights, then W8A8 (activations quantized per token, so per request too).
    let precisions = [r#""dtype": "bfloat16""#, r#""quantization": "w8a8_int8", "quantize_lm_head": true"#];
    for (arch, precision) in ["llama", "qwen2", "qwen3", "mixtral", "qwen2_moe"].into_iter().flat_map(|a| precisions.map(|p| (a, p))) {
        // A small prefill budget forces chunked prefills next to decodes.
        let e = engine(arch, &format!(r#"{{"page_size": 4, "chunked_prefill_size": 16, "max_total_tokens": 512, "threads": 2, {precision}}}"#));
        let prompts: Vec<Vec<u32>> = (0..6).map(|i| prompt(i, 1 + 7 * i as usize)).collect();
        let alone: Vec<Vec<u32>> = prompts.iter().enumerate().map(|(i, p)| collect(e.submit(request(&format!("a{i}"), p.clone(), 12)).unwrap()).0).collect();
        let streams: Vec<_> = prompts.iter().enumerate().map(|(i, p)| e.submit(request(&format!("b{i}"), p.clone(), 12)).unwrap()).collect();
        let together: Vec<Vec<u32>> = streams.into_iter().map(|s| collect(s).0).collect();
        assert_eq!(alone, together, "{arch} {precision}");
        assert!(alone.iter().all(|t| t.len() == 12));
        assert_drained(&e);
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
    assert_drained(&e);
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
    assert_drained(&e);
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

#[test]
fn identical_prompts_arriving_together_are_prefilled_once() {
    let e = engine("llama", r#"{"page_size": 4, "max_total_tokens": 1024, "threads": 1}"#);
    let shared = prompt(9, 41);
    let streams: Vec<_> = (0..3).map(|i| e.submit(request(&format!("n{i}"), shared.clone(), 5)).unwrap()).collect();
    let results: Vec<_> = streams.into_iter().map(collect).collect();
    assert!(results.windows(2).all(|w| w[0].0 == w[1].0), "greedy samples of one prompt agree");
    let cached: Vec<usize> = results.iter().map(|(_, out)| out.finished.as_ref().unwrap().cached_tokens).collect();
    // The first computes all 41 tokens; the others reuse its 10 whole pages and compute one more.
    assert_eq!(cached, vec![0, 40, 40]);
    assert_eq!(e.stats().computed_prompt_tokens, 41 + 1 + 1);
    assert_drained(&e);
}

#[test]
fn aborting_a_group_id_aborts_every_sample() {
    let e = engine("llama", r#"{"page_size": 4, "max_total_tokens": 8192, "threads": 1}"#);
    let sample = |i: usize| {
        let mut req = request(&format!("g-{i}"), prompt(3, 6), 4000);
        req.group = Some("g".into());
        e.submit(req).unwrap()
    };
    let streams: Vec<_> = (0..3).map(sample).collect();
    e.abort("g");
    for s in streams {
        let (_, last) = collect(s);
        assert!(matches!(last.finished.unwrap().finish_reason, rsgl_engine::request::FinishReason::Abort { .. }));
    }
    assert_drained(&e);
}

/// At a long context a sequence's decode splits its key blocks over threads (flash-decoding)
/// unless enough sequences share the step; either way its greedy tokens and their
/// log-probabilities are the same bits. Grouped-query attention (a task per kv head) and latent
/// attention (one task per sequence).
#[test]
fn long_context_decode_split_over_threads_gives_the_same_bits() {
    for arch in ["llama", "deepseek_v3"] {
        let e = engine(arch, r#"{"page_size": 4, "chunked_prefill_size": 16384, "max_total_tokens": 12000, "threads": 2, "disable_radix_cache": true}"#);
        let request = |rid: &str, seed: u64| {
            let json = format!(
                r#"{{"rid": "{rid}", "input_ids": {:?}, "sampling_params": {{"temperature": 0, "max_new_tokens": 6}}, "return_logprob": true}}"#,
                prompt(seed, 1200)
            );
            rsgl_engine::GenerateRequest::from_json(&json).unwrap()
        };
        let bits = |stream| {
            let mut stream: rsgl_engine::RequestStream = stream;
            let mut got = Vec::new();
            loop {
                let out = stream.next(Duration::from_secs(60)).unwrap().expect("engine answered in time");
                got.extend(out.token_ids.iter().copied().zip(out.logprobs.iter().map(|l| l.logprob.to_bits())));
                if out.finished.is_some() {
                    return got;
                }
            }
        };
        let alone = bits(e.submit(request("alone", 3)).unwrap());
        let streams: Vec<_> = (0..8).map(|i| e.submit(request(&format!("b{i}"), 3 + i)).unwrap()).collect();
        let batched: Vec<_> = streams.into_iter().map(bits).collect();
        assert_eq!(alone.len(), 6, "{arch}");
        assert_eq!(alone, batched[0], "{arch}: one sequence split over threads vs eight sharing the step");
        assert_drained(&e);
    }
}
