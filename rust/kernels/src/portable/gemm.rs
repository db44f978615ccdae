//! The reference GEMM over packed weights, and the tiling loop the SIMD GEMMs share.

use crate::dispatch::GemmArgs;
use crate::packed::{bf16_to_f32, f16_to_f32, PackedWeights, WeightDtype, PANEL};
use std::ops::Range;

/// `out[i * ldo + j] = x[i, :] · w[j, :]` for every row `i < m` and every column `j` of the
/// panels in `panels`. Each output is a sequential fused sum over `k`, whatever `m` is.
///
/// # Safety
/// `out` must be valid for writes at `i * ldo + j` for those `i` and `j`, and no other thread
/// may access those elements during the call.
pub unsafe fn gemm(a: &GemmArgs, w: &PackedWeights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    let k = w.k;
    let mut wk = [0f32; PANEL];
    for p in panels {
        let base = p * w.panel_stride();
        let cols = (w.n - p * PANEL).min(PANEL);
        for i in 0..a.m {
            let x = &a.x[i * k..(i + 1) * k];
            let mut acc = [0f32; PANEL];
            for (kk, &xv) in x.iter().enumerate() {
                widen_k_row(w, base, kk, &mut wk);
                for c in 0..PANEL {
                    acc[c] = xv.mul_add(wk[c], acc[c]);
                }
            }
            for (c, v) in acc[..cols].iter().enumerate() {
                *out.add(i * ldo + p * PANEL + c) = *v;
            }
        }
    }
}

/// The 16 weights at inner index `kk` of the panel starting at `base`, as f32.
fn widen_k_row(w: &PackedWeights, base: usize, kk: usize, row: &mut [f32; PANEL]) {
    match w.dtype {
        WeightDtype::F32 => row.copy_from_slice(&w.f32_data()[base + kk * PANEL..][..PANEL]),
        WeightDtype::F16 => {
            let d = &w.half_data()[base + kk * PANEL..][..PANEL];
            row.iter_mut().zip(d).for_each(|(r, &h)| *r = f16_to_f32(h));
        }
        WeightDtype::BF16 => {
            let d = &w.half_data()[base + (kk / 2) * 2 * PANEL..][..2 * PANEL];
            row.iter_mut().enumerate().for_each(|(c, r)| *r = bf16_to_f32(d[2 * c + kk % 2]));
        }
    }
}

/// Walks the `[m, panels]` output in tiles of at most `max_rows` rows by `panels_per_tile`
/// panels, calling `tile(first_row, rows, first_panel, panels)`. Rows go in blocks so the
/// activations a block reads stay in cache while the thread's weight panels stream past.
#[inline(always)]
pub fn for_each_tile(m: usize, panels: Range<usize>, max_rows: usize, panels_per_tile: usize, mut tile: impl FnMut(usize, usize, usize, usize)) {
    for_each_tile_in_chunks(m, panels, max_rows, panels_per_tile, 1, 1, |row, rows, panel, np, _| tile(row, rows, panel, np));
}

/// Runs `body` with `i` = 0, ..., N - 1 (N a const of at most 8) as straight-line code, so each
/// index is a constant: a tile's per-row accumulators stay in registers (LLVM does not unroll a
/// loop over 8 rows of a block tile and keeps its accumulator array on the stack; with the 8-bit
/// block tiles it then spills their weights too), and shifts by an index fold to immediates. A
/// macro, not a function taking a closure: closures do not inherit `#[target_feature]`, so the
/// intrinsics in one would not inline. (x86_64's block tiles use it; aarch64's tiles are at most
/// 4 rows or paired by SMMLA.)
#[cfg(target_arch = "x86_64")]
macro_rules! unroll {
    ($steps:expr, |$i:ident| $body:block) => {{
        const { assert!($steps <= 8, "unroll unrolls at most 8 steps") };
        unroll!(@each $steps, $i, $body, 0 1 2 3 4 5 6 7);
    }};
    (@each $steps:expr, $i:ident, $body:block, $($n:literal)*) => {{
        $(if $n < $steps {
            let $i: usize = $n;
            $body
        })*
    }};
}
#[cfg(target_arch = "x86_64")]
pub(crate) use unroll;

/// [`for_each_tile`] for the block-quantized GEMMs, with the inner dimension cut into chunks of
/// `chunk` blocks: `tile(first_row, rows, first_panel, panels, blocks)` runs every row tile of a
/// panel over one chunk before the next chunk, so the chunk of weights stays in L1 while the
/// row tiles reuse it (a whole panel of a 2048-wide matrix and 8 activation rows overflow it).
/// A tile continues the sums its columns hold in `out` after the first chunk; storing and
/// reloading an f32 is exact, so the result is the same as in one pass.
#[inline(always)]
pub fn for_each_tile_in_chunks(
    m: usize,
    panels: Range<usize>,
    max_rows: usize,
    panels_per_tile: usize,
    blocks: usize,
    chunk: usize,
    mut tile: impl FnMut(usize, usize, usize, usize, Range<usize>),
) {
    let row_block = max_rows * 8;
    for block in (0..m).step_by(row_block) {
        let block_end = (block + row_block).min(m);
        let mut p = panels.start;
        while p < panels.end {
            let np = panels_per_tile.min(panels.end - p);
            for first in (0..blocks).step_by(chunk.max(1)) {
                let mut r = block;
                while r < block_end {
                    let rows = max_rows.min(block_end - r);
                    tile(r, rows, p, np, first..(first + chunk).min(blocks));
                    r += rows;
                }
            }
            p += np;
        }
    }
}
