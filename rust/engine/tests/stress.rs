//! 500 requests with random lengths, shared prefixes, aborts and n > 1 samples, through a KV pool
//! far too small to hold them at once: every request ends as asked, greedy outputs equal the same
//! requests run one at a time without the prefix cache, and the pool drains back to empty. Again
//! with a sliding layer that keeps only its window, its window pool small too.

mod common;

use common::*;
use rsgl_engine::request::FinishReason;
use rsgl_engine::sample::Rng;
use std::collections::HashMap;

struct Case {
    rid: String,
    prompt: Vec<u32>,
    max_new: usize,
    abort: bool,
}

fn cases(count: usize) -> Vec<Case> {
    let mut rng = Rng::new(2024);
    let prefixes: Vec<Vec<u32>> = (0..6).map(|i| prompt(100 + i, 8 + 7 * i as usize)).collect();
    let mut out = Vec::new();
    while out.len() < count {
        let n = out.len();
        let mut tokens = prefixes[(rng.next_u64() % 6) as usize].clone();
        tokens.extend(prompt(n as u64, 1 + (rng.next_u64() % 20) as usize));
        let max_new = 1 + (rng.next_u64() % 24) as usize;
        // n > 1: the same prompt sampled several times (greedy here, so the samples agree).
        let samples = if rng.next_u64().is_multiple_of(5) { 3 } else { 1 };
        for s in 0..samples {
            let abort = rng.next_u64().is_multiple_of(10);
            out.push(Case { rid: format!("r{n}-{s}"), prompt: tokens.clone(), max_new, abort });
        }
    }
    out.truncate(count);
    out
}

#[test]
fn five_hundred_requests_through_a_small_pool() {
    same_outputs_as_alone(&["fcfs", "lpm", "dfs-weight"], |opts| engine("llama", opts));
}

#[test]
fn five_hundred_requests_through_small_pools_with_a_sliding_layer() {
    same_outputs_as_alone(&["fcfs", "lpm"], |opts| {
        // 24 window pages of 4 tokens: 8 requests' windows (of 6 tokens: 3 pages each) at a time.
        let opts = opts.replace('}', r#", "swa_full_tokens_ratio": 0.6}"#);
        let e = sliding_engine(6, &opts);
        assert_eq!(e.stats().kv_window_pages_total, 24);
        e
    });
}

/// Runs the cases under each policy on engines `make` starts (from their options), and checks
/// the outputs against the same requests run one at a time without the prefix cache.
fn same_outputs_as_alone(policies: &[&str], make: impl Fn(&str) -> rsgl_engine::Engine) {
    let cases = cases(500);
    let alone = make(r#"{"page_size": 4, "max_total_tokens": 160, "disable_radix_cache": true, "threads": 2}"#);
    let mut reference = HashMap::new();
    for policy in policies {
        let outputs = run_all(&cases, policy, &make);
        for c in cases.iter().filter(|c| outputs.contains_key(&c.rid)) {
            let want = reference.entry(c.rid.clone()).or_insert_with(|| collect(alone.submit(request(&c.rid, c.prompt.clone(), c.max_new)).unwrap()).0);
            assert_eq!(want, &outputs[&c.rid], "{policy}: {} differs from its run alone", c.rid);
        }
    }
    assert_drained(&alone);
}

/// Runs every case at once under `policy`; returns the outputs of those that finished.
fn run_all(cases: &[Case], policy: &str, make: impl Fn(&str) -> rsgl_engine::Engine) -> HashMap<String, Vec<u32>> {
    // 40 pages of 4 tokens: a handful of requests at a time, and no pages kept back for their
    // output, so decodes must retract others.
    let e = make(&format!(
        r#"{{"page_size": 4, "max_total_tokens": 160, "chunked_prefill_size": 32, "max_running_requests": 16, "threads": 2, "schedule_policy": "{policy}", "schedule_conservativeness": 0.0}}"#
    ));
    let streams: Vec<_> = cases.iter().map(|c| e.submit(request(&c.rid, c.prompt.clone(), c.max_new)).unwrap()).collect();
    for c in cases.iter().filter(|c| c.abort) {
        e.abort(&c.rid);
    }
    let mut outputs = HashMap::new();
    for (c, s) in cases.iter().zip(streams) {
        let (tokens, last) = collect(s);
        let fin = last.finished.expect("every stream ends with a finish");
        match fin.finish_reason {
            FinishReason::Abort { .. } => assert!(c.abort, "{policy}: {} was aborted without being asked", c.rid),
            FinishReason::Length { length } => {
                assert_eq!((length, tokens.len()), (c.max_new, c.max_new), "{}", c.rid);
                outputs.insert(c.rid.clone(), tokens);
            }
            other => panic!("{}: unexpected finish {other:?}", c.rid),
        }
    }
    let stats = e.stats();
    assert!(stats.retracted_requests > 0, "the pool was meant to run dry: {stats:?}");
    assert!(stats.cache_hit_tokens > 0, "shared prefixes were meant to hit: {stats:?}");
    assert!(outputs.len() >= 400, "most requests finish: {}", outputs.len());
    assert_drained(&e);
    outputs
}
