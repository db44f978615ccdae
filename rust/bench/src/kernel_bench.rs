//! `rsgl-bench kernels`: throughput of each kernel at the shapes SmolLM2-135M runs, for every
//! SIMD path this CPU has and the portable twin.
//!
//! GEMMs run on the engine's compute pool with `--threads N`, split as the engine splits them
//! (weight panels per thread), for each weight dtype. Every other kernel runs on N threads at
//! once, each on private data, which shows how far the memory system scales.

use crate::args::Args;
use crate::report::{host_info, print_table, write_json};
use rsgl_engine::sample::Rng;
use rsgl_kernels::delta_rule::DeltaRun;
use rsgl_kernels::int4::{Int4Offset, Int4Weights};
use rsgl_kernels::int8_block::Int8BlockWeights;
use rsgl_kernels::portable::rope_tables;
use rsgl_kernels::{
    kernels, linear, linear_blocks, linear_i8, AttentionTask, BlockActivations, Int8Gemm, Int8Weights, Kernels, KvSlice, PackedWeights, PagedKv, QuantizedRows,
    RopeStyle, ThreadPool, WeightDtype,
};
use serde_json::{json, Value};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Wall time each measurement aims for: long enough to drown timer and thread-spawn noise.
const TARGET: Duration = Duration::from_millis(400);
/// SmolLM2-135M's attention: head_dim, query heads per kv head, and the engine's page size.
const HEAD_DIM: usize = 64;
const GROUP: usize = 3;
const PAGE: usize = 16;
/// Key and value width of a DeltaNet head (Qwen3.5, Qwen3-Next).
const DELTA_DIM: usize = 128;

#[derive(Clone, Copy)]
enum Op {
    /// `[m, k] · [n, k]ᵀ` with weights of `dtype`
    Gemm {
        m: usize,
        n: usize,
        k: usize,
        dtype: WeightDtype,
    },
    /// The same with W8A8 int8 weights (activations quantized per row inside the call)
    GemmI8 {
        m: usize,
        n: usize,
        k: usize,
    },
    /// The same with 4-bit block weights (Q4_1-like with minimums, or MXFP4; activations
    /// quantized per block inside the call)
    GemmQ4 {
        m: usize,
        n: usize,
        k: usize,
        offset: Int4Offset,
    },
    /// The same with 8-bit block weights of `bits`-bit quants (Q8_0-, Q6_K- and Q5_0-like)
    GemmQ8 {
        m: usize,
        n: usize,
        k: usize,
        bits: u32,
    },
    Dot {
        n: usize,
    },
    Axpy {
        n: usize,
    },
    AddRmsNorm {
        n: usize,
    },
    SiluMul {
        n: usize,
    },
    Softmax {
        n: usize,
    },
    Rope {
        heads: usize,
    },
    Argmax {
        n: usize,
    },
    TopK {
        n: usize,
        k: usize,
    },
    TokenMask {
        n: usize,
    },
    /// One kv head's query group over `tokens` new tokens, the last at position `span - 1`.
    Attention {
        tokens: usize,
        span: usize,
    },
    /// Gated DeltaNet's delta rule over one value head of Qwen3.5/Qwen3-Next (128 x 128 state),
    /// `tokens` at a time: the recurrent form for 1 (decode), the chunked form for more (prefill).
    DeltaRule {
        tokens: usize,
    },
}

