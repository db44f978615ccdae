//! The W4A8 scheme's data: 4-bit weights in blocks of [`QBLOCK`] inputs, each block of each
//! output with its own f16 scale and either the fixed offset 8 (`value = d * (q - 8)`, GGUF's
//! Q4_0) or its own f16 minimum (`value = d * q + m`, Q4_1 and the K-quants' sub-blocks), or
//! MXFP4's e2m1 codes with an e8m0 scale (see [`Int4Offset::Mxfp4`]); and activations quantized
//! to int8 per block of [`QBLOCK`] values of a row (one scale each) right before each GEMM, as
//! llama.cpp quantizes them for its 4-bit dot products.
//!
//! Layout: an `[n, k]` matrix is cut into panels of [`PANEL`] outputs; a panel is a run of
//! records, one per input block: [`NIBBLE_BYTES`] of quants, 16 f16 scales (MXFP4: 16 e8m0
//! bytes), then with minimums 16 f16 minimums. One record per block keeps decode's reads at one
//! stream per panel.
//! The quants are four 64-byte chunks; in chunk `c`, byte `4 * o + i` holds output `o`'s input
//! `4c + i` in its low nibble and input `16 + 4c + i` in its high one. That is GGUF's own order
//! of a block's values (byte `j` holds values `j` and `j + 16`), so packing a GGUF block moves
//! bytes and never splits them, and a chunk's low (or high) nibbles are 16 outputs by 4
//! consecutive inputs: the operand of one `vpdpbusd`, of four `SDOT`s by element, of two
//! `vpmaddubsw`.
//!
//! Every path computes the same bits: the integer sums are exact and the float steps fixed.
//! Per block, with `s = Σ q_w q_x` (q_w in 0..=15), `dx` the activation block's scale and
//! `tx = (Σ q_x) as f32 * dx` (computed once, when the activations are quantized), each
//! output's `acc` (from 0) takes `acc = fma(m, tx, fma(s as f32, d * dx, acc))`, where the
//! offset 8 is the minimum `m = -8 d` (exact). One form for all keeps the kernels' per-row
//! work to a conversion, a multiply and two FMAs with operands broadcast from memory.
//!
//! MXFP4 runs the same sums on levels looked up from its codes in registers ([`E2M1_LEVELS`]:
//! `2 * value + 12`, 0..=24, unsigned like the other quants) with `d = 2^(e - 128)` exactly from
//! the block's e8m0 byte `e` ([`e8m0_half`]) and `m = -12 d`: the weights stay at 4 bits plus
//! one byte of scale per block, as the checkpoint stores them.

use crate::int8::round_to_i8;
use crate::memory::Frozen;
use crate::packed::{f16_to_f32, f32_to_f16, PANEL};
use crate::pool::{SendPtr, ThreadPool};

/// Inputs per quantization block, of weights and of activations.
pub const QBLOCK: usize = 32;
/// Bytes of one record's quants: a panel's 16 outputs x 32 four-bit values.
pub const NIBBLE_BYTES: usize = PANEL * QBLOCK / 2;
/// Bytes of a record's 16 f16 scales (and of its minimums).
const HALVES_BYTES: usize = PANEL * 2;

/// What a block's quants are offset by (and so what they and its scale mean).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Int4Offset {
    /// `value = d * (q - 8)`.
    Eight,
    /// `value = d * q + m`, with `m` stored per block.
    Min,
    /// MXFP4 (OCP microscaling): `q` an e2m1 code, `value = d * (E2M1_LEVELS[q] - 12)` with
    /// `d = e8m0_half(e)` of the block's e8m0 byte `e` (scale `2^(e - 127)`). Exact for every
    /// `e` up to 251 (scale 2^124); past that `24 d` overflows f32, as would the values.
    Mxfp4,
}

impl Int4Offset {
    /// The offset as the kernels' tiles take it, a const generic.
    pub const fn id(self) -> u8 {
        self as u8
    }

    /// The integer the kernels multiply for quant `q`.
    #[inline(always)]
    pub fn level(self, q: u8) -> u8 {
        match self {
            Int4Offset::Mxfp4 => E2M1_LEVELS[q as usize],
            Int4Offset::Eight | Int4Offset::Min => q,
        }
    }
}

