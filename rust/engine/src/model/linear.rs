//! A dense layer `y = x Wᵀ + b`, its weights packed once for the kernels (16/32-bit floats, or
//! W8A8 int8), and the compute context (kernel table + thread pool) every layer runs on.

use crate::config::Quantization;
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
    /// Packs a row-major `[n, k]` matrix in `dtype`, or quantized.
    pub fn new(w: &[f32], n: usize, k: usize, dtype: WeightDtype, quantization: Option<Quantization>) -> Weights {
        match quantization {
            None => Weights::Float(PackedWeights::pack(w, n, k, dtype)),
            Some(Quantization::W8A8Int8) => Weights::Int8(Int8Weights::quantize(w, n, k)),
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

/// One layer's unpacked weights `[out, in]` and bias, as read from the checkpoint.
pub struct LinearParts {
    pub weight: Vec<f32>,
    pub bias: Option<Vec<f32>>,
    pub out_features: usize,
}

impl Linear {
    /// Packs layers that read the same input (q|k|v, gate|up) as one, so one call computes them.
    pub fn fused(parts: Vec<LinearParts>, in_features: usize, dtype: WeightDtype, quantization: Option<Quantization>) -> Linear {
        let out_features = parts.iter().map(|p| p.out_features).sum();
        let any_bias = parts.iter().any(|p| p.bias.is_some());
        let mut weight = Vec::with_capacity(out_features * in_features);
        let mut bias = any_bias.then(|| Vec::with_capacity(out_features));
        for p in parts {
            weight.extend_from_slice(&p.weight);
            if let Some(b) = bias.as_mut() {
                b.extend(p.bias.unwrap_or_else(|| vec![0.0; p.out_features]));
            }
        }
        Linear { weight: Weights::new(&weight, out_features, in_features, dtype, quantization), bias }
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
