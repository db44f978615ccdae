//! The engine's numbers against transformers', no Python: a tiny random Llama (float32
//! safetensors, loaded by the engine's own reader) and transformers' logits at every position of
//! a fixed prompt, both written by tests/data/make_reference_logits.py into tests/data/tiny-llama.

use rsgl_engine::{Engine, EngineOptions, GenerateRequest, ModelConfig, Output, WeightStore};
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

/// Of a position's largest reference logit (float32 on both sides; kernels differ in summation order).
const RELATIVE_TOLERANCE: f64 = 1e-4;

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny-llama")
}

/// (prompt, transformers' logits after each prompt position).
fn reference() -> (Vec<u32>, Vec<Vec<f64>>) {
    let text = std::fs::read_to_string(data_dir().join("logits.json")).unwrap();
    let json: Value = serde_json::from_str(&text).unwrap();
    let prompt = json["prompt"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let rows = json["logits"].as_array().unwrap();
    let logits = rows.iter().map(|row| row.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect()).collect();
    (prompt, logits)
}

fn engine(options: &str) -> Engine {
    let dir = data_dir();
    let cfg = ModelConfig::from_json(&std::fs::read_to_string(dir.join("rsgl_config.json")).unwrap()).unwrap();
    let weights = WeightStore::open_safetensors(&[dir.join("model.safetensors")]).unwrap();
    Engine::start(cfg, weights, None, vec![], EngineOptions::from_json(options).unwrap()).unwrap()
}

/// The request's final output (no new tokens are generated).
fn run(e: &Engine, request: &str) -> Output {
    let mut stream = e.submit(GenerateRequest::from_json(request).unwrap()).unwrap();
    loop {
        let out = stream.next(Duration::from_secs(30)).unwrap().expect("the engine answered in time");
        if out.finished.is_some() {
            return out;
        }
    }
}

/// Largest |got - want| over a position, as a fraction of the position's largest |want|.
fn relative_error(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    got.iter().zip(want).fold(0.0f64, |m, (g, w)| m.max((g - w).abs())) / scale
}

fn log_softmax(row: &[f64]) -> Vec<f64> {
    let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let log_sum = row.iter().map(|v| (v - max).exp()).sum::<f64>().ln() + max;
    row.iter().map(|v| v - log_sum).collect()
}

#[test]
fn last_position_logits_of_every_prefix_match_transformers() {
    let (prompt, want) = reference();
    // Without the prefix cache every prefix is prefilled whole, so each row comes from one forward pass.
    let e = engine(r#"{"threads": 1, "page_size": 4, "max_total_tokens": 256, "disable_radix_cache": true}"#);
    for len in 1..=prompt.len() {
        let request =
            format!(r#"{{"rid": "p{len}", "input_ids": {:?}, "sampling_params": {{"max_new_tokens": 0}}, "return_prompt_logits": true}}"#, &prompt[..len]);
        let got: Vec<f64> = run(&e, &request).prompt_logits.expect("prompt logits returned").into_iter().map(f64::from).collect();
        let error = relative_error(&got, &want[len - 1]);
        assert!(error <= RELATIVE_TOLERANCE, "position {}: logits differ from transformers' by {error:.2e} of their largest", len - 1);
    }
}

#[test]
fn prompt_logprobs_match_transformers() {
    // One prefill of the whole prompt scores every position; the softmax of the reference gives
    // log P(prompt[i] | prompt[..i]), compared against the scale of that position's log-probabilities.
    let (prompt, want) = reference();
    let e = engine(r#"{"threads": 1, "page_size": 4, "max_total_tokens": 256}"#);
    let request = format!(r#"{{"rid": "all", "input_ids": {prompt:?}, "sampling_params": {{"max_new_tokens": 0}}, "logprob_start_len": 0}}"#);
    let got = run(&e, &request).input_token_logprobs.expect("prompt log-probabilities returned");
    assert_eq!(got.len(), prompt.len() - 1);
    for (i, scored) in got.iter().enumerate() {
        assert_eq!(scored.token_id, prompt[i + 1]);
        let logprob = scored.logprob;
        let reference = log_softmax(&want[i]);
        let scale = reference.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let error = (f64::from(logprob) - reference[prompt[i + 1] as usize]).abs() / scale;
        assert!(error <= RELATIVE_TOLERANCE, "position {}: log-probability {logprob} differs from transformers' by {error:.2e}", i + 1);
    }
}
