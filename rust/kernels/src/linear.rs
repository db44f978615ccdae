//! Dense layers over the compute pool: `out = x · Wᵀ (+ bias)` with `W` pre-packed, in 16-bit
//! or 32-bit floats ([`linear`]), W8A8 int8 ([`linear_i8`]), 4-bit or 8-bit blocks
//! ([`linear_blocks`]).

use crate::dispatch::{GemmArgs, Kernels};
use crate::int4::{Int4Weights, QuantizedBlocks};
use crate::int8::{quantize_row, Int8Weights, QuantizedRows};
use crate::int8_block::Int8BlockWeights;
use crate::packed::{activations_to_bf16, PackedWeights, WeightDtype};
use crate::pool::{split, SendPtr, ThreadPool};
use std::ops::Range;

/// Panels handed to a thread come in pairs, the widest tile any kernel uses.
const PANEL_UNIT: usize = 2;

/// A layer's GEMM with its activations prepared (converted or quantized into the caller's
/// scratch): [`run_prepared`] computes it, alone or with other layers in one parallel region.
pub struct PreparedGemm<'a> {
    panels: usize,
    /// `[m, n]`, written a panel's columns at a time.
    out: SendPtr<f32>,
    /// `out`'s length.
    len: usize,
    n: usize,
    bias: Option<&'a [f32]>,
    /// Computes the columns of a range of panels into `out`.
    run: Box<dyn Fn(Range<usize>, *mut f32) + Sync + 'a>,
}

/// Runs `gemms` in one parallel region (one synchronization point however many layers: a
/// decode step's routed experts), their panels laid end to end in pairs, each pair weighed by
/// its layer's rows, and cut into one contiguous run of equal weight per thread; then adds each
/// layer's bias. Each output column is computed by one panel's kernel call whichever thread
/// runs it, so grouping never changes a result.
pub fn run_prepared(pool: &ThreadPool, gemms: &[PreparedGemm]) {
    let units: Vec<usize> = gemms.iter().map(|g| g.panels.div_ceil(PANEL_UNIT)).collect();
    let rows: Vec<usize> = gemms.iter().map(|g| (g.len / g.n.max(1)).max(1)).collect();
    let total: usize = units.iter().zip(&rows).map(|(u, r)| u * r).sum();
    if total == 0 {
        return;
    }
    let shares = pool.threads().min(units.iter().sum());
    pool.run(&|share| {
        if share >= shares {
            return;
        }
        // A pair belongs to the share its weighted start falls in.
        let mine = split(total, shares, share);
        let mut first = 0;
        for ((g, &n), &r) in gemms.iter().zip(&units).zip(&rows) {
            let unit_at = |weight: usize| (weight.saturating_sub(first)).div_ceil(r).min(n);
            let (lo, hi) = (unit_at(mine.start), unit_at(mine.end));
            if lo < hi {
                (g.run)(lo * PANEL_UNIT..(hi * PANEL_UNIT).min(g.panels), g.out.get());
            }
            first += n * r;
        }
    });
    for g in gemms {
        if let Some(b) = g.bias {
            // SAFETY: the region is over; `out` is the `[m, n]` slice `g` was prepared with.
            let out = unsafe { std::slice::from_raw_parts_mut(g.out.get(), g.len) };
            add_bias(out, Some(b), g.n);
        }
    }
}

/// `x` is `[m, w.k]` and `out` `[m, w.n]`. `bf16_scratch` holds the bf16 copy of `x` for
/// kernels that want one (kept by the caller so decode steps do not allocate).
pub fn linear(kern: &Kernels, pool: &ThreadPool, x: &[f32], w: &PackedWeights, bias: Option<&[f32]>, out: &mut [f32], bf16_scratch: &mut Vec<u16>) {
    run_prepared(pool, &[prepare(kern, x, w, bias, out, bf16_scratch)]);
}

