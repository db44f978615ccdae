//! `rsgl-bench kernels`: throughput of each kernel at the shapes SmolLM2-135M runs, for the
//! dispatched path and its portable twin.
//!
//! A kernel call is single-threaded. With `--threads N`, N threads call it at once on disjoint
//! work (a GEMM's weight columns split as the engine splits them; private vectors for dot and
//! axpy), which shows how far the memory system scales.

use crate::args::Args;
use crate::report::{host_info, print_table, write_json};
use rsgl_engine::sample::Rng;
use rsgl_kernels::{kernels, Kernels};
use serde_json::{json, Value};
use std::hint::black_box;
use std::ops::Range;
use std::time::{Duration, Instant};

/// Wall time each measurement aims for: long enough to drown timer and thread-spawn noise.
const TARGET: Duration = Duration::from_millis(400);

#[derive(Clone, Copy)]
enum Op {
    /// `[m, k] · [n, k]ᵀ`
    GemmBt { m: usize, n: usize, k: usize },
    Dot { n: usize },
    Axpy { n: usize },
}

/// SmolLM2-135M: hidden 576, FFN 1536, vocab 49152, head_dim 64 (attention's dot and axpy).
const CASES: &[Op] = &[
    Op::GemmBt { m: 1, n: 1536, k: 576 },
    Op::GemmBt { m: 1, n: 49152, k: 576 },
    Op::GemmBt { m: 8, n: 1536, k: 576 },
    Op::GemmBt { m: 64, n: 1536, k: 576 },
    Op::Dot { n: 64 },
    Op::Dot { n: 16384 },
    Op::Axpy { n: 64 },
    Op::Axpy { n: 16384 },
];

impl Op {
    fn kernel(self) -> &'static str {
        match self {
            Op::GemmBt { .. } => "gemm_bt",
            Op::Dot { .. } => "dot",
            Op::Axpy { .. } => "axpy",
        }
    }

    fn shape(self) -> String {
        match self {
            Op::GemmBt { m, n, k } => format!("[{m}x{k}]·[{n}x{k}]ᵀ"),
            Op::Dot { n } | Op::Axpy { n } => format!("[{n}]"),
        }
    }

    fn shape_json(self) -> Value {
        match self {
            Op::GemmBt { m, n, k } => json!({ "m": m, "n": n, "k": k }),
            Op::Dot { n } | Op::Axpy { n } => json!({ "n": n }),
        }
    }

    /// The two inputs: `x` and the weights for a GEMM, `x` and `y` otherwise.
    fn operand_lens(self) -> (usize, usize) {
        match self {
            Op::GemmBt { m, n, k } => (m * k, n * k),
            Op::Dot { n } | Op::Axpy { n } => (n, n),
        }
    }

    /// Bytes read by one round of all threads: a GEMM's weights (read once whatever m is; the
    /// activations stay in cache), both vectors for dot and axpy.
    fn bytes(self, threads: usize) -> f64 {
        let floats = match self {
            Op::GemmBt { n, k, .. } => n * k,
            Op::Dot { n } | Op::Axpy { n } => 2 * n * threads,
        };
        (floats * std::mem::size_of::<f32>()) as f64
    }

    fn flops(self, threads: usize) -> f64 {
        let per_round = match self {
            Op::GemmBt { m, n, k } => 2 * m * n * k,
            Op::Dot { n } | Op::Axpy { n } => 2 * n * threads,
        };
        per_round as f64
    }

    /// One thread's share of the work, `iters` times over.
    fn run(self, kern: &Kernels, a: &[f32], b: &[f32], thread: usize, threads: usize, iters: u64) {
        match self {
            Op::GemmBt { m, n, k } => {
                let cols = share(n, thread, threads);
                let w = &b[cols.start * k..cols.end * k];
                let mut out = vec![0.0; m * cols.len()];
                for _ in 0..iters {
                    (kern.gemm_bt)(black_box(a), black_box(w), k, &mut out);
                    black_box(&mut out);
                }
            }
            Op::Dot { .. } => {
                for _ in 0..iters {
                    black_box((kern.dot)(black_box(a), black_box(b)));
                }
            }
            Op::Axpy { .. } => {
                let mut y = b.to_vec();
                for _ in 0..iters {
                    (kern.axpy)(black_box(1e-3), black_box(a), &mut y);
                    black_box(&mut y);
                }
            }
        }
    }
}

