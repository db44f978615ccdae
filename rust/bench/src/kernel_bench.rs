//! `rsgl-bench kernels`: throughput of each kernel at the shapes SmolLM2-135M runs, for every
//! SIMD path this CPU has and the portable twin.
//!
//! GEMMs run on the engine's compute pool with `--threads N`, split as the engine splits them
//! (weight panels per thread), for each weight dtype. For dot and axpy, N threads call the kernel
//! at once on private vectors, which shows how far the memory system scales.

use crate::args::Args;
use crate::report::{host_info, print_table, write_json};
use rsgl_engine::sample::Rng;
use rsgl_kernels::{kernels, linear, Kernels, PackedWeights, ThreadPool, WeightDtype};
use serde_json::{json, Value};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Wall time each measurement aims for: long enough to drown timer and thread-spawn noise.
const TARGET: Duration = Duration::from_millis(400);

#[derive(Clone, Copy)]
enum Op {
    /// `[m, k] · [n, k]ᵀ` with weights of `dtype`
    Gemm { m: usize, n: usize, k: usize, dtype: WeightDtype },
    Dot { n: usize },
    Axpy { n: usize },
}

/// SmolLM2-135M: hidden 576, FFN 1536 (gate|up fused: 3072), vocab 49152, head_dim 64
/// (attention's dot and axpy). m = 1 is decode, 16 a decode batch, 512 a prefill.
fn cases() -> Vec<Op> {
    let mut cases = Vec::new();
    for dtype in [WeightDtype::BF16, WeightDtype::F16, WeightDtype::F32] {
        for (m, n, k) in [(1, 3072, 576), (1, 49152, 576), (16, 3072, 576), (512, 3072, 576), (512, 576, 1536)] {
            cases.push(Op::Gemm { m, n, k, dtype });
        }
    }
    cases.extend([Op::Dot { n: 64 }, Op::Dot { n: 16384 }, Op::Axpy { n: 64 }, Op::Axpy { n: 16384 }]);
    cases
}

impl Op {
    fn kernel(self) -> &'static str {
        match self {
            Op::Gemm { dtype: WeightDtype::F32, .. } => "gemm_f32",
            Op::Gemm { dtype: WeightDtype::BF16, .. } => "gemm_bf16",
            Op::Gemm { dtype: WeightDtype::F16, .. } => "gemm_f16",
            Op::Dot { .. } => "dot",
            Op::Axpy { .. } => "axpy",
        }
    }

    fn shape(self) -> String {
        match self {
            Op::Gemm { m, n, k, .. } => format!("[{m}x{k}]·[{n}x{k}]ᵀ"),
            Op::Dot { n } | Op::Axpy { n } => format!("[{n}]"),
        }
    }

    fn shape_json(self) -> Value {
        match self {
            Op::Gemm { m, n, k, dtype } => json!({ "m": m, "n": n, "k": k, "dtype": format!("{dtype:?}") }),
            Op::Dot { n } | Op::Axpy { n } => json!({ "n": n }),
        }
    }

    /// The two inputs: `x` and the weights for a GEMM, `x` and `y` otherwise.
    fn operand_lens(self) -> (usize, usize) {
        match self {
            Op::Gemm { m, n, k, .. } => (m * k, n * k),
            Op::Dot { n } | Op::Axpy { n } => (n, n),
        }
    }

    /// Bytes read by one round of all threads: a GEMM's weights (read once whatever m is; the
    /// activations stay in cache), both vectors for dot and axpy.
    fn bytes(self, threads: usize) -> f64 {
        match self {
            Op::Gemm { n, k, dtype, .. } => (n * k * dtype.bytes()) as f64,
            Op::Dot { n } | Op::Axpy { n } => (2 * n * threads * std::mem::size_of::<f32>()) as f64,
        }
    }

    fn flops(self, threads: usize) -> f64 {
        let per_round = match self {
            Op::Gemm { m, n, k, .. } => 2 * m * n * k,
            Op::Dot { n } | Op::Axpy { n } => 2 * n * threads,
        };
        per_round as f64
    }

    /// `iters` rounds: a GEMM over the whole pool, or each thread on its own vectors.
    fn run(self, kern: &Kernels, pool: &ThreadPool, x: &[f32], operand: &Operand, iters: u64) {
        match (self, operand) {
            (Op::Gemm { m, n, .. }, Operand::Packed(w)) => {
                let (mut out, mut scratch) = (vec![0.0; m * n], Vec::new());
                for _ in 0..iters {
                    linear(kern, pool, black_box(x), w, None, &mut out, &mut scratch);
                    black_box(&mut out);
                }
            }
            (Op::Dot { .. }, Operand::Vector(y)) => pool.run(&|_| {
                for _ in 0..iters {
                    black_box((kern.dot)(black_box(x), black_box(y)));
                }
            }),
            (Op::Axpy { .. }, Operand::Vector(y)) => pool.run(&|_| {
                let mut y = y.clone();
                for _ in 0..iters {
                    (kern.axpy)(black_box(1e-3), black_box(x), &mut y);
                    black_box(&mut y);
                }
            }),
            _ => unreachable!("operands are built for their op"),
        }
    }
}