/// [`linear`]'s GEMM, prepared.
pub fn prepare<'a>(
    kern: &'a Kernels,
    x: &'a [f32],
    w: &'a PackedWeights,
    bias: Option<&'a [f32]>,
    out: &'a mut [f32],
    bf16_scratch: &'a mut Vec<u16>,
) -> PreparedGemm<'a> {
    let m = check_shapes(x, w.k, w.n, out);
    let x_bf16: &[u16] = if m > 0 && kern.bf16_activations && w.dtype == WeightDtype::BF16 {
        activations_to_bf16(x, w.k, bf16_scratch);
        bf16_scratch
    } else {
        &[]
    };
    let args = GemmArgs { m, x, x_bf16 };
    // SAFETY: each call writes only the columns of its own panels of `out`, which is [m, n].
    prepared(w.panels(), w.n, bias, out, Box::new(move |range, dst| unsafe { (kern.gemm)(&args, w, range, dst, w.n) }))
}

/// A GEMM of `panels` panels into `out` (`[m, n]`; none when `m` is 0).
fn prepared<'a>(
    panels: usize,
    n: usize,
    bias: Option<&'a [f32]>,
    out: &'a mut [f32],
    run: Box<dyn Fn(Range<usize>, *mut f32) + Sync + 'a>,
) -> PreparedGemm<'a> {
    let panels = if out.is_empty() { 0 } else { panels };
    PreparedGemm { panels, out: SendPtr(out.as_mut_ptr()), len: out.len(), n, bias, run }
}

/// The W8A8 layer: each row of `x` is quantized to int8 with its own scale (into `rows`, kept by
/// the caller like `bf16_scratch`), then multiplied by the int8 weights with integer sums.
pub fn linear_i8(kern: &Kernels, pool: &ThreadPool, x: &[f32], w: &Int8Weights, bias: Option<&[f32]>, out: &mut [f32], rows: &mut QuantizedRows) {
    run_prepared(pool, &[prepare_i8(kern, pool, x, w, bias, out, rows)]);
}

/// [`linear_i8`]'s GEMM, prepared (its rows quantized on `pool`: a prefill's activations are
/// megabytes).
pub fn prepare_i8<'a>(
    kern: &'a Kernels,
    pool: &ThreadPool,
    x: &'a [f32],
    w: &'a Int8Weights,
    bias: Option<&'a [f32]>,
    out: &'a mut [f32],
    rows: &'a mut QuantizedRows,
) -> PreparedGemm<'a> {
    let m = check_shapes(x, w.k, w.n, out);
    rows.resize(m, w.k);
    let k_padded = rows.k_padded;
    pool.for_chunk_pairs_mut(&mut rows.q, k_padded, &mut rows.scales, 1, &|i, q, scale| {
        scale[0] = quantize_row(&x[i * w.k..(i + 1) * w.k], q);
    });
    let (rows, gemm) = (&*rows, kern.gemm_i8.gemm);
    // SAFETY: as in `prepare`.
    prepared(w.panels(), w.n, bias, out, Box::new(move |range, dst| unsafe { gemm(rows, w, range, dst, w.n) }))
}

/// How finely the block layers quantize their activations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ActivationBits {
    /// int8 per block of 32, as llama.cpp does.
    #[default]
    Eight,
    /// int8 per block of 32 plus the int8 residual of that rounding, both multiplied by the
    /// weights in one pass (one read of the weights, twice the integer work): about 16 bits.
    Sixteen,
}

/// The block layers' activations: how finely they are quantized, and buffers kept by the
/// caller so decode steps do not allocate.
#[derive(Default)]
pub struct BlockActivations {
    pub bits: ActivationBits,
    rows: QuantizedBlocks,
    /// With [`ActivationBits::Sixteen`], the GEMM's outputs of the rows and of their residuals.
    halves: Vec<f32>,
}

impl BlockActivations {
    pub fn new(bits: ActivationBits) -> BlockActivations {
        BlockActivations { bits, ..BlockActivations::default() }
    }
}

/// Rows of a 16-bit block layer multiplied per pass: bounds the buffer of the two halves'
/// outputs (a prefill chunk's gate|up outputs at 8B are hundreds of megabytes).
const SIXTEEN_BIT_ROWS: usize = 256;

/// Block-quantized weights (4-bit as [`Int4Weights`], 8-bit as [`Int8BlockWeights`]) and the
/// kernel that multiplies them by per-block quantized activations.
pub trait BlockWeights: Sync {
    /// `(k, n, panels)`.
    fn shape(&self) -> (usize, usize, usize);

