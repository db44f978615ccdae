//! The reference W4A8 GEMM (see [`crate::int4`] for the layout and the epilogue).

use crate::int4::{accumulate_block, Int4Weights, QuantizedBlocks, QBLOCK};
use crate::packed::PANEL;
use std::ops::Range;

/// `out[i * ldo + j] = Σ_blocks accumulate_block(..)` for every row `i < x.m` and every column
/// `j` of the panels in `panels`: the dot product of row `i` with output `j`'s dequantized
/// weights, up to the activations' int8 rounding.
///
/// # Safety
/// As [`super::gemm::gemm`].
pub unsafe fn gemm_q4(x: &QuantizedBlocks, w: &Int4Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    let (blocks, record) = (w.blocks(), w.record_bytes());
    for p in panels {
        let cols = (w.n - p * PANEL).min(PANEL);
        for i in 0..x.m {
            let mut acc = [0f32; PANEL];
            for b in 0..blocks {
                let rec = std::slice::from_raw_parts(w.record(p, b), record);
                let xq = &x.q[i * x.k + b * QBLOCK..][..QBLOCK];
                let at = i * blocks + b;
                let (dx, tx) = (x.scales[at], x.scaled_sums[at]);
                for (o, a) in acc.iter_mut().enumerate() {
                    let s: i32 = xq.iter().enumerate().map(|(j, &v)| w.level(rec, o, j) as i32 * v as i32).sum();
                    let (d, m) = w.scale_min(rec, o);
                    *a = accumulate_block(*a, s, dx, tx, d, m);
                }
            }
            for (c, v) in acc[..cols].iter().enumerate() {
                *out.add(i * ldo + p * PANEL + c) = *v;
            }
        }
    }
}