/// MXFP4's e2m1 codes (bit 3 the sign, then 0, 0.5, 1, 1.5, 2, 3, 4, 6) as the integers the
/// kernels multiply: twice the value (an integer) plus 12, so every level is an unsigned byte
/// and the integer dot products of the other offsets take it unchanged.
pub const E2M1_LEVELS: [u8; 16] = [12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0];

/// Half the scale of an e8m0 byte, `2^(e - 128)` (the levels are twice the values), exactly:
/// `e << 23` is `2^(e - 127)` as f32 bits from `e = 1` on, the bits of `2^-127` stand in for
/// `e = 0`, and halving is exact (the two smallest are subnormal). 255, OCP's NaN, gives
/// infinity. Every SIMD path computes it in these steps.
#[inline(always)]
pub fn e8m0_half(e: u8) -> f32 {
    f32::from_bits(((e as u32) << 23).max(E8M0_SMALLEST_BITS)) * 0.5
}

/// The f32 bits of `2^-127`, e8m0's smallest scale (see [`e8m0_half`]).
pub const E8M0_SMALLEST_BITS: u32 = 0x0040_0000;

/// One output row's blocks as a checkpoint stores them: per block 16 bytes of nibbles in
/// GGUF's order, an f16 scale (with [`Int4Offset::Mxfp4`] the e8m0 byte) and (with
/// [`Int4Offset::Min`]) an f16 minimum.
pub struct Int4Row {
    pub nibbles: Vec<u8>,
    pub scales: Vec<u16>,
    pub mins: Vec<u16>,
}

impl Int4Row {
    pub fn new(k: usize) -> Int4Row {
        let blocks = k / QBLOCK;
        Int4Row { nibbles: vec![0; blocks * QBLOCK / 2], scales: vec![0; blocks], mins: vec![0; blocks] }
    }

    /// Quantizes `row` block by block, as llama.cpp's reference quantizers of Q4_0 (the value
    /// of largest magnitude maps to -8), Q4_1 (the block's range over 0..=15) and MXFP4 (the
    /// scale `2^(floor(log2(amax)) - 2)`, each value to its nearest code) do.
    pub fn quantize(&mut self, row: &[f32], offset: Int4Offset) {
        for (b, values) in row.chunks_exact(QBLOCK).enumerate() {
            // The stored scale and minimum (f16 bits; MXFP4: the e8m0 byte and none) and quants.
            let (scale, min, q): (u16, u16, [u8; QBLOCK]) = match offset {
                Int4Offset::Eight => {
                    let extreme = values.iter().fold(0f32, |e, &v| if v.abs() > e.abs() { v } else { e });
                    let d = extreme / -8.0;
                    let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
                    (f32_to_f16(d), 0, std::array::from_fn(|j| ((values[j] * inv + 8.5) as i32).clamp(0, 15) as u8))
                }
                Int4Offset::Min => {
                    let lo = values.iter().copied().fold(f32::INFINITY, f32::min);
                    let hi = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let d = (hi - lo) / 15.0;
                    let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
                    (f32_to_f16(d), f32_to_f16(lo), std::array::from_fn(|j| (((values[j] - lo) * inv + 0.5) as i32).clamp(0, 15) as u8))
                }
                Int4Offset::Mxfp4 => {
                    let amax = values.iter().fold(0f32, |a, v| a.max(v.abs()));
                    let e = if amax > 0.0 { (amax.log2().floor() as i32 - 2 + 127).clamp(0, 254) as u8 } else { 0 };
                    let d = e8m0_half(e);
                    let nearest = |v: f32| (0..16u8).min_by(|&a, &b| level_distance(a, d, v).total_cmp(&level_distance(b, d, v))).expect("16 codes");
                    (e as u16, 0, std::array::from_fn(|j| nearest(values[j])))
                }
            };
            self.scales[b] = scale;
            self.mins[b] = min;
            for j in 0..QBLOCK / 2 {
                self.nibbles[b * QBLOCK / 2 + j] = q[j] | (q[j + 16] << 4);
            }
        }
    }
}

