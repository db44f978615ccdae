//! Dense layers over the compute pool: `out = x · Wᵀ (+ bias)` with `W` pre-packed, in 16-bit
//! or 32-bit floats ([`linear`]), W8A8 int8 ([`linear_i8`]), 4-bit ([`linear_q4`]) or 8-bit
//! ([`linear_q8`]) blocks.

use crate::dispatch::{GemmArgs, Kernels};
use crate::int4::{Int4Weights, QuantizedBlocks};
use crate::int8::{quantize_row, Int8Weights, QuantizedRows};
use crate::int8_block::Int8BlockWeights;
use crate::packed::{activations_to_bf16, PackedWeights, WeightDtype};
use crate::pool::{split, SendPtr, ThreadPool};
use std::ops::Range;

/// Panels handed to a thread come in pairs, the widest tile any kernel uses.
const PANEL_UNIT: usize = 2;

/// `x` is `[m, w.k]` and `out` `[m, w.n]`. `bf16_scratch` holds the bf16 copy of `x` for
/// kernels that want one (kept by the caller so decode steps do not allocate).
pub fn linear(kern: &Kernels, pool: &ThreadPool, x: &[f32], w: &PackedWeights, bias: Option<&[f32]>, out: &mut [f32], bf16_scratch: &mut Vec<u16>) {
    let m = check_shapes(x, w.k, w.n, out);
    if m == 0 {
        return;
    }
    let x_bf16: &[u16] = if kern.bf16_activations && w.dtype == WeightDtype::BF16 {
        activations_to_bf16(x, w.k, bf16_scratch);
        bf16_scratch
    } else {
        &[]
    };
    let args = GemmArgs { m, x, x_bf16 };
    // SAFETY: each share writes only the columns of its own panels of `out`, which is [m, n].
    split_panels(pool, w.panels(), out, &|range, dst| unsafe { (kern.gemm)(&args, w, range, dst, w.n) });
    add_bias(out, bias, w.n);
}

/// The W8A8 layer: each row of `x` is quantized to int8 with its own scale (into `rows`, kept by
/// the caller like `bf16_scratch`), then multiplied by the int8 weights with integer sums.
pub fn linear_i8(kern: &Kernels, pool: &ThreadPool, x: &[f32], w: &Int8Weights, bias: Option<&[f32]>, out: &mut [f32], rows: &mut QuantizedRows) {
    let m = check_shapes(x, w.k, w.n, out);
    if m == 0 {
        return;
    }
    // Rows quantize on the pool too: a prefill's activations are megabytes.
    rows.resize(m, w.k);
    let k_padded = rows.k_padded;
    pool.for_chunk_pairs_mut(&mut rows.q, k_padded, &mut rows.scales, 1, &|i, q, scale| {
        scale[0] = quantize_row(&x[i * w.k..(i + 1) * w.k], q);
    });
    let (rows, gemm) = (&*rows, kern.gemm_i8.gemm);
    // SAFETY: as in `linear`.
    split_panels(pool, w.panels(), out, &|range, dst| unsafe { gemm(rows, w, range, dst, w.n) });
    add_bias(out, bias, w.n);
}

/// The W4A8 layer: `x` is quantized per block of 32 (into `rows`, kept by the caller), then
/// multiplied by the 4-bit weights with integer sums per block.
pub fn linear_q4(kern: &Kernels, pool: &ThreadPool, x: &[f32], w: &Int4Weights, bias: Option<&[f32]>, out: &mut [f32], rows: &mut QuantizedBlocks) {
    let gemm = kern.gemm_i8.gemm_q4;
    // SAFETY: as in `linear`.
    linear_blocks(pool, x, (w.k, w.n, w.panels()), bias, out, rows, &|rows, range, dst| unsafe { gemm(rows, w, range, dst, w.n) });
}

/// The 8-bit block layer, as [`linear_q4`].
pub fn linear_q8(kern: &Kernels, pool: &ThreadPool, x: &[f32], w: &Int8BlockWeights, bias: Option<&[f32]>, out: &mut [f32], rows: &mut QuantizedBlocks) {
    let gemm = kern.gemm_i8.gemm_q8;
    // SAFETY: as in `linear`.
    linear_blocks(pool, x, (w.k, w.n, w.panels()), bias, out, rows, &|rows, range, dst| unsafe { gemm(rows, w, range, dst, w.n) });
}

/// A block-quantized layer of `(k, n, panels)`: quantizes `x` per block, then runs `gemm` on
/// each thread's share of the panels (writing only those columns of `out`, `[m, n]`).
fn linear_blocks(
    pool: &ThreadPool,
    x: &[f32],
    (k, n, panels): (usize, usize, usize),
    bias: Option<&[f32]>,
    out: &mut [f32],
    rows: &mut QuantizedBlocks,
    gemm: &(dyn Fn(&QuantizedBlocks, Range<usize>, *mut f32) + Sync),
) {
    if check_shapes(x, k, n, out) == 0 {
        return;
    }
    rows.quantize(x, k, pool);
    let rows = &*rows;
    split_panels(pool, panels, out, &|range, dst| gemm(rows, range, dst));
    add_bias(out, bias, n);
}

/// Rows of `x`, after checking `x` is `[m, k]` and `out` `[m, n]`.
fn check_shapes(x: &[f32], k: usize, n: usize, out: &[f32]) -> usize {
    let m = x.len() / k;
    assert_eq!(x.len(), m * k, "linear: x must be [m, {k}]");
    assert_eq!(out.len(), m * n, "linear: out must be [m, {n}]");
    m
}

/// Runs `gemm(panel range, out)` on each thread's share of the panels.
fn split_panels(pool: &ThreadPool, panels: usize, out: &mut [f32], gemm: &(dyn Fn(Range<usize>, *mut f32) + Sync)) {
    let units = panels.div_ceil(PANEL_UNIT);
    let shares = pool.threads().min(units);
    let dst = SendPtr(out.as_mut_ptr());
    pool.run(&|share| {
        if share >= shares {
            return;
        }
        let units = split(units, shares, share);
        let dst = dst;
        gemm(units.start * PANEL_UNIT..(units.end * PANEL_UNIT).min(panels), dst.0);
    });
}

fn add_bias(out: &mut [f32], bias: Option<&[f32]>, n: usize) {
    if let Some(b) = bias {
        out.chunks_exact_mut(n).for_each(|row| row.iter_mut().zip(b).for_each(|(o, b)| *o += b));
    }
}