    /// The columns of `panels` of `rows · Wᵀ` into `out` (`[m, n]`).
    ///
    /// # Safety
    /// As [`crate::portable::int4::gemm_q4`]: `out` holds `rows.m` rows of `n`.
    unsafe fn gemm(&self, kern: &Kernels, rows: &QuantizedBlocks, panels: Range<usize>, out: *mut f32);
}

impl BlockWeights for Int4Weights {
    fn shape(&self) -> (usize, usize, usize) {
        (self.k, self.n, self.panels())
    }

    unsafe fn gemm(&self, kern: &Kernels, rows: &QuantizedBlocks, panels: Range<usize>, out: *mut f32) {
        (kern.gemm_i8.gemm_q4)(rows, self, panels, out, self.n)
    }
}

impl BlockWeights for Int8BlockWeights {
    fn shape(&self) -> (usize, usize, usize) {
        (self.k, self.n, self.panels())
    }

    unsafe fn gemm(&self, kern: &Kernels, rows: &QuantizedBlocks, panels: Range<usize>, out: *mut f32) {
        (kern.gemm_i8.gemm_q8)(rows, self, panels, out, self.n)
    }
}

/// The block layers (W4A8, 8-bit blocks): `x` is quantized per block of 32 (into `acts`), then
/// multiplied by the weights with integer sums per block.
pub fn linear_blocks<W: BlockWeights>(kern: &Kernels, pool: &ThreadPool, x: &[f32], w: &W, bias: Option<&[f32]>, out: &mut [f32], acts: &mut BlockActivations) {
    let (k, n, panels) = w.shape();
    if check_shapes(x, k, n, out) == 0 {
        return;
    }
    if acts.bits == ActivationBits::Eight {
        let prepared = prepare_blocks(kern, pool, x, w, bias, out, acts);
        return run_prepared(pool, &[prepared.expect("8-bit activations prepare")]);
    }
    let BlockActivations { rows, halves, .. } = acts;
    for (x, out) in x.chunks(SIXTEEN_BIT_ROWS * k).zip(out.chunks_mut(SIXTEEN_BIT_ROWS * n)) {
        rows.quantize_with_residuals(x, k, pool);
        halves.resize(2 * out.len(), 0.0);
        let rows = &*rows;
        // SAFETY: as in `prepare`.
        run_prepared(pool, &[prepared(panels, n, None, halves, Box::new(|range, dst| unsafe { w.gemm(kern, rows, range, dst) }))]);
        let (values, residuals) = halves.split_at(out.len());
        out.iter_mut().zip(values.iter().zip(residuals)).for_each(|(o, (v, r))| *o = v + r);
    }
    add_bias(out, bias, n);
}

/// [`linear_blocks`]' GEMM, prepared; none with [`ActivationBits::Sixteen`] (its two passes per
/// chunk of rows run only through [`linear_blocks`]).
pub fn prepare_blocks<'a, W: BlockWeights>(
    kern: &'a Kernels,
    pool: &ThreadPool,
    x: &'a [f32],
    w: &'a W,
    bias: Option<&'a [f32]>,
    out: &'a mut [f32],
    acts: &'a mut BlockActivations,
) -> Option<PreparedGemm<'a>> {
    let (k, n, panels) = w.shape();
    check_shapes(x, k, n, out);
    if acts.bits != ActivationBits::Eight {
        return None;
    }
    acts.rows.quantize(x, k, pool);
    let rows = &acts.rows;
    // SAFETY: as in `prepare`.
    Some(prepared(panels, n, bias, out, Box::new(move |range, dst| unsafe { w.gemm(kern, rows, range, dst) })))
}

/// Rows of `x`, after checking `x` is `[m, k]` and `out` `[m, n]`.
fn check_shapes(x: &[f32], k: usize, n: usize, out: &[f32]) -> usize {
    let m = x.len() / k;
    assert_eq!(x.len(), m * k, "linear: x must be [m, {k}]");
    assert_eq!(out.len(), m * n, "linear: out must be [m, {n}]");
    m
}

