//! The W8A8 scheme's data: int8 weights with one scale per output channel, packed at load for
//! the int8 GEMMs, and activations quantized per token (per row) right before each GEMM.
//!
//! Both are symmetric (`value ≈ q * scale`, `q` in -127..=127). A `[n, k]` weight matrix is cut
//! into panels of [`PANEL`] outputs; inside a panel each block of [`K_BLOCK`] inputs holds the
//! 16 outputs' 8 weights one after another, `[panel][k / 8][16][8]` (`k` padded with zeros).
//! Two outputs' 8 weights are then one 16-byte register: the `b` operand of Arm's `SMMLA`,
//! and two 4-wide partial sums per output for `SDOT`, `vpdpbusd` and `vpmaddubsw`.
//!
//! A GEMM's integer sums are exact, so every path gives the same bits: `out = (sum as f32 *
//! x_scale) * w_scale`, in that order.

use crate::memory::Frozen;
use crate::packed::PANEL;
use crate::pool::{SendPtr, ThreadPool};

/// Inputs per block of a panel.
pub const K_BLOCK: usize = 8;

pub struct Int8Weights {
    /// Output rows.
    pub n: usize,
    /// Inner dimension, and the same rounded up to [`K_BLOCK`].
    pub k: usize,
    pub k_padded: usize,
    pub data: Frozen<i8>,
    /// Per output, padded with zeros to whole panels.
    pub scales: Vec<f32>,
    /// Per output, the sum of its int8 weights: the correction for kernels that offset
    /// activations to unsigned bytes (`vpdpbusd` multiplies u8 by s8).
    pub col_sums: Vec<i32>,
}

/// The symmetric int8 of `v` with `scale` (`v / scale`, rounded half to even, clamped).
#[inline]
pub fn quantize_value(v: f32, scale: f32) -> i8 {
    round_to_i8(v / scale)
}

/// `q` clamped to ±127 and rounded half to even.
#[inline]
pub fn round_to_i8(q: f32) -> i8 {
    // Adding and taking away 1.5 * 2^23 rounds to an integer, half to even, for |q| < 2^22:
    // the same as `round_ties_even`, which is a libm call where SSE4.1 is not assumed, while
    // this vectorizes everywhere.
    const ROUND: f32 = 12_582_912.0;
    let q = q.clamp(-127.0, 127.0);
    ((q + ROUND) - ROUND) as i8
}

/// Quantizes one weight row into `out`, returning its symmetric scale.
pub fn quantize_weight_row(row: &[f32], out: &mut [i8]) -> f32 {
    let scale = symmetric_scale(row);
    out.iter_mut().zip(row).for_each(|(q, &v)| *q = quantize_value(v, scale));
    scale
}

/// The scale mapping `max |row|` to 127 (1 for an all-zero row, whose quants are then 0).
pub fn symmetric_scale(row: &[f32]) -> f32 {
    let max = row.iter().fold(0f32, |m, v| m.max(v.abs()));
    if max > 0.0 {
        max / 127.0
    } else {
        1.0
    }
}

impl Int8Weights {
    /// Quantizes a row-major `[n, k]` float matrix, one scale per output row.
    pub fn quantize(w: &[f32], n: usize, k: usize) -> Int8Weights {
        assert_eq!(w.len(), n * k, "quantize: weights must be [n, k]");
        Self::pack_rows(n, k, &ThreadPool::new(1, false), &|row, q| quantize_weight_row(&w[row * k..(row + 1) * k], q))
    }

    /// Packs int8 weights `[n, k]` with their per-output scales (a W8A8 checkpoint's tensors).
    pub fn pack(q: &[i8], scales: &[f32], n: usize, k: usize) -> Int8Weights {
        assert!(q.len() == n * k && scales.len() == n, "pack: int8 weights must be [n, k] with n scales");
        Self::pack_rows(n, k, &ThreadPool::new(1, false), &|row, out| {
            out.copy_from_slice(&q[row * k..(row + 1) * k]);
            scales[row]
        })
    }

    /// Packs an `[n, k]` matrix whose int8 rows `read_row(row, out)` writes, returning the row's
    /// scale (read from a checkpoint, or quantized from floats by [`quantize_weight_row`]),
    /// panel by panel on the threads of `pool`.
    pub fn pack_rows(n: usize, k: usize, pool: &ThreadPool, read_row: &(dyn Fn(usize, &mut [i8]) -> f32 + Sync)) -> Int8Weights {
        let panels = n.div_ceil(PANEL);
        let k_padded = k.next_multiple_of(K_BLOCK);
        let stride = PANEL * k_padded;
        let mut scales = vec![0.0; panels * PANEL];
        let mut col_sums = vec![0; panels * PANEL];
        let (scales_out, sums_out) = (SendPtr(scales.as_mut_ptr()), SendPtr(col_sums.as_mut_ptr()));
        let data = Frozen::filled(panels * stride, |out: &mut [i8]| {
            let dst = SendPtr(out.as_mut_ptr());
            pool.for_ranges(panels, &|panels| {
                let mut row = vec![0i8; k_padded];
                for p in panels {
                    // SAFETY: panel `p` owns its `stride` packed bytes and its PANEL scales and sums.
                    let packed = unsafe { std::slice::from_raw_parts_mut(dst.get().add(p * stride), stride) };
                    for r in 0..PANEL.min(n - p * PANEL) {
                        let output = p * PANEL + r;
                        let scale = read_row(output, &mut row[..k]);
                        unsafe {
                            *scales_out.get().add(output) = scale;
                            *sums_out.get().add(output) = row[..k].iter().map(|&v| v as i32).sum();
                        }
                        for (block, values) in row.chunks_exact(K_BLOCK).enumerate() {
                            packed[(block * PANEL + r) * K_BLOCK..][..K_BLOCK].copy_from_slice(values);
                        }
                    }
                }
            });
        });
        Int8Weights { n, k, k_padded, data, scales, col_sums }
    }

