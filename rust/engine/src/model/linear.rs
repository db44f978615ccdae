//! A dense layer `y = x Wᵀ + b`, its weights packed once for the kernels (16/32-bit floats, or
//! W8A8 int8), and the compute context (kernel table + thread pool) every layer runs on.

use crate::config::Quantization;
use crate::weights::{MatrixRows, Stored};
use rsgl_kernels::int4::{Int4Offset, Int4Row, Int4Weights, QuantizedBlocks, QBLOCK};
use rsgl_kernels::int8::quantize_weight_row;
use rsgl_kernels::{kernels, linear, linear_i8, linear_q4, Int8Weights, Kernels, PackedWeights, QuantizedRows, ThreadPool, WeightDtype};
use std::sync::Mutex;

/// What a forward pass computes with: the kernels chosen for this CPU and the engine's pool.
pub struct Compute {
    pub kernels: &'static Kernels,
    pub pool: ThreadPool,
    /// A GEMM's activations converted for the kernels, reused across layers and steps (a lock
    /// only so the model can be shared with the pool's threads; one thread runs forward passes).
    scratch: Mutex<Scratch>,
}

#[derive(Default)]
struct Scratch {
    bf16: Vec<u16>,
    int8: QuantizedRows,
    int8_blocks: QuantizedBlocks,
}

impl Compute {
    pub fn new(pool: ThreadPool) -> Compute {
        Compute { kernels: kernels(), pool, scratch: Mutex::new(Scratch::default()) }
    }
}

/// How a layer's weights are held.
pub enum Weights {
    Float(PackedWeights),
    Int8(Int8Weights),
    Int4(Int4Weights),
}

impl Weights {
    /// Packs an `[n, k]` matrix read by rows in `dtype`, or quantized, on the threads of `pool`.
    fn pack(rows: &RowReader, n: usize, k: usize, dtype: WeightDtype, quantization: Option<Quantization>, pool: &ThreadPool) -> Weights {
        let floats = |row: usize| {
            let mut values = vec![0.0; k];
            (rows.read_f32)(row, &mut values);
            values
        };
        match quantization {
            None => Weights::Float(PackedWeights::pack_rows(n, k, dtype, pool, &|row, out| (rows.read_f32)(row, out))),
            Some(Quantization::W8A8Int8) => {
                Weights::Int8(Int8Weights::pack_rows(n, k, pool, &|row, q| (rows.read_i8)(row, q).unwrap_or_else(|| quantize_weight_row(&floats(row), q))))
            }
            Some(Quantization::W4A8) if k % QBLOCK == 0 => {
                Weights::Int4(Int4Weights::pack_rows(n, k, Int4Offset::Min, pool, &|row, out| out.quantize(&floats(row), Int4Offset::Min)))
            }
            Some(Quantization::Gguf) => match rows.stored_4bit {
                Some(offset) => Weights::Int4(Int4Weights::pack_rows(n, k, offset, pool, &|row, out| (rows.read_q4)(row, out, offset))),
                None => Self::pack(rows, n, k, dtype, None, pool),
            },
            // A layer whose inputs are not whole groups (never in real models) stays in floats.
            Some(Quantization::W4A8) => Self::pack(rows, n, k, dtype, None, pool),
        }
    }

    /// Row `row` as f32 (embedding look-ups of a tied lm_head).
    pub fn row(&self, row: usize) -> Vec<f32> {
        match self {
            Weights::Float(w) => w.row(row),
            Weights::Int8(w) => w.row(row),
            Weights::Int4(w) => w.row(row),
        }
    }

    pub fn out_features(&self) -> usize {
        match self {
            Weights::Float(w) => w.n,
            Weights::Int8(w) => w.n,
            Weights::Int4(w) => w.n,
        }
    }

    fn in_features(&self) -> usize {
        match self {
            Weights::Float(w) => w.k,
            Weights::Int8(w) => w.k,
            Weights::Int4(w) => w.k,
        }
    }
}

pub struct Linear {
    pub weight: Weights,
    pub bias: Option<Vec<f32>>,
}

