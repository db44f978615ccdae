//! A dense layer `y = x Wᵀ + b`, its weights packed once for the kernels, and the compute
//! context (kernel table + thread pool) every layer runs on.

use rsgl_kernels::{kernels, linear, Kernels, PackedWeights, ThreadPool, WeightDtype};
use std::sync::Mutex;

/// What a forward pass computes with: the kernels chosen for this CPU and the engine's pool.
pub struct Compute {
    pub kernels: &'static Kernels,
    pub pool: ThreadPool,
    /// bf16 copy of a GEMM's activations, reused across layers and steps (a lock only so the
    /// model can be shared with the pool's threads; one thread runs forward passes).
    bf16_scratch: Mutex<Vec<u16>>,
}

impl Compute {
    pub fn new(pool: ThreadPool) -> Compute {
        Compute { kernels: kernels(), pool, bf16_scratch: Mutex::new(Vec::new()) }
    }
}

pub struct Linear {
    pub weight: PackedWeights,
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
    pub fn fused(parts: Vec<LinearParts>, in_features: usize, dtype: WeightDtype) -> Linear {
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
        Linear { weight: PackedWeights::pack(&weight, out_features, in_features, dtype), bias }
    }

    pub fn out_features(&self) -> usize {
        self.weight.n
    }

    /// `x` is `[rows, in]`; returns `[rows, out]`.
    pub fn forward(&self, c: &Compute, x: &[f32]) -> Vec<f32> {
        let mut out = vec![0.0; x.len() / self.weight.k * self.weight.n];
        linear(c.kernels, &c.pool, x, &self.weight, self.bias.as_deref(), &mut out, &mut c.bf16_scratch.lock().unwrap_or_else(|e| e.into_inner()));
        out
    }
}