fn add_bias(out: &mut [f32], bias: Option<&[f32]>, n: usize) {
    if let Some(b) = bias {
        out.chunks_exact_mut(n).for_each(|row| row.iter_mut().zip(b).for_each(|(o, b)| *o += b));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::int4::Int4Offset;
    use crate::kernels;

    fn values(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| ((i as f32 + seed) * 0.731).sin() * (1.0 + (i % 7) as f32)).collect()
    }

    /// Largest error of `linear_blocks` at `bits` against float activations times the same 4-bit
    /// weights, over more rows than one 16-bit pass takes.
    fn q4_error(bits: ActivationBits) -> f32 {
        let (m, n, k) = (SIXTEEN_BIT_ROWS + 3, 19, 96);
        let w = Int4Weights::quantize(&values(n * k, 2.0), n, k, Int4Offset::Min);
        let x = values(m * k, 5.0);
        let pool = ThreadPool::new(2, false);
        let mut out = vec![0.0; m * n];
        linear_blocks(kernels(), &pool, &x, &w, None, &mut out, &mut BlockActivations::new(bits));
        let rows: Vec<Vec<f32>> = (0..n).map(|j| w.row(j)).collect();
        let mut worst = 0f32;
        for (i, out) in out.chunks_exact(n).enumerate() {
            for (o, row) in out.iter().zip(&rows) {
                let want: f64 = row.iter().zip(&x[i * k..(i + 1) * k]).map(|(&w, &x)| w as f64 * x as f64).sum();
                worst = worst.max((*o as f64 - want).abs() as f32);
            }
        }
        worst
    }

    /// Layers of different widths, rows and weight types run together in one region compute
    /// the bits each computes alone, on any number of threads (shares cutting layers anywhere).
    #[test]
    fn grouped_layers_compute_what_each_computes_alone() {
        let kern = kernels();
        let (k, widths, rows) = (64, [19, 48, 5], [1, 3, 2]);
        let q4: Vec<Int4Weights> = widths.iter().map(|&n| Int4Weights::quantize(&values(n * k, n as f32), n, k, Int4Offset::Eight)).collect();
        let float = PackedWeights::pack(&values(33 * k, 1.5), 33, k, WeightDtype::F32);
        let xs: Vec<Vec<f32>> = rows.iter().map(|&m| values(m * k, m as f32 + 0.25)).chain([values(4 * k, 9.0)]).collect();
        let bias = values(33, 3.0);
        for threads in [1, 2, 3, 5] {
            let pool = ThreadPool::new(threads, false);
            let mut alone: Vec<Vec<f32>> = Vec::new();
            for ((w, x), m) in q4.iter().zip(&xs).zip(rows) {
                let mut out = vec![0.0; m * w.n];
                linear_blocks(kern, &pool, x, w, None, &mut out, &mut BlockActivations::default());
                alone.push(out);
            }
            let mut out = vec![0.0; 4 * 33];
            linear(kern, &pool, &xs[3], &float, Some(&bias), &mut out, &mut Vec::new());
            alone.push(out);

            let mut outs: Vec<Vec<f32>> = alone.iter().map(|o| vec![0.0; o.len()]).collect();
            let mut acts: Vec<BlockActivations> = q4.iter().map(|_| BlockActivations::default()).collect();
            let mut bf16 = Vec::new();
            let (q4_outs, float_out) = outs.split_at_mut(3);
            let mut gemms: Vec<PreparedGemm> = q4
                .iter()
                .zip(&xs)
                .zip(q4_outs.iter_mut())
                .zip(acts.iter_mut())
                .map(|(((w, x), out), acts)| prepare_blocks(kern, &pool, x, w, None, out, acts).expect("8-bit activations"))
                .collect();
            gemms.push(prepare(kern, &xs[3], &float, Some(&bias), &mut float_out[0], &mut bf16));
            run_prepared(&pool, &gemms);
            drop(gemms);
            for (i, (grouped, alone)) in outs.iter().zip(&alone).enumerate() {
                assert!(grouped.iter().zip(alone).all(|(a, b)| a.to_bits() == b.to_bits()), "layer {i} on {threads} threads");
            }
        }
    }

    #[test]
    fn sixteen_bit_activations_come_near_float_ones() {
        let (eight, sixteen) = (q4_error(ActivationBits::Eight), q4_error(ActivationBits::Sixteen));
        // The residual's step is at most 1/254 of the value's, so its error is about that much
        // smaller (257 times here).
        assert!(sixteen < eight / 100.0, "16-bit error {sixteen} vs 8-bit {eight}");
    }
}
