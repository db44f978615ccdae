//! The reference 8-bit block GEMM (see [`crate::int8_block`] for the layout and the epilogue).

use crate::int4::QuantizedBlocks;
use crate::int8_block::{accumulate_half, Int8BlockWeights, HALF_BLOCK};
use crate::packed::PANEL;
use std::ops::Range;

/// The reference 8-bit block GEMM: `out[i * ldo + j]`, for every row `i < x.m` and column `j`
/// of the panels in `panels`, is row `i`'s dot product with output `j`'s weights, block by
/// block and half by half through [`accumulate_half`].
///
/// # Safety
/// As [`super::gemm::gemm`].
pub unsafe fn gemm_q8(x: &QuantizedBlocks, w: &Int8BlockWeights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    for p in panels {
        let cols = (w.n - p * PANEL).min(PANEL);
        for i in 0..x.m {
            let mut acc = [0f32; PANEL];
            for b in 0..w.blocks() {
                let rec = std::slice::from_raw_parts(w.record(p, b), w.record_bytes());
                let (xq, dx, _) = x.block(i, b);
                for (o, a) in acc.iter_mut().enumerate() {
                    for h in 0..2 {
                        let s: i32 = (h * HALF_BLOCK..(h + 1) * HALF_BLOCK).map(|j| w.weight(rec, o, j) * *xq.add(j) as i32).sum();
                        *a = accumulate_half(*a, s, dx, w.scale(rec, o, h));
                    }
                }
            }
            for (c, v) in acc[..cols].iter().enumerate() {
                *out.add(i * ldo + p * PANEL + c) = *v;
            }
        }
    }
}
