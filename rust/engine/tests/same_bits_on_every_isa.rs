//! Every kernel path computes its portable twin's bits (the kernels' twin tests), so a model
//! generates the same tokens from the same logits on every ISA. Here whole models check it: the
//! greedy tokens and the logits after them, hashed, must equal what was recorded once. The
//! aarch64 lane runs this under qemu for SVE, NEON (+BF16), dotprod, I8MM and portable, and x86_64
//! for AVX2 (and AVX-512 where the CPU has it). 8-bit activations are the sharp case: a last-bit
//! difference before an activation's rounding can move a quant and part the greedy text.
//!
//! bfloat16 weights are left out: on CPUs with BF16 dot products the GEMM rounds activations to
//! bf16 (for speed), on purpose not the bits of the f32 path.

mod common;

use common::*;
use rsgl_engine::{Engine, EngineOptions, GenerateRequest};

/// FNV-1a over 32-bit words.
fn hash(words: impl IntoIterator<Item = u32>, mut h: u64) -> u64 {
    for w in words {
        for b in w.to_le_bytes() {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    h
}

/// Greedy tokens of a few prompts, then the logits after each prompt and its tokens, hashed.
fn fingerprint(e: &Engine) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325;
    for i in 0..3 {
        let prompt = prompt(100 + i, 3 + 11 * i as usize);
        let (tokens, _) = collect(e.submit(request(&format!("g{i}"), prompt.clone(), 10)).unwrap());
        let whole: Vec<u32> = prompt.iter().chain(&tokens).copied().collect();
        let logits_request = format!(r#"{{"rid": "l{i}", "input_ids": {whole:?}, "sampling_params": {{"max_new_tokens": 0}}, "return_prompt_logits": true}}"#);
        let (_, out) = collect(e.submit(GenerateRequest::from_json(&logits_request).unwrap()).unwrap());
        h = hash(tokens, h);
        h = hash(out.prompt_logits.expect("prompt logits returned").iter().map(|v| v.to_bits()), h);
    }
    h
}

/// (architecture, precision, the fingerprint recorded on x86_64 AVX2).
const CASES: [(&str, &str, u64); 7] = [
    ("llama", r#""dtype": "float32""#, 0xab2f_1062_518c_581a),
    ("qwen2_moe", r#""dtype": "float32""#, 0x63c7_b134_2823_50f1),
    ("llama", r#""quantization": "w4a8""#, 0xbd66_4721_dfcf_9c77),
    ("mixtral", r#""quantization": "w4a8""#, 0x7fc7_037a_0529_8f16),
    ("llama", r#""quantization": "w8a8_int8", "quantize_lm_head": true"#, 0x0b7a_ab5f_63bc_bc0e),
    // The delta rule, its convolution and gates: portable Rust with the kernels' exp and ln.
    ("qwen3_5_text", r#""dtype": "float32""#, 0x43f8_be93_8011_d423),
    // Latent attention (absorbed: the chunks are shorter than the expanded form pays off at) and grouped sigmoid routing.
    ("deepseek_v3", r#""dtype": "float32""#, 0x9e29_c454_9484_b658),
];

/// The fingerprint of a small model of `arch` in `precision` on `threads` compute threads.
fn fingerprint_of(arch: &str, precision: &str, threads: usize) -> u64 {
    let mut cfg = config(arch);
    // Whole 32-input blocks, so 4-bit weights stay 4-bit.
    (cfg.hidden_size, cfg.intermediate_size) = (64, 64);
    if cfg.latent_attention.is_none() {
        cfg.head_dim = 16;
    }
    if let Some(moe) = cfg.moe.as_mut() {
        moe.expert_intermediate_size = 32;
        moe.shared_expert_intermediate_size = moe.shared_expert_intermediate_size.map(|_| 64);
    }
    let opts = format!(r#"{{"page_size": 4, "chunked_prefill_size": 16, "max_total_tokens": 512, "threads": {threads}, "pin_threads": false, {precision}}}"#);
    let e = Engine::start(cfg.clone(), weights(&cfg), None, vec![], EngineOptions::from_json(&opts).unwrap()).unwrap();
    fingerprint(&e)
}

#[test]
fn models_compute_the_recorded_bits() {
    let wrong: Vec<String> = CASES
        .iter()
        .filter_map(|&(arch, precision, want)| {
            let got = fingerprint_of(arch, precision, 2);
            (got != want).then(|| format!("{arch} {precision}: {got:#x}, recorded {want:#x}"))
        })
        .collect();
    assert!(wrong.is_empty(), "kernels {}: bits differ from the recorded ones (a kernel left its portable twin's order, or numerics changed on purpose: then record the new values on any machine):\n{}", rsgl_kernels::kernels().isa, wrong.join("\n"));
}

/// How work is cut among threads never changes a result: every GEMM output column, attention
/// split and reduction is computed in one order whatever the thread count. One thread, an odd
/// count, and more threads than this machine's cores (`RSGL_TEST_THREADS=64,192` adds counts:
/// oversubscribed, each parallel region waits for every thread to get a core, so slow).
#[test]
fn thread_counts_compute_the_recorded_bits() {
    let extra = std::env::var("RSGL_TEST_THREADS").unwrap_or_default();
    let counts: Vec<usize> = [1, 3, 16].into_iter().chain(extra.split(',').filter_map(|n| n.trim().parse().ok())).collect();
    let mut wrong = Vec::new();
    // Dense, routed experts, 4-bit blocks and latent attention (its decode split over threads).
    for &(arch, precision, want) in [CASES[0], CASES[1], CASES[2], CASES[6]].iter() {
        for &threads in &counts {
            let got = fingerprint_of(arch, precision, threads);
            if got != want {
                wrong.push(format!("{arch} {precision} on {threads} threads: {got:#x}, recorded {want:#x}"));
            }
        }
    }
    assert!(wrong.is_empty(), "thread counts changed the bits:\n{}", wrong.join("\n"));
}