/// How far e2m1 code `q` at half scale `d` lies from `v` (the first of equals wins, as in
/// llama.cpp's search).
fn level_distance(q: u8, d: f32, v: f32) -> f32 {
    ((E2M1_LEVELS[q as usize] as f32 - 12.0) * d - v).abs()
}

pub struct Int4Weights {
    /// Output rows.
    pub n: usize,
    /// Inner dimension, a multiple of [`QBLOCK`].
    pub k: usize,
    pub offset: Int4Offset,
    /// `[panel][block]` records (rows past `n` in the last panel are zero).
    pub data: Frozen<u8>,
}

impl Int4Weights {
    /// Quantizes a row-major `[n, k]` float matrix (tests, and 16-bit checkpoints quantized at load).
    pub fn quantize(w: &[f32], n: usize, k: usize, offset: Int4Offset) -> Int4Weights {
        assert_eq!(w.len(), n * k, "quantize: weights must be [n, k]");
        Self::pack_rows(n, k, offset, &ThreadPool::new(1, false), &|row, out| out.quantize(&w[row * k..(row + 1) * k], offset))
    }

    /// Packs an `[n, k]` matrix whose rows `read_row(row, out)` writes, panel by panel on the
    /// threads of `pool`.
    pub fn pack_rows(n: usize, k: usize, offset: Int4Offset, pool: &ThreadPool, read_row: &(dyn Fn(usize, &mut Int4Row) + Sync)) -> Int4Weights {
        assert!(k.is_multiple_of(QBLOCK), "4-bit weights need whole blocks of {QBLOCK} inputs, not {k}");
        let layout = Int4Weights { n, k, offset, data: Frozen::from_slice(&[]) };
        let (stride, record) = (layout.panel_stride(), layout.record_bytes());
        let panels = layout.panels();
        let data = Frozen::filled(panels * stride, |out: &mut [u8]| {
            let dst = SendPtr(out.as_mut_ptr());
            pool.for_ranges(panels, &|panels| {
                let mut row = Int4Row::new(k);
                for p in panels {
                    // SAFETY: panel `p` owns its `stride` bytes.
                    let packed = unsafe { std::slice::from_raw_parts_mut(dst.get().add(p * stride), stride) };
                    for o in 0..PANEL.min(n - p * PANEL) {
                        read_row(p * PANEL + o, &mut row);
                        for (b, rec) in packed.chunks_exact_mut(record).enumerate() {
                            let nibbles = &row.nibbles[b * QBLOCK / 2..][..QBLOCK / 2];
                            for (c, four) in nibbles.chunks_exact(4).enumerate() {
                                rec[c * 64 + 4 * o..][..4].copy_from_slice(four);
                            }
                            match offset {
                                Int4Offset::Mxfp4 => rec[NIBBLE_BYTES + o] = row.scales[b] as u8,
                                _ => rec[NIBBLE_BYTES + 2 * o..][..2].copy_from_slice(&row.scales[b].to_le_bytes()),
                            }
                            if offset == Int4Offset::Min {
                                rec[NIBBLE_BYTES + HALVES_BYTES + 2 * o..][..2].copy_from_slice(&row.mins[b].to_le_bytes());
                            }
                        }
                    }
                }
            });
        });
        Int4Weights { data, ..layout }
    }

    pub fn blocks(&self) -> usize {
        self.k / QBLOCK
    }

    pub fn panels(&self) -> usize {
        self.n.div_ceil(PANEL)
    }

    /// Bytes of one block's record.
    pub fn record_bytes(&self) -> usize {
        NIBBLE_BYTES
            + match self.offset {
                Int4Offset::Eight => HALVES_BYTES,
                Int4Offset::Min => 2 * HALVES_BYTES,
                Int4Offset::Mxfp4 => PANEL,
            }
    }

    /// Bytes from one panel's start to the next.
    pub fn panel_stride(&self) -> usize {
        self.blocks() * self.record_bytes()
    }

