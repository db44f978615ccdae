//! A dense layer `y = x Wᵀ + b`, its weights packed once for the kernels (16/32-bit floats, or
//! W8A8 int8), and the compute context (kernel table + thread pool) every layer runs on.

use crate::config::Quantization;
use crate::weights::MatrixRows;
use rsgl_kernels::int8::quantize_weight_row;
use rsgl_kernels::{kernels, linear, linear_i8, Int8Weights, Kernels, PackedWeights, QuantizedRows, ThreadPool, WeightDtype};
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
}

impl Weights {
    /// Packs an `[n, k]` matrix read by rows (`read_f32`; `read_i8` gives a row already in
    /// int8 with its scale, or None) in `dtype`, or quantized, on the threads of `pool`.
    fn pack(rows: &RowReader, n: usize, k: usize, dtype: WeightDtype, quantization: Option<Quantization>, pool: &ThreadPool) -> Weights {
        match quantization {
            None => Weights::Float(PackedWeights::pack_rows(n, k, dtype, pool, &|row, out| (rows.read_f32)(row, out))),
            Some(Quantization::W8A8Int8) => Weights::Int8(Int8Weights::pack_rows(n, k, pool, &|row, q| {
                (rows.read_i8)(row, q).unwrap_or_else(|| {
                    let mut values = vec![0.0; k];
                    (rows.read_f32)(row, &mut values);
                    quantize_weight_row(&values, q)
                })
            })),
        }
    }

    /// Row `row` as f32 (embedding look-ups of a tied lm_head).
    pub fn row(&self, row: usize) -> Vec<f32> {
        match self {
            Weights::Float(w) => w.row(row),
            Weights::Int8(w) => w.row(row),
        }
    }

    pub fn out_features(&self) -> usize {
        match self {
            Weights::Float(w) => w.n,
            Weights::Int8(w) => w.n,
        }
    }

    fn in_features(&self) -> usize {
        match self {
            Weights::Float(w) => w.k,
            Weights::Int8(w) => w.k,
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

/// A matrix's rows as float32, or as int8 with their scale where it is stored so.
struct RowReader<'a> {
    read_f32: &'a (dyn Fn(usize, &mut [f32]) + Sync),
    read_i8: &'a (dyn Fn(usize, &mut [i8]) -> Option<f32> + Sync),
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
        }
        out
    }
}
