//! Speculative decoding on a tiny random model: greedy output identical to plain decoding (alone,
//! batched, with stop tokens and budgets), the sampling distribution unchanged (chi-square), and
//! the pool drained after.

mod common;

use common::*;
use rsgl_engine::{Engine, GenerateRequest, Output};

const ALGORITHMS: [&str; 2] = ["ngram", "suffix"];
const POOL: &str = r#""page_size": 4, "chunked_prefill_size": 16, "max_total_tokens": 2048, "threads": 2"#;

/// Verifies every draft token (no budget), so the tests know drafts are verified whatever this
/// machine's step times are; `budgeted` checks the budget changes no output.
fn speculating(arch: &str, algorithm: &str) -> Engine {
    engine(arch, &format!(r#"{{{POOL}, "speculative_algorithm": "{algorithm}", "speculative_num_draft_tokens": 5, "speculative_draft_budget": false}}"#))
}

/// A prompt that repeats a phrase, so drafts find matches from the first step.
fn repetitive_prompt(seed: u64, len: usize) -> Vec<u32> {
    prompt(seed, 6).into_iter().cycle().take(len).collect()
}

fn sampled(rid: &str, prompt: &[u32], max_new: usize, params: &str) -> GenerateRequest {
    GenerateRequest::from_json(&format!(r#"{{"rid": "{rid}", "input_ids": {prompt:?}, "sampling_params": {{"max_new_tokens": {max_new}, {params}}}}}"#))
        .unwrap()
}

fn run_all(e: &Engine, requests: Vec<GenerateRequest>) -> Vec<(Vec<u32>, Output)> {
    let streams: Vec<_> = requests.into_iter().map(|r| e.submit(r).unwrap()).collect();
    streams.into_iter().map(collect).collect()
}

#[test]
fn greedy_output_is_plain_decodings_alone_and_batched() {
    for arch in ["llama", "qwen2_moe"] {
        let plain = engine(arch, &format!("{{{POOL}}}"));
        let prompts: Vec<Vec<u32>> = (0..6).map(|i| if i % 2 == 0 { repetitive_prompt(i, 30) } else { prompt(i, 3 + 5 * i as usize) }).collect();
        let requests = || prompts.iter().enumerate().map(|(i, p)| request(&format!("r{i}"), p.clone(), 40)).collect::<Vec<_>>();
        let want: Vec<Vec<u32>> = requests().into_iter().map(|r| collect(plain.submit(r).unwrap()).0).collect();
        for algorithm in ALGORITHMS {
            let budgeted = engine(arch, &format!(r#"{{{POOL}, "speculative_algorithm": "{algorithm}", "speculative_num_draft_tokens": 5}}"#));
            let outputs = run_all(&budgeted, requests()).into_iter().map(|(tokens, _)| tokens).collect::<Vec<_>>();
            assert_eq!(outputs, want, "{arch} {algorithm}: batched, draft budget on");
            assert_drained(&budgeted);
            let e = speculating(arch, algorithm);
            let alone: Vec<Vec<u32>> = requests().into_iter().map(|r| collect(e.submit(r).unwrap()).0).collect();
            let together = run_all(&e, requests());
            assert_eq!(alone, want, "{arch} {algorithm}: alone");
            assert_eq!(together.iter().map(|(t, _)| t.clone()).collect::<Vec<_>>(), want, "{arch} {algorithm}: batched");
            let accepted: usize = together.iter().map(|(_, out)| out.finished.as_ref().unwrap().spec_accepted_tokens).sum();
            assert!(accepted > 0, "{arch} {algorithm}: no draft token was ever accepted, so nothing was verified");
            let verify_steps: usize = together.iter().map(|(_, out)| out.finished.as_ref().unwrap().spec_verify_ct).sum();
            let decode_steps: usize = together.iter().map(|(_, out)| out.finished.as_ref().unwrap().decode_steps).sum();
            assert!(decode_steps < 6 * 40, "{arch} {algorithm}: {decode_steps} decode steps for 240 tokens ({verify_steps} verified a draft)");
            assert_drained(&e);
        }
    }
}

#[test]
fn budgets_and_stop_tokens_end_inside_an_accepted_draft() {
    let plain = engine("llama", &format!("{{{POOL}}}"));
    let repeated = repetitive_prompt(3, 40);
    let free = collect(plain.submit(request("free", repeated.clone(), 30)).unwrap()).0;
    let stop = free[7]; // a token the output reaches after a few steps
    for algorithm in ALGORITHMS {
        let e = speculating("llama", algorithm);
        for max_new in [1, 2, 7, 13] {
            let (tokens, _) = collect(e.submit(request(&format!("m{max_new}"), repeated.clone(), max_new)).unwrap());
            assert_eq!(tokens, free[..max_new], "{algorithm}: max_new_tokens {max_new}");
        }
        let stopped = sampled("stop", &repeated, 30, &format!(r#""temperature": 0, "stop_token_ids": [{stop}]"#));
        let (tokens, out) = collect(e.submit(stopped).unwrap());
        let end = free.iter().position(|&t| t == stop).unwrap() + 1;
        assert_eq!(tokens, free[..end], "{algorithm}: stop token");
        assert_eq!(out.finished.unwrap().completion_tokens, end);
        assert_drained(&e);
    }
}

/// Two-sample chi-square test of the distribution of each of the first output tokens, with and
/// without speculation: drafts must change how tokens are drawn, never which are likely.
#[test]
fn sampling_keeps_the_models_distribution() {
    const SAMPLES: usize = 1500;
    const POSITIONS: usize = 12;
    const WAVE: usize = 100;
    let repeated = repetitive_prompt(5, 24);
    let params = r#""temperature": 0.4, "seed": SEED"#;
    let histograms = |e: &Engine, tag: &str| {
        // In waves: with all samples queued at once, an early request waits for the whole queue's
        // prefill between two tokens, past `collect`'s timeout on a slow emulated CPU.
        let outputs: Vec<_> = (0..SAMPLES)
            .step_by(WAVE)
            .flat_map(|first| {
                let wave =
                    (first..SAMPLES.min(first + WAVE)).map(|i| sampled(&format!("{tag}{i}"), &repeated, POSITIONS, &params.replace("SEED", &i.to_string())));
                run_all(e, wave.collect())
            })
            .collect();
        let mut counts = vec![vec![0usize; VOCAB]; POSITIONS];
        for (tokens, _) in &outputs {
            tokens.iter().enumerate().for_each(|(position, &t)| counts[position][t as usize] += 1);
        }
        let accepted: usize = outputs.iter().map(|(_, out)| out.finished.as_ref().unwrap().spec_accepted_tokens).sum();
        (counts, accepted)
    };
    let (plain, _) = histograms(&engine("llama", &format!("{{{POOL}}}")), "p");
    for algorithm in ALGORITHMS {
        let (speculated, accepted) = histograms(&speculating("llama", algorithm), algorithm);
        assert!(accepted > SAMPLES / 10, "{algorithm}: only {accepted} draft tokens accepted; the test would not exercise verification");
        for position in 0..POSITIONS {
            let (statistic, df) = chi_square(&plain[position], &speculated[position]);
            let critical = chi_square_critical_0001(df);
            assert!(statistic < critical, "{algorithm}: position {position}: chi-square {statistic:.1} >= {critical:.1} (df {df})");
        }
    }
}

/// The two-sample chi-square statistic over categories with at least 5 expected per sample
/// (rarer ones pooled into one), and its degrees of freedom.
fn chi_square(a: &[usize], b: &[usize]) -> (f64, usize) {
    let (total_a, total_b) = (a.iter().sum::<usize>() as f64, b.iter().sum::<usize>() as f64);
    let mut cells: Vec<(f64, f64)> = Vec::new();
    let mut rare = (0.0, 0.0);
    for (&x, &y) in a.iter().zip(b) {
        let expected_a = (x + y) as f64 * total_a / (total_a + total_b);
        if expected_a >= 5.0 && (x + y) as f64 - expected_a >= 5.0 {
            cells.push((x as f64, y as f64));
        } else {
            rare = (rare.0 + x as f64, rare.1 + y as f64);
        }
    }
    if rare.0 + rare.1 > 0.0 {
        cells.push(rare);
    }
    let statistic = cells
        .iter()
        .map(|&(x, y)| {
            let expected_a = (x + y) * total_a / (total_a + total_b);
            let expected_b = (x + y) - expected_a;
            (x - expected_a).powi(2) / expected_a.max(1e-9) + (y - expected_b).powi(2) / expected_b.max(1e-9)
        })
        .sum();
    (statistic, cells.len().saturating_sub(1).max(1))
}

/// The chi-square critical value at p = 0.0001 (Wilson-Hilferty approximation).
fn chi_square_critical_0001(df: usize) -> f64 {
    let k = df as f64;
    let z = 3.719; // standard normal quantile of 0.9999
    k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3)
}