/// SmolLM2-135M: hidden 576, FFN 1536 (gate|up fused: 3072), vocab 49152, 9 heads of 64.
/// m = 1 is decode, 2 to 8 a speculative verify pass, 16 a decode batch, 512 a prefill. The
/// block-quantized GEMMs also run at Llama-3.2-1B's gate|up (hidden 2048, FFN 8192), the sizes
/// 4-bit files come in.
fn cases() -> Vec<Op> {
    let mut cases = Vec::new();
    let shapes = [(1, 3072, 576), (1, 49152, 576), (16, 3072, 576), (512, 3072, 576), (512, 576, 1536)];
    for dtype in [WeightDtype::BF16, WeightDtype::F16, WeightDtype::F32] {
        cases.extend(shapes.map(|(m, n, k)| Op::Gemm { m, n, k, dtype }));
    }
    // A wide bf16 layer (3-4B models' down projections: 8192 inputs), batched and in prefill.
    cases.extend([(16, 2048, 8192), (512, 2048, 8192)].map(|(m, n, k)| Op::Gemm { m, n, k, dtype: WeightDtype::BF16 }));
    // A vision tower's tile (SigLIP base at 512 pixels: 1024 patches, hidden 768, FFN 3072): q|k|v, fc1, fc2.
    cases.extend([(1024, 2304, 768), (1024, 3072, 768), (1024, 768, 3072)].map(|(m, n, k)| Op::Gemm { m, n, k, dtype: WeightDtype::BF16 }));
    // Speculative decoding's verify passes: 2 to 8 rows.
    let verify_shapes = [(2, 3072, 576), (5, 3072, 576), (8, 3072, 576)];
    cases.extend(shapes.iter().chain(&verify_shapes).map(|&(m, n, k)| Op::GemmI8 { m, n, k }));
    let block_shapes = [
        (1, 3072, 576),
        (2, 3072, 576),
        (5, 3072, 576),
        (8, 3072, 576),
        (16, 3072, 576),
        (512, 3072, 576),
        (1, 16384, 2048),
        (16, 16384, 2048),
        (128, 16384, 2048),
    ];
    cases.extend(block_shapes.map(|(m, n, k)| Op::GemmQ4 { m, n, k, offset: Int4Offset::Min }));
    // gpt-oss-20b's experts (gate|up, down) at decode, in MXFP4 as its checkpoints store them and
    // in Q4_1-like blocks beside; and gate|up with the few rows an expert gets in a batch's step.
    for offset in [Int4Offset::Mxfp4, Int4Offset::Min] {
        cases.extend([(1, 5760, 2880), (1, 2880, 2880), (2, 5760, 2880), (4, 5760, 2880), (8, 5760, 2880)].map(|(m, n, k)| Op::GemmQ4 { m, n, k, offset }));
    }
    cases.extend(block_shapes.map(|(m, n, k)| Op::GemmQ8 { m, n, k, bits: 8 }));
    // Gemma 3 1B's decode: its 262,144-row tied lm_head (Q8_0) and gate|up (Q5_0) at hidden 1152.
    cases.extend([Op::GemmQ8 { m: 1, n: 262144, k: 1152, bits: 8 }, Op::GemmQ8 { m: 1, n: 13824, k: 1152, bits: 5 }]);
    // Narrower quants where the bytes read or the unpacking could decide: decode, a decode
    // batch and a prefill.
    let narrow_shapes = [(1, 3072, 576), (1, 16384, 2048), (16, 16384, 2048), (512, 3072, 576)];
    for bits in [6, 5] {
        cases.extend(narrow_shapes.map(|(m, n, k)| Op::GemmQ8 { m, n, k, bits }));
    }
    cases.extend([
        Op::Dot { n: 16384 },
        Op::Axpy { n: 16384 },
        Op::AddRmsNorm { n: 576 },
        Op::SiluMul { n: 1536 },
        Op::Softmax { n: 49152 },
        Op::Rope { heads: 12 },
        Op::Argmax { n: 49152 },
        Op::TopK { n: 49152, k: 40 },
        Op::TokenMask { n: 49152 },
        Op::Attention { tokens: 1, span: 512 },
        Op::Attention { tokens: 5, span: 512 },
        Op::DeltaRule { tokens: 1 },
        Op::DeltaRule { tokens: 512 },
    ]);
    cases
}