    pub fn panels(&self) -> usize {
        self.n.div_ceil(PANEL)
    }

    /// Bytes from one panel's start to the next.
    pub fn panel_stride(&self) -> usize {
        self.k_padded * PANEL
    }

    /// Bytes a pass over the weights reads (what bounds decode).
    pub fn bytes(&self) -> usize {
        self.data.len() + 4 * self.scales.len()
    }

    /// Row `row` dequantized (embedding look-ups of a tied lm_head).
    pub fn row(&self, row: usize) -> Vec<f32> {
        assert!(row < self.n);
        let (p, r) = (row / PANEL, row % PANEL);
        let base = p * self.panel_stride() + r * K_BLOCK;
        (0..self.k).map(|col| self.data[base + (col / K_BLOCK) * PANEL * K_BLOCK + col % K_BLOCK] as f32 * self.scales[row]).collect()
    }
}

/// Where a tile of an int8 GEMM reads and writes: rows from `row` of `x`, the panel `panel` of
/// `w`, and the output's top-left corner. Shared by the SIMD paths.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(crate) struct Int8Tile<'a> {
    pub x: &'a QuantizedRows,
    pub w: &'a Int8Weights,
    pub row: usize,
    pub panel: usize,
    pub out: *mut f32,
    pub ldo: usize,
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
impl Int8Tile<'_> {
    /// The 8 activations of block `b` of tile row `r`.
    #[inline(always)]
    pub unsafe fn x_block(&self, r: usize, b: usize) -> *const i8 {
        self.x.q.as_ptr().add((self.row + r) * self.x.k_padded + b * K_BLOCK)
    }

    /// Block `b` of the tile's first panel: 16 outputs x 8 inputs.
    #[inline(always)]
    pub unsafe fn w_block(&self, b: usize) -> *const i8 {
        self.w.data.as_ptr().add(self.panel * self.w.panel_stride() + b * PANEL * K_BLOCK)
    }

    /// The epilogue: scales tile row `r`'s 16 sums and stores the panel's valid columns.
    #[inline(always)]
    pub unsafe fn store(&self, r: usize, sums: &[i32; PANEL]) {
        let (i, first) = (self.row + r, self.panel * PANEL);
        let dst = self.out.add(i * self.ldo + first);
        for (c, s) in sums[..(self.w.n - first).min(PANEL)].iter().enumerate() {
            *dst.add(c) = *s as f32 * self.x.scales[i] * self.w.scales[first + c];
        }
    }
}

/// Activation rows quantized per row: `[m][k_padded]` int8 (padding zero) and `m` scales.
#[derive(Default)]
pub struct QuantizedRows {
    pub m: usize,
    pub k_padded: usize,
    pub q: Vec<i8>,
    pub scales: Vec<f32>,
}

impl QuantizedRows {
    /// Room for `m` rows of `k` values (padded), contents unspecified.
    pub fn resize(&mut self, m: usize, k: usize) {
        self.m = m;
        self.k_padded = k.next_multiple_of(K_BLOCK);
        self.q.resize(m * self.k_padded, 0);
        self.scales.resize(m, 0.0);
    }

    /// Quantizes `x` (`[m, k]`) in place of what `self` held, reusing its memory.
    pub fn quantize(&mut self, x: &[f32], k: usize) {
        let m = x.len() / k;
        assert_eq!(x.len(), m * k, "quantize: x must be [m, {k}]");
        self.resize(m, k);
        for ((row, q), scale) in x.chunks_exact(k).zip(self.q.chunks_exact_mut(self.k_padded)).zip(&mut self.scales) {
            *scale = quantize_row(row, q);
        }
    }

    pub fn row(&self, i: usize) -> &[i8] {
        &self.q[i * self.k_padded..(i + 1) * self.k_padded]
    }
}

/// Quantizes one row into `q` (at least as long; the rest is zeroed) and returns its scale.
pub fn quantize_row(row: &[f32], q: &mut [i8]) -> f32 {
    let scale = symmetric_scale(row);
    q.iter_mut().zip(row).for_each(|(q, &v)| *q = quantize_value(v, scale));
    q[row.len()..].fill(0);
    scale
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantize_round_trips_within_half_a_step() {
        let (n, k) = (19, 13);
        let w: Vec<f32> = (0..n * k).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.01).collect();
        let q = Int8Weights::quantize(&w, n, k);
        for r in 0..n {
            let step = symmetric_scale(&w[r * k..(r + 1) * k]);
            for (a, b) in q.row(r).iter().zip(&w[r * k..(r + 1) * k]) {
                assert!((a - b).abs() <= step / 2.0 + 1e-7, "row {r}: {a} vs {b}");
            }
        }
        assert_eq!(q.col_sums[0], (0..k).map(|c| quantize_value(w[c], q.scales[0]) as i32).sum::<i32>());
    }

    #[test]
    fn zero_rows_quantize_to_zero() {
        let mut rows = QuantizedRows::default();
        rows.quantize(&[0.0; 10], 5);
        assert_eq!(rows.scales, vec![1.0, 1.0]);
        assert!(rows.q.iter().all(|&v| v == 0));
        assert_eq!(rows.row(1).len(), 8);
    }
}
