//! rsgl-bench: rsgl's Rust-native benchmarks (no Python at run time), printed as a table and
//! optionally written as JSON.

mod allreduce_bench;
mod args;
mod generate_bench;
mod grammar_bench;
mod kernel_bench;
mod membw;
mod model_dir;
mod report;

use args::Args;

const USAGE: &str = "\
usage:
  rsgl-bench kernels  [--threads N] [--json FILE]
      GEMM (bf16/f16/f32 weights) / dot / axpy at SmolLM2-135M shapes, every SIMD path and
      the portable twin; GEMMs split over an N-thread pool (default 1)
  rsgl-bench generate [--preset smollm2-135m|llama-1b|llama-8b|tiny | --model-dir DIR] [--batch 1,8]
                      [--prompt-len 128] [--gen-len 32] [--dtype float32|bfloat16|float16]
                      [--quantization w8a8_int8|w4a8 [--quantize-lm-head 1]] [--kv-cache-dtype bfloat16|int8]
                      [--activation-bits 8|16]
                      [--threads N] [--tp N] [--profile 1 [--membw GBPS]] [--json FILE]
      offline greedy generation on a random-weight model of the preset's shape, or on the
      model in DIR (config.json and *.safetensors in F32/BF16/F16, e.g. written by
      benches/prepare_model_dir.py), its weights held in --dtype (default float32) or
      quantized (the lm_head stays in --dtype unless --quantize-lm-head 1):
      prefill and decode tok/s at each batch size (threads default: all cores; --tp splits
      them among N tensor-parallel ranks); --profile 1: where each decode step's time goes,
      by phase (ms, parallel regions, the caller's wait at their ends, bytes read), and with
      --membw (GB/s, from `membw`) the step's bytes as a share of that limit
  rsgl-bench allreduce [--ranks 2] [--threads-per-rank 1] [--hidden 576,2048,4096]
                      [--rows 1,8,64,512] [--reps 2000] [--json FILE]
      one tensor-parallel reduction (what each layer does twice with --tp): rows x hidden
      float32 partial sums added across the ranks through shared memory, each rank on its
      own CPU group; median and p99 microseconds per call
  rsgl-bench membw    [--threads N] [--size-mb 1024] [--reps 10] [--pages huge|4k] [--json FILE]
      memory read bandwidth: N threads (default: all cores) each sum their slice of a
      buffer far larger than the caches, in huge pages like the engine's weights (or 4 KiB
      pages); best and median GB/s
  rsgl-bench grammar  --tokenizer FILE [--schemas tests/data/structured/schemas.json]
                      [--regexes tests/data/structured/regexes.json] [--json FILE]
      structured output on a tokenizer.json: compile time of each JSON schema and regex, and
      token-mask time per token along its example (p50/p99/max) against the targets
RSGL_KERNELS=portable|avx2|avx512|avx512-bf16|neon|neon-bf16|sve-bf16 forces a kernel path.";

fn run(argv: &[String]) -> Result<(), String> {
    match argv.first().map(String::as_str) {
        Some("kernels") => kernel_bench::run(Args::parse(&argv[1..])?),
        Some("generate") => generate_bench::run(Args::parse(&argv[1..])?),
        Some("membw") => membw::run(Args::parse(&argv[1..])?),
        Some("allreduce") => allreduce_bench::run(Args::parse(&argv[1..])?),
        Some("grammar") => grammar_bench::run(Args::parse(&argv[1..])?),
        Some("help" | "--help" | "-h") => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(format!("unknown subcommand {other:?}\n{USAGE}")),
        None => Err(format!("missing subcommand\n{USAGE}")),
    }
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if let Err(message) = run(&argv) {
        eprintln!("rsgl-bench: {message}");
        std::process::exit(2);
    }
}
