//! A dense layer `y = x Wᵀ + b` with weights `[out, in]`, split over the thread pool by
//! output columns so each thread streams its own slice of the weights.

use rayon::prelude::*;
use rsgl_kernels::kernels;

pub struct Linear {
    pub weight: Vec<f32>,
    pub bias: Option<Vec<f32>>,
    pub in_features: usize,
    pub out_features: usize,
}

/// Columns per task: small enough to balance threads, large enough to amortize a task.
fn column_block(out_features: usize) -> usize {
    let tasks = rayon::current_num_threads() * 4;
    out_features.div_ceil(tasks).next_multiple_of(16).max(16)
}

impl Linear {
    /// Concatenates layers that read the same input (q|k|v, gate|up) so one call computes them.
    pub fn fuse(parts: Vec<Linear>) -> Linear {
        let in_features = parts[0].in_features;
        assert!(parts.iter().all(|p| p.in_features == in_features));
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
        Linear { weight, bias, in_features, out_features }
    }

    /// `x` is `[rows, in]`; returns `[rows, out]`.
    pub fn forward(&self, x: &[f32]) -> Vec<f32> {
        let mut out = matmul_bt(x, &self.weight, self.in_features);
        if let Some(b) = &self.bias {
            out.chunks_mut(self.out_features).for_each(|row| row.iter_mut().zip(b).for_each(|(o, b)| *o += b));
        }
        out
    }
}

/// `x [rows, k] · wᵀ` for `w [n, k]`, over the current thread pool; returns `[rows, n]`.
pub fn matmul_bt(x: &[f32], w: &[f32], k: usize) -> Vec<f32> {
    let (rows, n) = (x.len() / k, w.len() / k);
    let block = column_block(n);
    let gemm = kernels().gemm_bt;
    let mut out = vec![0.0; rows * n];
    if rows == 0 {
        return out;
    }
    if rows == 1 {
        out.par_chunks_mut(block).zip(w.par_chunks(block * k)).for_each(|(o, w)| gemm(x, w, k, o));
        return out;
    }
    // Each task fills a [rows, block] tile; tiles are then placed into the row-major output.
    let tiles: Vec<Vec<f32>> = w
        .par_chunks(block * k)
        .map(|w| {
            let mut tile = vec![0.0; rows * (w.len() / k)];
            gemm(x, w, k, &mut tile);
            tile
        })
        .collect();
    for (t, tile) in tiles.iter().enumerate() {
        let cols = tile.len() / rows;
        for r in 0..rows {
            let at = r * n + t * block;
            out[at..at + cols].copy_from_slice(&tile[r * cols..(r + 1) * cols]);
        }
    }
    out
}