/// One layer's weights `[out, in]`, read from the checkpoint as they are packed, and its bias.
pub struct LinearParts {
    pub weight: MatrixRows,
    pub bias: Option<Vec<f32>>,
}

/// A matrix's rows as float32, as int8 with their scale where it is stored so, and as 4-bit
/// blocks where every part is stored in a 4-bit type (`stored_4bit`: the offset they share).
struct RowReader<'a> {
    read_f32: &'a (dyn Fn(usize, &mut [f32]) + Sync),
    read_i8: &'a (dyn Fn(usize, &mut [i8]) -> Option<f32> + Sync),
    read_q4: &'a (dyn Fn(usize, &mut Int4Row, Int4Offset) + Sync),
    stored_4bit: Option<Int4Offset>,
}

/// The offset 4-bit blocks of these types share (Q4_0 alone: 8; with Q4_1: minimums, Q4_0's
/// being -8 times its scale), or None if one is not a 4-bit type the kernels run.
fn shared_4bit_offset(stored: impl Iterator<Item = Stored>) -> Option<Int4Offset> {
    stored.map(|s| s.int4_offset()).try_fold(Int4Offset::Eight, |shared, offset| {
        let offset = offset?;
        Some(if shared == Int4Offset::Min || offset == Int4Offset::Min { Int4Offset::Min } else { Int4Offset::Eight })
    })
}

impl Linear {
    /// Packs layers that read the same input (q|k|v, gate|up) as one, so one call computes them.
    pub fn fused(parts: Vec<LinearParts>, dtype: WeightDtype, quantization: Option<Quantization>, pool: &ThreadPool) -> Linear {
        let in_features = parts[0].weight.cols();
        assert!(parts.iter().all(|p| p.weight.cols() == in_features), "fused layers read the same input");
        // Output row -> (part, row in part).
        let starts: Vec<usize> = parts.iter().scan(0, |start, p| Some(std::mem::replace(start, *start + p.weight.rows()))).collect();
        let out_features: usize = parts.iter().map(|p| p.weight.rows()).sum();
        let locate = |row: usize| {
            let part = starts.partition_point(|&s| s <= row) - 1;
            (&parts[part].weight, row - starts[part])
        };
        let reader = RowReader {
            read_f32: &|row, out| {
                let (weight, row) = locate(row);
                weight.read_f32(row, out);
            },
            read_i8: &|row, out| {
                let (weight, row) = locate(row);
                weight.read_i8(row, out)
            },
            read_q4: &|row, out, offset| {
                let (weight, row) = locate(row);
                weight.read_q4(row, out, offset);
            },
            stored_4bit: shared_4bit_offset(parts.iter().map(|p| p.weight.stored())),
        };
        let weight = Weights::pack(&reader, out_features, in_features, dtype, quantization, pool);
        let bias =
            parts.iter().any(|p| p.bias.is_some()).then(|| parts.iter().flat_map(|p| p.bias.clone().unwrap_or_else(|| vec![0.0; p.weight.rows()])).collect());
        Linear { weight, bias }
    }

    pub fn out_features(&self) -> usize {
        self.weight.out_features()
    }

    pub fn weight_in_features(&self) -> usize {
        self.weight.in_features()
    }

    /// `x` is `[rows, in]`; returns `[rows, out]`.
    pub fn forward(&self, c: &Compute, x: &[f32]) -> Vec<f32> {
        let mut out = vec![0.0; x.len() / self.weight.in_features() * self.out_features()];
        let mut scratch = c.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let bias = self.bias.as_deref();
        match &self.weight {
            Weights::Float(w) => linear(c.kernels, &c.pool, x, w, bias, &mut out, &mut scratch.bf16),
            Weights::Int8(w) => linear_i8(c.kernels, &c.pool, x, w, bias, &mut out, &mut scratch.int8),
            Weights::Int4(w) => linear_q4(c.kernels, &c.pool, x, w, bias, &mut out, &mut scratch.int8_blocks),
        }
        out
    }
}