/// `x` with four significant digits (times here span 5 ns to 10 ms).
fn four_digits(x: f64) -> String {
    let decimals = (3 - x.abs().log10().floor() as i32).max(0) as usize;
    format!("{x:.decimals$}")
}

/// Thread `t`'s contiguous slice of `0..n`.
fn share(n: usize, t: usize, threads: usize) -> Range<usize> {
    n * t / threads..n * (t + 1) / threads
}

/// Wall time of every thread running `work(thread, iters)` at once.
fn time_threads(threads: usize, iters: u64, work: &(dyn Fn(usize, u64) + Sync)) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || work(t, iters));
        }
    });
    start.elapsed()
}

/// Seconds per round: warm up once, double the count until it is measurable, then one
/// timed run sized to `TARGET`.
fn seconds_per_round(threads: usize, work: &(dyn Fn(usize, u64) + Sync)) -> (u64, f64) {
    time_threads(threads, 1, work);
    let mut iters = 1;
    let mut elapsed = time_threads(threads, iters, work);
    while elapsed < TARGET / 10 {
        iters *= 2;
        elapsed = time_threads(threads, iters, work);
    }
    let iters = ((iters as f64) * TARGET.as_secs_f64() / elapsed.as_secs_f64()).ceil() as u64;
    (iters, time_threads(threads, iters, work).as_secs_f64() / iters as f64)
}

fn random_vec(rng: &mut Rng, len: usize) -> Vec<f32> {
    (0..len).map(|_| rng.next_f64() as f32 * 2.0 - 1.0).collect()
}

/// The dispatched path, then the portable twin unless they are the same.
fn kernel_paths() -> Vec<Kernels> {
    let chosen = *kernels();
    if chosen.isa == "portable" {
        vec![chosen]
    } else {
        vec![chosen, Kernels::portable()]
    }
}

struct Measurement {
    op: Op,
    isa: &'static str,
    iters: u64,
    seconds: f64,
    threads: usize,
}

impl Measurement {
    fn gb_per_s(&self) -> f64 {
        self.op.bytes(self.threads) / self.seconds / 1e9
    }

    fn gflop_per_s(&self) -> f64 {
        self.op.flops(self.threads) / self.seconds / 1e9
    }

    fn row(&self) -> Vec<String> {
        vec![
            self.op.kernel().into(),
            self.op.shape(),
            self.isa.into(),
            four_digits(self.seconds * 1e6),
            format!("{:.2}", self.gb_per_s()),
            format!("{:.2}", self.gflop_per_s()),
        ]
    }

    fn json(&self) -> Value {
        json!({
            "kernel": self.op.kernel(),
            "shape": self.op.shape_json(),
            "isa": self.isa,
            "threads": self.threads,
            "iterations": self.iters,
            "us_per_call": self.seconds * 1e6,
            "gb_per_s": self.gb_per_s(),
            "gflop_per_s": self.gflop_per_s(),
        })
    }
}

fn measure_all(threads: usize) -> Vec<Measurement> {
    let mut rng = Rng::new(7);
    let mut results = Vec::new();
    for &op in CASES {
        // Both paths read the same operands, so the big weight matrix is built once.
        let (a_len, b_len) = op.operand_lens();
        let (a, b) = (random_vec(&mut rng, a_len), random_vec(&mut rng, b_len));
        for kern in kernel_paths() {
            let work = |t: usize, iters: u64| op.run(&kern, &a, &b, t, threads, iters);
            let (iters, seconds) = seconds_per_round(threads, &work);
            results.push(Measurement { op, isa: kern.isa, iters, seconds, threads });
        }
    }
    results
}

pub fn run(mut args: Args) -> Result<(), String> {
    let threads = args.usize_or("threads", 1)?;
    let json_path = args.string("json");
    args.finish()?;

    println!("rsgl-bench kernels: dispatched path {}, {threads} thread(s) calling at once", kernels().isa);
    let results = measure_all(threads);
    let rows: Vec<Vec<String>> = results.iter().map(Measurement::row).collect();
    print_table(&["kernel", "shape", "path", "us/call", "GB/s", "GFLOP/s"], &rows);
    if let Some(path) = json_path {
        let report = json!({
            "bench": "kernels",
            "host": host_info(),
            "dispatched": kernels().isa,
            "threads": threads,
            "results": results.iter().map(Measurement::json).collect::<Vec<_>>(),
        });
        write_json(&path, &report)?;
    }
    Ok(())
}