/// The second operand: packed weights for a GEMM, a vector for dot and axpy.
enum Operand {
    Packed(PackedWeights),
    Vector(Vec<f32>),
}
/// `x` with four significant digits (times here span 5 ns to 10 ms).
fn four_digits(x: f64) -> String {
    let decimals = (3 - x.abs().log10().floor() as i32).max(0) as usize;
    format!("{x:.decimals$}")
}

/// Seconds per round: warm up once, double the count until it is measurable, then one
/// timed run sized to `TARGET`.
fn seconds_per_round(work: &dyn Fn(u64)) -> (u64, f64) {
    let timed = |iters: u64| {
        let start = Instant::now();
        work(iters);
        start.elapsed()
    };
    timed(1);
    let mut iters = 1;
    let mut elapsed = timed(iters);
    while elapsed < TARGET / 10 {
        iters *= 2;
        elapsed = timed(iters);
    }
    let iters = ((iters as f64) * TARGET.as_secs_f64() / elapsed.as_secs_f64()).ceil() as u64;
    (iters, timed(iters).as_secs_f64() / iters as f64)
}

fn random_vec(rng: &mut Rng, len: usize) -> Vec<f32> {
    (0..len).map(|_| rng.next_f64() as f32 * 2.0 - 1.0).collect()
}

/// Every SIMD path this CPU has, then the portable twin.
fn kernel_paths() -> Vec<Kernels> {
    let mut paths = Kernels::simd_paths();
    paths.push(Kernels::portable());
    paths
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
    let pool = ThreadPool::new(threads, true);
    let mut results = Vec::new();
    for op in cases() {
        // Every path reads the same operands, so the big weight matrix is built once.
        let (x_len, operand_len) = op.operand_lens();
        let (x, raw) = (random_vec(&mut rng, x_len), random_vec(&mut rng, operand_len));
        let operand = match op {
            Op::Gemm { n, k, dtype, .. } => Operand::Packed(PackedWeights::pack(&raw, n, k, dtype)),
            _ => Operand::Vector(raw),
        };
        for kern in kernel_paths() {
            let (iters, seconds) = seconds_per_round(&|iters| op.run(&kern, &pool, &x, &operand, iters));
            results.push(Measurement { op, isa: kern.isa, iters, seconds, threads });
        }
    }
    results
}

pub fn run(mut args: Args) -> Result<(), String> {
    let threads = args.usize_or("threads", 1)?;
    let json_path = args.string("json");
    args.finish()?;

    println!("rsgl-bench kernels: dispatched path {}, {threads} thread(s)", kernels().isa);
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