impl Op {
    fn kernel(self) -> &'static str {
        match self {
            Op::Gemm { dtype: WeightDtype::F32, .. } => "gemm_f32",
            Op::Gemm { dtype: WeightDtype::BF16, .. } => "gemm_bf16",
            Op::Gemm { dtype: WeightDtype::F16, .. } => "gemm_f16",
            Op::GemmI8 { .. } => "gemm_w8a8",
            Op::GemmQ4 { offset: Int4Offset::Mxfp4, .. } => "gemm_mxfp4",
            Op::GemmQ4 { .. } => "gemm_q4",
            Op::GemmQ8 { bits: 8, .. } => "gemm_q8",
            Op::GemmQ8 { bits: 6, .. } => "gemm_q6",
            Op::GemmQ8 { .. } => "gemm_q5",
            Op::Dot { .. } => "dot",
            Op::Axpy { .. } => "axpy",
            Op::AddRmsNorm { .. } => "add_rmsnorm",
            Op::SiluMul { .. } => "silu_mul",
            Op::Softmax { .. } => "softmax",
            Op::Rope { .. } => "rope",
            Op::Argmax { .. } => "argmax",
            Op::TopK { .. } => "top_k",
            Op::TokenMask { .. } => "token_mask",
            Op::Attention { tokens: 1, .. } => "attention decode",
            Op::Attention { .. } => "attention extend",
            Op::DeltaRule { tokens: 1 } => "delta_rule_recurrent",
            Op::DeltaRule { .. } => "delta_rule_chunked",
        }
    }

    fn shape(self) -> String {
        match self {
            Op::Gemm { m, n, k, .. } | Op::GemmI8 { m, n, k } | Op::GemmQ4 { m, n, k, .. } | Op::GemmQ8 { m, n, k, .. } => format!("[{m}x{k}]·[{n}x{k}]ᵀ"),
            Op::Rope { heads } => format!("[{heads}x{HEAD_DIM}]"),
            Op::TopK { n, k } => format!("[{n}] k={k}"),
            Op::Attention { tokens, span } => format!("{tokens}x{GROUP} rows, {span} keys"),
            Op::DeltaRule { tokens } => format!("{tokens} tokens, [{DELTA_DIM}x{DELTA_DIM}] state"),
            Op::Dot { n } | Op::Axpy { n } | Op::AddRmsNorm { n } | Op::SiluMul { n } | Op::Softmax { n } | Op::Argmax { n } | Op::TokenMask { n } => {
                format!("[{n}]")
            }
        }
    }

    fn shape_json(self) -> Value {
        match self {
            Op::Gemm { m, n, k, dtype } => json!({ "m": m, "n": n, "k": k, "dtype": format!("{dtype:?}") }),
            Op::GemmI8 { m, n, k } => json!({ "m": m, "n": n, "k": k, "dtype": "w8a8_int8" }),
            Op::GemmQ4 { m, n, k, offset } => json!({ "m": m, "n": n, "k": k, "dtype": if offset == Int4Offset::Mxfp4 { "mxfp4" } else { "q4_blocks" } }),
            Op::GemmQ8 { m, n, k, bits } => json!({ "m": m, "n": n, "k": k, "dtype": format!("q{bits}_blocks") }),
            Op::Rope { heads } => json!({ "heads": heads, "head_dim": HEAD_DIM }),
            Op::TopK { n, k } => json!({ "n": n, "k": k }),
            Op::Attention { tokens, span } => json!({ "tokens": tokens, "span": span, "group": GROUP, "head_dim": HEAD_DIM, "page_size": PAGE }),
            Op::DeltaRule { tokens } => json!({ "tokens": tokens, "key_dim": DELTA_DIM, "value_dim": DELTA_DIM }),
            Op::Dot { n } | Op::Axpy { n } | Op::AddRmsNorm { n } | Op::SiluMul { n } | Op::Softmax { n } | Op::Argmax { n } | Op::TokenMask { n } => {
                json!({ "n": n })
            }
        }
    }

    /// The two inputs' lengths: `x` and the weights for a GEMM, K and V for attention (the
    /// queries are `x`), `x` and a second vector otherwise.
    fn operand_lens(self) -> (usize, usize) {
        match self {
            Op::Gemm { m, n, k, .. } | Op::GemmI8 { m, n, k } | Op::GemmQ4 { m, n, k, .. } | Op::GemmQ8 { m, n, k, .. } => (m * k, n * k),
            Op::Rope { heads } => (heads * HEAD_DIM, 2 * HEAD_DIM),
            Op::Attention { tokens, span } => (tokens * GROUP * HEAD_DIM, span.next_multiple_of(PAGE) * HEAD_DIM),
            // q, k and v rows; the state.
            Op::DeltaRule { tokens } => (3 * tokens * DELTA_DIM, DELTA_DIM * DELTA_DIM),
            Op::Dot { n }
            | Op::Axpy { n }
            | Op::AddRmsNorm { n }
            | Op::SiluMul { n }
            | Op::Softmax { n }
            | Op::Argmax { n }
            | Op::TopK { n, .. }
            | Op::TokenMask { n } => (n, n),
        }
    }

    /// Bytes one round reads: a GEMM's weights (read once whatever m is; the activations stay
    /// in cache), the keys and values for attention, every operand otherwise, on each thread.
    fn bytes(self, threads: usize) -> f64 {
        let (x, y) = self.operand_lens();
        let per_thread = match self {
            Op::Gemm { n, k, dtype, .. } => return (n * k * dtype.bytes()) as f64,
            Op::GemmI8 { n, k, .. } => return (n * k) as f64,
            // MXFP4: an e8m0 byte per 32 quants; else an f16 scale and minimum.
            Op::GemmQ4 { n, k, offset: Int4Offset::Mxfp4, .. } => return (n * k * 17 / 32) as f64,
            Op::GemmQ4 { n, k, .. } => return (n * k * 5 / 8) as f64,
            // A bit per weight of f16 scales (one per 16) beside the quants.
            Op::GemmQ8 { n, k, bits, .. } => return (n * k * (bits as usize + 1) / 8) as f64,
            Op::Attention { .. } => 2 * y * 4,
            Op::Softmax { .. } | Op::Argmax { .. } | Op::TopK { .. } | Op::TokenMask { .. } => x * 4,
            _ => (x + y) * 4,
        };
        (per_thread * threads) as f64
    }

    fn flops(self, threads: usize) -> f64 {
        let per_thread = match self {
            Op::Gemm { m, n, k, .. } | Op::GemmI8 { m, n, k } | Op::GemmQ4 { m, n, k, .. } | Op::GemmQ8 { m, n, k, .. } => return (2 * m * n * k) as f64,
            Op::Dot { n } | Op::Axpy { n } | Op::AddRmsNorm { n } => 2 * n,
            // Two products per key and dimension (scores, then values) for each row.
            Op::Attention { tokens, span } => 4 * tokens * GROUP * span * HEAD_DIM,
            // The rule's own work, as the recurrent form does it: three products per state
            // element and token (read, write, output); the chunked form's WY products count alike.
            Op::DeltaRule { tokens } => 6 * tokens * DELTA_DIM * DELTA_DIM,
            _ => 0,
        };
        (per_thread * threads) as f64
    }

    /// `iters` rounds: a GEMM over the whole pool, or each thread on its own copy of the data.
    fn run(self, kern: &Kernels, pool: &ThreadPool, x: &[f32], operand: &Operand, iters: u64) {
        let (x_len, _) = self.operand_lens();
        match (self, operand) {
            (Op::Gemm { m, n, .. }, Operand::Packed(w)) => {
                let (mut out, mut scratch) = (vec![0.0; m * n], Vec::new());
                for _ in 0..iters {
                    linear(kern, pool, black_box(x), w, None, &mut out, &mut scratch);
                    black_box(&mut out);
                }
            }
            (Op::GemmI8 { m, n, .. }, Operand::Int8(w)) => {
                let (mut out, mut rows) = (vec![0.0; m * n], QuantizedRows::default());
                for _ in 0..iters {
                    linear_i8(kern, pool, black_box(x), w, None, &mut out, &mut rows);
                    black_box(&mut out);
                }
            }
            (Op::GemmQ4 { m, n, .. }, Operand::Int4(w)) => {
                let (mut out, mut rows) = (vec![0.0; m * n], BlockActivations::default());
                for _ in 0..iters {
                    linear_blocks(kern, pool, black_box(x), w, None, &mut out, &mut rows);
                    black_box(&mut out);
                }
            }
            (Op::GemmQ8 { m, n, .. }, Operand::Int8Blocks(w)) => {
                let (mut out, mut rows) = (vec![0.0; m * n], BlockActivations::default());
                for _ in 0..iters {
                    linear_blocks(kern, pool, black_box(x), w, None, &mut out, &mut rows);
                    black_box(&mut out);
                }
            }
            (Op::Attention { tokens, span }, Operand::Vector(kv)) => pool.run(&|_| {
                let pages: Vec<u32> = (0..span.div_ceil(PAGE) as u32).collect();
                let paged =
                    PagedKv { keys: KvSlice::F32(kv), values: Some(KvSlice::F32(kv)), page_size: PAGE, kv_heads: 1, head_dim: HEAD_DIM, value_dim: HEAD_DIM };
                let task = AttentionTask {
                    kv: &paged,
                    pages: &pages,
                    kv_head: 0,
                    group: GROUP,
                    q: x,
                    q_stride: GROUP * HEAD_DIM,
                    tokens,
                    first_pos: span - tokens,
                    scale: 0.125,
                    window: None,
                    softcap: None,
                    sinks: None,
                    key_ends: None,
                };
                let mut out = vec![0.0; x_len];
                for _ in 0..iters {
                    // SAFETY: `out` holds every row of the task and is this thread's own.
                    unsafe { (kern.attention)(black_box(&task), out.as_mut_ptr(), GROUP * HEAD_DIM) };
                    black_box(&mut out);
                }
            }),
            (Op::DeltaRule { tokens }, Operand::Vector(start)) => pool.run(&|_| {
                // Unit-norm q and k, a decay of e^-0.1 and a write strength of 0.5 per token,
                // as the layer hands them over (raw random rows would grow the state without end).
                let mut qkv = x.to_vec();
                for row in qkv.chunks_exact_mut(DELTA_DIM) {
                    let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt();
                    row.iter_mut().for_each(|v| *v /= norm);
                }
                let (q, rest) = qkv.split_at(tokens * DELTA_DIM);
                let (k, v) = rest.split_at(tokens * DELTA_DIM);
                let (g, beta) = (vec![-0.1; tokens], vec![0.5; tokens]);
                let run = DeltaRun { q, k, v, g: &g, beta: &beta, key_dim: DELTA_DIM, value_dim: DELTA_DIM };
                let (mut state, mut out) = (start.clone(), vec![0.0; tokens * DELTA_DIM]);
                for _ in 0..iters {
                    match tokens {
                        1 => (kern.delta_rule_recurrent)(black_box(&run), &mut state, &mut out),
                        _ => (kern.delta_rule_chunked)(black_box(&run), 0, &mut state, &mut out),
                    }
                    black_box(&mut out);
                }
            }),
            (_, Operand::Vector(y)) => pool.run(&|_| {
                let (mut mine, mut out, mut best) = (x.to_vec(), vec![0.0; x_len], Vec::new());
                let mask: Vec<u32> = (0..x_len.div_ceil(32) as u32).map(|i| i.wrapping_mul(0x9E37_79B9) | 0x0101_0101).collect();
                let (cos, sin) = y.split_at(y.len() / 2);
                for _ in 0..iters {
                    match self {
                        Op::Dot { .. } => drop(black_box((kern.dot)(black_box(x), y))),
                        Op::Axpy { .. } => (kern.axpy)(black_box(1e-3), x, &mut mine),
                        Op::AddRmsNorm { .. } => (kern.add_rmsnorm)(&mut mine, Some(y), y, 1e-5, &mut out),
                        Op::SiluMul { .. } => (kern.silu_mul)(x, y, &mut out),
                        Op::Softmax { .. } => {
                            mine.copy_from_slice(x);
                            (kern.softmax)(&mut mine)
                        }
                        Op::Rope { .. } => (kern.rope)(&mut mine, cos, sin, RopeStyle::Neox),
                        Op::Argmax { .. } => drop(black_box((kern.argmax)(black_box(x)))),
                        Op::TopK { k, .. } => (kern.top_k)(black_box(x), k, &mut best),
                        Op::TokenMask { .. } => {
                            mine.copy_from_slice(x);
                            (kern.apply_token_mask)(&mut mine, &mask)
                        }
                        Op::Gemm { .. } | Op::GemmI8 { .. } | Op::GemmQ4 { .. } | Op::GemmQ8 { .. } | Op::Attention { .. } | Op::DeltaRule { .. } => {
                            unreachable!("handled above")
                        }
                    }
                    black_box((&mut mine, &mut out, &mut best));
                }
            }),
            _ => unreachable!("operands are built for their op"),
        }
    }
}