    /// Bytes a pass over the weights reads (what bounds decode).
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Block `b` of panel `p`: its record.
    #[inline(always)]
    pub fn record(&self, p: usize, b: usize) -> *const u8 {
        // SAFETY (of callers' reads): records lie inside `data` for p < panels, b < blocks.
        unsafe { self.data.as_ptr().add(p * self.panel_stride() + b * self.record_bytes()) }
    }

    /// Output `o`'s (scale, minimum) of a record (with the offset 8, the minimum is `-8 d`;
    /// with MXFP4 `d` is half the e8m0 scale and the minimum `-12 d`).
    pub fn scale_min(&self, rec: &[u8], o: usize) -> (f32, f32) {
        let half = |at: usize| f16_to_f32(u16::from_le_bytes([rec[at], rec[at + 1]]));
        match self.offset {
            Int4Offset::Eight => {
                let d = half(NIBBLE_BYTES + 2 * o);
                (d, d * -8.0)
            }
            Int4Offset::Min => (half(NIBBLE_BYTES + 2 * o), half(NIBBLE_BYTES + HALVES_BYTES + 2 * o)),
            Int4Offset::Mxfp4 => {
                let d = e8m0_half(rec[NIBBLE_BYTES + o]);
                (d, d * -12.0)
            }
        }
    }

    /// Output `o`'s level of input `j` (< 32) in a record: the integer the kernels multiply.
    pub fn level(&self, rec: &[u8], o: usize, j: usize) -> u8 {
        self.offset.level(Self::quant(rec, o, j))
    }

    /// Output `o`'s quant of input `j` (< 32) in a record.
    pub fn quant(rec: &[u8], o: usize, j: usize) -> u8 {
        let byte = rec[(j % 16 / 4) * 64 + 4 * o + j % 4];
        if j < 16 {
            byte & 0x0f
        } else {
            byte >> 4
        }
    }

    /// Row `row` dequantized (embedding look-ups of a tied lm_head).
    pub fn row(&self, row: usize) -> Vec<f32> {
        assert!(row < self.n);
        let (p, o) = (row / PANEL, row % PANEL);
        let record = self.record_bytes();
        let panel = &self.data[p * self.panel_stride()..][..self.panel_stride()];
        panel
            .chunks_exact(record)
            .flat_map(|rec| {
                let (d, m) = self.scale_min(rec, o);
                (0..QBLOCK).map(move |j| self.level(rec, o, j) as f32 * d + m)
            })
            .collect()
    }
}

/// One block's step of an output's sum (the scheme's float epilogue, which every path keeps):
/// `s` the block's integer dot product, `dx` the activations' scale and `tx` their scaled sum,
/// `d` and `m` the weights' scale and minimum (`-8 d` with the offset 8, `-12 d` with MXFP4).
#[inline(always)]
pub fn accumulate_block(acc: f32, s: i32, dx: f32, tx: f32, d: f32, m: f32) -> f32 {
    m.mul_add(tx, (s as f32).mul_add(d * dx, acc))
}

/// Where a tile of a block-quantized GEMM reads and writes: rows from `row` of `x`, panels
/// from `panel` of `w` (4-bit or 8-bit blocks). Shared by the SIMD paths, which add their
/// loads and stores of a tile's outputs.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(crate) struct BlockTile<'a, W> {
    pub x: &'a QuantizedBlocks,
    pub w: &'a W,
    pub row: usize,
    pub panel: usize,
    pub out: *mut f32,
    pub ldo: usize,
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
impl<W> BlockTile<'_, W> {
    /// Row `r`'s activations of block `b`, the block's scale and its halves' quant sums.
    #[inline(always)]
    pub fn x_block(&self, r: usize, b: usize) -> (*const i8, f32, [i32; 2]) {
        self.x.block(self.row + r, b)
    }
}

/// Activation rows quantized per block of [`QBLOCK`]: `[m][k]` int8; per row and block the
/// scale and the sum of the quants times the scale; per row and half block (16 values) the sum
/// of the quants (the 8-bit weight blocks have a scale per half).
#[derive(Default)]
pub struct QuantizedBlocks {
    pub m: usize,
    pub k: usize,
    pub q: Vec<i8>,
    pub scales: Vec<f32>,
    pub scaled_sums: Vec<f32>,
    pub half_sums: Vec<i32>,
}

