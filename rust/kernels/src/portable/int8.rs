//! The reference int8 GEMM (see [`crate::int8`] for the layout and the epilogue).

use crate::int8::{Int8Weights, QuantizedRows, K_BLOCK};
use crate::packed::PANEL;
use std::ops::Range;

/// `out[i * ldo + j] = (sum_k x_q[i][k] * w_q[j][k]) as f32 * x_scale[i] * w_scale[j]` for every
/// row `i < x.m` and every column `j` of the panels in `panels`.
///
/// # Safety
/// As [`super::gemm::gemm`].
pub unsafe fn gemm_i8(x: &QuantizedRows, w: &Int8Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    for p in panels {
        let base = p * w.panel_stride();
        let cols = (w.n - p * PANEL).min(PANEL);
        for i in 0..x.m {
            let xr = x.row(i);
            for c in 0..cols {
                let mut sum = 0i32;
                for (block, xb) in xr.chunks_exact(K_BLOCK).enumerate() {
                    let wb = &w.data[base + (block * PANEL + c) * K_BLOCK..][..K_BLOCK];
                    sum += xb.iter().zip(wb).map(|(&a, &b)| a as i32 * b as i32).sum::<i32>();
                }
                let j = p * PANEL + c;
                *out.add(i * ldo + j) = sum as f32 * x.scales[i] * w.scales[j];
            }
        }
    }
}
