//! Multi-head latent attention's two forms read the same latent pages: a prompt prefilled in one
//! chunk (long enough for the expanded form) and in short chunks (the absorbed form) gives the same
//! logits up to float rounding, and the same greedy tokens; the pages return to the pool after.

mod common;

use common::*;
use rsgl_engine::GenerateRequest;

/// The prompt's logits at every position, then its greedy continuation.
fn prefill_logits_and_tokens(chunked_prefill_size: usize, prompt: &[u32]) -> (Vec<f32>, Vec<u32>) {
    let opts = format!(r#"{{"page_size": 4, "chunked_prefill_size": {chunked_prefill_size}, "max_total_tokens": 512, "threads": 2, "dtype": "float32"}}"#);
    let e = engine("deepseek_v3", &opts);
    let logits_request = format!(r#"{{"rid": "l", "input_ids": {prompt:?}, "sampling_params": {{"max_new_tokens": 0}}, "return_prompt_logits": true}}"#);
    let (_, out) = collect(e.submit(GenerateRequest::from_json(&logits_request).unwrap()).unwrap());
    let (tokens, _) = collect(e.submit(request("g", prompt.to_vec(), 12)).unwrap());
    assert_drained(&e);
    (out.prompt_logits.expect("prompt logits returned"), tokens)
}

#[test]
fn absorbed_and_expanded_attention_agree() {
    let prompt = prompt(7, 61);
    // The tiny config expands chunks of 25 tokens or more.
    let (expanded, expanded_tokens) = prefill_logits_and_tokens(64, &prompt);
    let (absorbed, absorbed_tokens) = prefill_logits_and_tokens(8, &prompt);
    assert_eq!(expanded.len(), absorbed.len());
    let largest = absorbed.iter().fold(0f32, |m, x| m.max(x.abs()));
    let worst = expanded.iter().zip(&absorbed).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst <= 1e-4 * largest, "the forms differ by {worst} (logits up to {largest})");
    assert!(expanded != absorbed, "both runs took the same form");
    assert_eq!(expanded_tokens, absorbed_tokens);
}