impl QuantizedBlocks {
    /// Quantizes `x` (`[m, k]`, `k` whole blocks) in place of what `self` held, on the threads
    /// of `pool` (a prefill's activations are megabytes).
    pub fn quantize(&mut self, x: &[f32], k: usize, pool: &ThreadPool) {
        self.quantize_rows(x, k, false, pool);
    }

    /// Quantizes `x` as [`quantize`](Self::quantize) into rows `0..m`, and what that rounding
    /// left out (each value minus its quant times its scale) into rows `m..2m`: the two rows'
    /// products with the same weights add up to about 16-bit activations (the residual's scale
    /// is at most 1/254 of the value's).
    pub fn quantize_with_residuals(&mut self, x: &[f32], k: usize, pool: &ThreadPool) {
        self.quantize_rows(x, k, true, pool);
    }

    fn quantize_rows(&mut self, x: &[f32], k: usize, residuals: bool, pool: &ThreadPool) {
        assert!(k.is_multiple_of(QBLOCK) && x.len().is_multiple_of(k), "quantize: x must be [m, {k}] with whole blocks");
        let m = x.len() / k;
        let rows = if residuals { 2 * m } else { m };
        self.m = rows;
        self.k = k;
        self.q.resize(rows * k, 0);
        self.scales.resize(rows * k / QBLOCK, 0.0);
        self.scaled_sums.resize(rows * k / QBLOCK, 0.0);
        self.half_sums.resize(2 * rows * k / QBLOCK, 0);
        let blocks = k / QBLOCK;
        let (values_q, residual_q) = self.q.split_at_mut(m * k);
        let residual_q = SendPtr(residual_q.as_mut_ptr());
        let (scales, scaled, sums) = (SendPtr(self.scales.as_mut_ptr()), SendPtr(self.scaled_sums.as_mut_ptr()), SendPtr(self.half_sums.as_mut_ptr()));
        pool.for_chunks_mut(values_q, k, &|i, q| {
            // SAFETY: row `i` owns its `blocks` scales and scaled sums and `2 * blocks` sums,
            // and with residuals row `m + i`'s quants and the same of its blocks.
            let write = |at: usize, (scale, [first, second]): (f32, [i32; 2])| unsafe {
                *scales.get().add(at) = scale;
                *sums.get().add(2 * at) = first;
                *sums.get().add(2 * at + 1) = second;
                *scaled.get().add(at) = (first + second) as f32 * scale;
            };
            for (b, (values, q)) in x[i * k..(i + 1) * k].chunks_exact(QBLOCK).zip(q.chunks_exact_mut(QBLOCK)).enumerate() {
                let block = quantize_block(values, q);
                write(i * blocks + b, block);
                if residuals {
                    let mut rest = [0f32; QBLOCK];
                    rest.iter_mut().zip(values.iter().zip(q.iter())).for_each(|(r, (&v, &q))| *r = v - q as f32 * block.0);
                    // SAFETY: as above, row `m + i`'s block `b`.
                    let rest_q = unsafe { std::slice::from_raw_parts_mut(residual_q.get().add(i * k + b * QBLOCK), QBLOCK) };
                    write((m + i) * blocks + b, quantize_block(&rest, rest_q));
                }
            }
        });
    }

    pub fn blocks(&self) -> usize {
        self.k / QBLOCK
    }

    /// Row `i`'s block `b`: its quants, its scale, and the sums of its two halves' quants.
    #[inline(always)]
    pub fn block(&self, i: usize, b: usize) -> (*const i8, f32, [i32; 2]) {
        // One check for the four reads: per-slice bounds checks cost the 8-bit tiles' inner
        // loops a third of their instructions.
        assert!(i < self.m && b < self.blocks(), "block {b} of row {i} of a [{}, {}] batch", self.m, self.k);
        let at = i * self.blocks() + b;
        // SAFETY: `quantize` sized the arrays to m rows of `blocks()` blocks.
        unsafe {
            let sums = self.half_sums.as_ptr().add(2 * at);
            (self.q.as_ptr().add(i * self.k + b * QBLOCK), *self.scales.get_unchecked(at), [*sums, *sums.add(1)])
        }
    }

