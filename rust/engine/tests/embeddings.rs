//! Embedding engines (`is_embedding`): each pooling gives the same vector whatever the prefill
//! chunks and the company in the batch, unit length, and the KV pool empties after.

mod common;

use common::{assert_drained, collect, config, prompt, weights};
use rsgl_engine::pooling::Pooling;
use rsgl_engine::{EmbedRequest, Engine, EngineError, EngineOptions};

fn embedding_engine(pooling: Pooling, opts: &str) -> Engine {
    let mut cfg = config("llama");
    cfg.pooling = Some(pooling);
    let w = weights(&cfg);
    let opts = EngineOptions { is_embedding: true, ..EngineOptions::from_json(opts).unwrap() };
    Engine::start(cfg, w, None, vec![], opts).unwrap()
}

fn embed(e: &Engine, rid: &str, input_ids: Vec<u32>) -> Vec<f32> {
    let (_, out) = collect(e.embed(EmbedRequest { rid: rid.into(), input_ids }, None).unwrap());
    out.embedding.expect("an embedding in the final output")
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[test]
fn chunked_and_batched_prefill_pool_as_one_pass() {
    let prompts: Vec<Vec<u32>> = [37, 5, 64, 1].iter().enumerate().map(|(i, &n)| prompt(i as u64, n)).collect();
    for pooling in [Pooling::Last, Pooling::Mean, Pooling::Cls] {
        let whole = embedding_engine(pooling, r#"{"threads": 1, "pin_threads": false}"#);
        let alone: Vec<Vec<f32>> = prompts.iter().enumerate().map(|(i, p)| embed(&whole, &format!("w{i}"), p.clone())).collect();
        // Chunks of 8 and a pool of 8 pages of 4 tokens: prompts wait, split and share steps.
        let chunked = embedding_engine(pooling, r#"{"threads": 1, "pin_threads": false, "chunked_prefill_size": 8, "page_size": 4, "max_total_tokens": 80}"#);
        let streams: Vec<_> =
            prompts.iter().enumerate().map(|(i, p)| chunked.embed(EmbedRequest { rid: format!("c{i}"), input_ids: p.clone() }, None).unwrap()).collect();
        for (stream, expected) in streams.into_iter().zip(&alone) {
            let (tokens, out) = collect(stream);
            let got = out.embedding.expect("an embedding");
            assert!(tokens.is_empty() && got.len() == 32);
            assert!((got.iter().map(|x| x * x).sum::<f32>() - 1.0).abs() < 1e-5, "{pooling:?}: not unit length");
            assert!(max_diff(&got, expected) < 1e-5, "{pooling:?}: chunked differs by {}", max_diff(&got, expected));
        }
        assert_drained(&chunked);
        let stats = chunked.stats();
        assert_eq!((stats.kv_pages_free, stats.cached_pages), (stats.kv_pages_total, 0));
    }
}

#[test]
fn embedding_and_generation_engines_refuse_each_others_requests() {
    let embedder = embedding_engine(Pooling::Last, r#"{"threads": 1, "pin_threads": false, "context_length": 16}"#);
    let refused = |r: Result<rsgl_engine::RequestStream, EngineError>| matches!(r, Err(EngineError::InvalidRequest(_)));
    assert!(refused(embedder.submit(common::request("g", vec![1, 2], 1))));
    assert!(refused(embedder.embed(EmbedRequest { rid: "long".into(), input_ids: prompt(1, 17) }, None)));
    assert!(refused(embedder.embed(EmbedRequest { rid: "empty".into(), input_ids: vec![] }, None)));
    assert_eq!(embed(&embedder, "full", prompt(1, 16)).len(), 32, "a prompt may fill the context");
    let generator = common::engine("llama", r#"{"threads": 1, "pin_threads": false}"#);
    assert!(refused(generator.embed(EmbedRequest { rid: "e".into(), input_ids: vec![1] }, None)));
}