/// The second operand: packed weights for a GEMM, a vector otherwise.
enum Operand {
    Packed(PackedWeights),
    Int8(Int8Weights),
    Int4(Int4Weights),
    Int8Blocks(Int8BlockWeights),
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

/// Every int8 GEMM this CPU has, then the portable twin, each in a table named after it.
fn int8_paths() -> Vec<Kernels> {
    let mut paths = Int8Gemm::simd_paths();
    paths.push(Int8Gemm::portable());
    paths.into_iter().map(|gemm_i8| Kernels { isa: gemm_i8.isa, gemm_i8, ..Kernels::portable() }).collect()
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

fn measure_all(threads: usize, only: Option<&str>) -> Vec<Measurement> {
    let mut rng = Rng::new(7);
    let pool = ThreadPool::new(threads, true);
    let mut results = Vec::new();
    for op in cases().into_iter().filter(|op| only.is_none_or(|name| op.kernel().starts_with(name))) {
        // Every path reads the same operands, so the big weight matrix is built once.
        let (x_len, operand_len) = op.operand_lens();
        let (x, raw) = (random_vec(&mut rng, x_len), random_vec(&mut rng, operand_len));
        let operand = match op {
            Op::Gemm { n, k, dtype, .. } => Operand::Packed(PackedWeights::pack(&raw, n, k, dtype)),
            Op::GemmI8 { n, k, .. } => Operand::Int8(Int8Weights::quantize(&raw, n, k)),
            Op::GemmQ4 { n, k, offset, .. } => Operand::Int4(Int4Weights::quantize(&raw, n, k, offset)),
            Op::GemmQ8 { n, k, bits, .. } => Operand::Int8Blocks(Int8BlockWeights::quantize(&raw, n, k, bits)),
            Op::Rope { .. } => {
                // cos | sin of one position, as the engine's tables hold them.
                let angles: Vec<f64> = (0..HEAD_DIM / 2).map(|i| 300.0 * 1e-4f64.powf(i as f64 / 32.0)).collect();
                let (mut cos, mut sin) = (vec![0.0; HEAD_DIM], vec![0.0; HEAD_DIM]);
                rope_tables(&angles, RopeStyle::Neox, &mut cos, &mut sin);
                Operand::Vector([cos, sin].concat())
            }
            _ => Operand::Vector(raw),
        };
        let paths = match op {
            Op::GemmI8 { .. } | Op::GemmQ4 { .. } | Op::GemmQ8 { .. } => int8_paths(),
            _ => kernel_paths(),
        };
        for kern in paths {
            let (iters, seconds) = seconds_per_round(&|iters| op.run(&kern, &pool, &x, &operand, iters));
            results.push(Measurement { op, isa: kern.isa, iters, seconds, threads });
        }
    }
    results
}

pub fn run(mut args: Args) -> Result<(), String> {
    let threads = args.usize_or("threads", 1)?;
    let json_path = args.string("json");
    let only = args.string("kernel");
    args.finish()?;

    println!("rsgl-bench kernels: dispatched path {}, {threads} thread(s)", kernels().isa);
    let results = measure_all(threads, only.as_deref());
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