    /// Row `i`'s block `b`: its quants, and pointers to its scale and its scaled sum (for SIMD
    /// operands broadcast from memory).
    #[inline(always)]
    pub fn block_scales(&self, i: usize, b: usize) -> (*const i8, *const f32, *const f32) {
        let at = i * self.blocks() + b;
        // SAFETY (of callers' reads): `at` is inside both arrays for i < m, b < blocks.
        unsafe { (self.q.as_ptr().add(i * self.k + b * QBLOCK), self.scales.as_ptr().add(at), self.scaled_sums.as_ptr().add(at)) }
    }
}

/// Quantizes one block of activations into `q`: its scale and the sums of its halves' quants.
fn quantize_block(values: &[f32], q: &mut [i8]) -> (f32, [i32; 2]) {
    // Eight lanes of maxima, so the compiler keeps them in vector registers.
    let mut lanes = [0f32; 8];
    for eight in values.chunks_exact(8) {
        lanes.iter_mut().zip(eight).for_each(|(m, v)| *m = m.max(v.abs()));
    }
    let max = lanes.iter().fold(0f32, |m, &v| m.max(v));
    let scale = if max > 0.0 { max / 127.0 } else { 1.0 };
    // A multiply by the inverse, as llama.cpp quantizes its activations, not a divide.
    let inverse = 1.0 / scale;
    q.iter_mut().zip(values).for_each(|(q, &v)| *q = round_to_i8(v * inverse));
    let half = |h: usize| q[h * QBLOCK / 2..(h + 1) * QBLOCK / 2].iter().map(|&v| v as i32).sum::<i32>();
    (scale, [half(0), half(1)])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| ((i as f32 + seed) * 0.731).sin()).collect()
    }

    #[test]
    fn rows_dequantize_within_their_steps() {
        let (n, k) = (19, 64);
        let w = values(n * k, 2.0);
        for offset in [Int4Offset::Eight, Int4Offset::Min, Int4Offset::Mxfp4] {
            let q = Int4Weights::quantize(&w, n, k, offset);
            for r in 0..n {
                for (b, (got, want)) in q.row(r).chunks(QBLOCK).zip(w[r * k..(r + 1) * k].chunks(QBLOCK)).enumerate() {
                    let amax = want.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let (lo, hi) = want.iter().fold((f32::MAX, f32::MIN), |(l, h), &v| (l.min(v), h.max(v)));
                    // Q4_0 maps the extreme to -8, so the other side's end can be a whole step
                    // off (its +8 does not exist); Q4_1 rounds to the nearest of 16 levels;
                    // MXFP4's scale s is at most amax / 4 and its largest values clip at 6 s
                    // (amax < 8 s), its widest gap (4 s to 6 s) rounds within s.
                    let tol = match offset {
                        Int4Offset::Eight => amax / 8.0,
                        Int4Offset::Min => (hi - lo) / 15.0 * 0.5,
                        Int4Offset::Mxfp4 => amax / 2.0,
                    } * 1.01
                        + 1e-3;
                    for (g, v) in got.iter().zip(want) {
                        assert!((g - v).abs() <= tol, "{offset:?} row {r} block {b}: {g} vs {v}");
                    }
                }
            }
        }
    }

    #[test]
    fn packed_quants_keep_ggufs_value_order() {
        let mut row = Int4Row::new(32);
        row.nibbles = (0..16u8).map(|j| (15 - j) << 4 | j).collect();
        row.scales = vec![f32_to_f16(1.0)];
        let w = Int4Weights::pack_rows(3, 32, Int4Offset::Eight, &ThreadPool::new(1, false), &|_, out| {
            out.nibbles.copy_from_slice(&row.nibbles);
            out.scales.copy_from_slice(&row.scales);
        });
        let want: Vec<f32> = (0..32).map(|j| if j < 16 { j as f32 - 8.0 } else { (31 - j) as f32 - 8.0 }).collect();
        assert_eq!(w.row(2), want);
    }

    #[test]
    fn e8m0_scales_are_exact_powers_of_two() {
        for e in 0..=254u8 {
            assert_eq!(e8m0_half(e), 2f64.powi(e as i32 - 128) as f32, "e8m0 {e}");
        }
        assert_eq!(e8m0_half(255), f32::INFINITY);
    }

    /// MXFP4 rows keep their codes and e8m0 bytes and dequantize to code value times scale,
    /// over the whole e8m0 range.
    #[test]
    fn mxfp4_rows_dequantize_to_their_code_values() {
        const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        let exponents = [0u8, 1, 2, 100, 127, 131, 200, 251];
        let w = Int4Weights::pack_rows(17, 64, Int4Offset::Mxfp4, &ThreadPool::new(1, false), &|row, out| {
            for b in 0..2 {
                out.scales[b] = exponents[(row + b) % exponents.len()] as u16;
                for j in 0..16 {
                    out.nibbles[b * 16 + j] = ((row + j + b) % 16) as u8 | (((row * 3 + j) % 16) as u8) << 4;
                }
            }
        });
        for row in 0..17 {
            let got = w.row(row);
            for (i, got) in got.iter().enumerate() {
                let (b, j) = (i / QBLOCK, i % QBLOCK);
                let code = if j < 16 { (row + j + b) % 16 } else { (row * 3 + j - 16) % 16 };
                let value = E2M1[code % 8] * if code >= 8 { -1.0 } else { 1.0 };
                let scale = 2f64.powi(exponents[(row + b) % exponents.len()] as i32 - 127);
                assert_eq!(*got as f64, value as f64 * scale, "row {row} value {i}");
            }
        }
    }

    #[test]
    fn activation_blocks_have_their_own_scales() {
        let mut x: Vec<f32> = values(64, 1.0);
        x[40] = 100.0;
        let mut rows = QuantizedBlocks::default();
        rows.quantize(&x, 64, &ThreadPool::new(1, false));
        assert_eq!(rows.scales.len(), 2);
        assert!(rows.scales[0] < 1.0 / 100.0 && rows.scales[1] == 100.0 / 127.0);
        assert_eq!(rows.half_sums[1], rows.q[16..32].iter().map(|&v| v as i32).sum::<i32>());
    }

    #[test]
    fn residual_rows_hold_what_the_first_rounding_left_out() {
        let (m, k) = (3, 64);
        let x: Vec<f32> = values(m * k, 3.0).iter().map(|v| v * 7.0).collect();
        let pool = ThreadPool::new(2, false);
        let (mut once, mut twice) = (QuantizedBlocks::default(), QuantizedBlocks::default());
        once.quantize(&x, k, &pool);
        twice.quantize_with_residuals(&x, k, &pool);
        assert_eq!(twice.m, 2 * m);
        assert_eq!((&twice.q[..m * k], &twice.scales[..m * 2]), (&once.q[..], &once.scales[..]));
        for i in 0..m {
            for b in 0..2 {
                let ((value_q, value_scale, _), (rest_q, rest_scale, rest_sums)) = (twice.block(i, b), twice.block(m + i, b));
                assert!(rest_scale <= value_scale / 254.0 * 1.001, "row {i} block {b}: residual step {rest_scale} vs {value_scale}");
                // SAFETY: `block` points at QBLOCK quants of each row.
                let (value_q, rest_q) = unsafe { (std::slice::from_raw_parts(value_q, QBLOCK), std::slice::from_raw_parts(rest_q, QBLOCK)) };
                assert_eq!(rest_sums[0], rest_q[..QBLOCK / 2].iter().map(|&v| v as i32).sum::<i32>());
                for j in 0..QBLOCK {
                    let got = value_q[j] as f32 * value_scale + rest_q[j] as f32 * rest_scale;
                    assert!((got - x[i * k + b * QBLOCK + j]).abs() <= rest_scale * 0.51, "row {i} value {j}");
                }
            }
        }
    }
}
