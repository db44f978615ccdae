//! rsgl-bench: rsgl's Rust-native benchmarks (no Python at run time), printed as a table and
//! optionally written as JSON.

mod args;
mod generate_bench;
mod kernel_bench;
mod report;

use args::Args;

const USAGE: &str = "\
usage:
  rsgl-bench kernels  [--threads N] [--json FILE]
      gemm_bt / dot / axpy at SmolLM2-135M shapes, dispatched path and portable twin;
      N threads call each kernel at once on disjoint work (default 1)
  rsgl-bench generate [--preset smollm2-135m|tiny] [--batch 1,8] [--prompt-len 128]
                      [--gen-len 32] [--threads N] [--json FILE]
      offline greedy generation on a random-weight model of the preset's shape:
      prefill and decode tok/s at each batch size (threads default: all cores)
RSGL_KERNELS=portable|avx2|neon forces a kernel path.";

fn run(argv: &[String]) -> Result<(), String> {
    match argv.first().map(String::as_str) {
        Some("kernels") => kernel_bench::run(Args::parse(&argv[1..])?),
        Some("generate") => generate_bench::run(Args::parse(&argv[1..])?),
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
