//! Weights pre-packed at load into the panel layout the GEMM kernels stream.
//!
//! A `[n, k]` weight matrix (one row per output) is cut into panels of [`PANEL`] output rows.
//! Inside a panel the 16 values of each `k` sit next to each other, so a kernel loads one vector
//! per `k` and broadcasts the activation: every output is then a sequential sum over `k` whatever
//! the number of activation rows, which keeps results batch-invariant.
//!
//! - `F32`, `F16`: `[panel][k][16]`.
//! - `BF16`: `[panel][k / 2][16][2]` (`k` padded to even with zeros): each output's two
//!   consecutive `k` share a 32-bit lane, the layout of AVX-512 `vdpbf16ps`, Arm `BFDOT` and the
//!   shift/mask widening used elsewhere.

use crate::memory::{Frozen, Zeroable};
use crate::pool::{SendPtr, ThreadPool};

/// Output rows per panel: one AVX-512 vector of f32, two AVX2 vectors, four NEON vectors.
pub const PANEL: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightDtype {
    F32,
    BF16,
    F16,
}

impl WeightDtype {
    pub fn bytes(self) -> usize {
        match self {
            WeightDtype::F32 => 4,
            WeightDtype::BF16 | WeightDtype::F16 => 2,
        }
    }
}

pub enum PackedData {
    F32(Frozen<f32>),
    /// bf16 or f16 bit patterns.
    Half(Frozen<u16>),
}

pub struct PackedWeights {
    pub dtype: WeightDtype,
    /// Output rows.
    pub n: usize,
    /// Inner (input) dimension.
    pub k: usize,
    pub data: PackedData,
}

impl PackedWeights {
    /// Packs a row-major `[n, k]` matrix.
    pub fn pack(w: &[f32], n: usize, k: usize, dtype: WeightDtype) -> PackedWeights {
        assert_eq!(w.len(), n * k, "pack: weights must be [n, k]");
        Self::pack_rows(n, k, dtype, &ThreadPool::new(1, false), &|row, out| out.copy_from_slice(&w[row * k..(row + 1) * k]))
    }

    /// Packs an `[n, k]` matrix whose rows `read_row(row, out)` writes (e.g. dequantized straight
    /// from a mapped checkpoint), panel by panel on the threads of `pool`: no copy of the whole
    /// matrix is ever made in float32.
    pub fn pack_rows(n: usize, k: usize, dtype: WeightDtype, pool: &ThreadPool, read_row: &(dyn Fn(usize, &mut [f32]) + Sync)) -> PackedWeights {
        let mut packed = PackedWeights { dtype, n, k, data: PackedData::F32(Frozen::from_slice(&[])) };
        let (panels, stride) = (packed.panels(), packed.panel_stride());
        let rows = PanelRows { n, k, panels, stride, pool, read_row };
        packed.data = match dtype {
            WeightDtype::F32 => PackedData::F32(rows.pack(|panel, dst| interleave(panel, k, dst, |v| v))),
            WeightDtype::F16 => PackedData::Half(rows.pack(|panel, dst| {
                let mut halves = vec![0u16; panel.len()];
                f32_to_f16_slice(panel, &mut halves);
                interleave(&halves, k, dst, |h| h);
            })),
            WeightDtype::BF16 => PackedData::Half(rows.pack(|panel, dst| {
                let mut halves = vec![0u16; panel.len()];
                halves.iter_mut().zip(panel).for_each(|(h, &v)| *h = f32_to_bf16(v));
                interleave_pairs(&halves, k, dst);
            })),
        };
        packed
    }

    pub fn panels(&self) -> usize {
        self.n.div_ceil(PANEL)
    }

    /// Elements (f32 or u16) from one panel's start to the next.
    pub fn panel_stride(&self) -> usize {
        match self.dtype {
            WeightDtype::BF16 => self.k.div_ceil(2) * 2 * PANEL,
            _ => self.k * PANEL,
        }
    }

    /// Bytes a pass over the weights reads (what bounds decode).
    pub fn bytes(&self) -> usize {
        self.panels() * self.panel_stride() * self.dtype.bytes()
    }

    /// Row `row` of the original matrix, widened to f32 (embedding look-ups of a tied lm_head).
    pub fn row(&self, row: usize) -> Vec<f32> {
        assert!(row < self.n);
        let (p, r) = (row / PANEL, row % PANEL);
        let base = p * self.panel_stride();
        (0..self.k)
            .map(|col| match (&self.data, self.dtype) {
                (PackedData::F32(d), _) => d[base + col * PANEL + r],
                (PackedData::Half(d), WeightDtype::F16) => f16_to_f32(d[base + col * PANEL + r]),
                (PackedData::Half(d), _) => bf16_to_f32(d[base + (col / 2) * 2 * PANEL + 2 * r + col % 2]),
            })
            .collect()
    }

    pub fn f32_data(&self) -> &[f32] {
        match &self.data {
            PackedData::F32(d) => d,
            PackedData::Half(_) => panic!("{:?} weights hold 16-bit data", self.dtype),
        }
    }

    pub fn half_data(&self) -> &[u16] {
        match &self.data {
            PackedData::Half(d) => d,
            PackedData::F32(_) => panic!("f32 weights hold no 16-bit data"),
        }
    }
}

/// A matrix read by rows, packed a panel of [`PANEL`] rows at a time.
struct PanelRows<'a> {
    n: usize,
    k: usize,
    panels: usize,
    /// Packed elements per panel.
    stride: usize,
    pool: &'a ThreadPool,
    read_row: &'a (dyn Fn(usize, &mut [f32]) + Sync),
}

impl PanelRows<'_> {
    /// `write(rows, dst)` lays out each panel's `[PANEL][k]` rows (zero past `n`) in its part of
    /// the packed array; panels are shared out over the pool.
    fn pack<T: Zeroable>(&self, write: impl Fn(&[f32], &mut [T]) + Sync) -> Frozen<T> {
        let (n, k, stride) = (self.n, self.k, self.stride);
        Frozen::filled(self.panels * stride, |out: &mut [T]| {
            let dst = SendPtr(out.as_mut_ptr());
            self.pool.for_ranges(self.panels, &|panels| {
                let mut rows = vec![0.0f32; PANEL * k];
                for p in panels {
                    let live = PANEL.min(n - p * PANEL);
                    rows[live * k..].fill(0.0);
                    for (r, row) in rows.chunks_exact_mut(k.max(1)).take(live).enumerate() {
                        (self.read_row)(p * PANEL + r, row);
                    }
                    // SAFETY: panel `p` owns elements `p * stride..(p + 1) * stride` of `out`.
                    write(&rows, unsafe { std::slice::from_raw_parts_mut(dst.get().add(p * stride), stride) });
                }
            });
        })
    }
}

/// `[PANEL][k]` rows to the `[k][PANEL]` panel layout.
fn interleave<S: Copy, T>(panel: &[S], k: usize, dst: &mut [T], convert: impl Fn(S) -> T) {
    for (col, out) in dst.chunks_exact_mut(PANEL).enumerate() {
        for (r, o) in out.iter_mut().enumerate() {
            *o = convert(panel[r * k + col]);
        }
    }
}

/// `[PANEL][k]` bf16 rows to the `[k / 2][PANEL][2]` panel layout (odd `k` padded with zero).
fn interleave_pairs(panel: &[u16], k: usize, dst: &mut [u16]) {
    for (r, row) in panel.chunks_exact(k.max(1)).enumerate() {
        for (pair, values) in row.chunks(2).enumerate() {
            let at = (pair * PANEL + r) * 2;
            dst[at] = values[0];
            dst[at + 1] = values.get(1).copied().unwrap_or(0);
        }
    }
}

/// [`f32_to_f16`] over a slice (`dst` at least as long), with the CPU's conversion where it has one.
pub fn f32_to_f16_slice(src: &[f32], dst: &mut [u16]) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("f16c") && is_x86_feature_detected!("avx") {
        // SAFETY: the features were just detected.
        return unsafe { crate::x86_64::convert::f32_to_f16_f16c(src, dst) };
    }
    dst.iter_mut().zip(src).for_each(|(d, &s)| *d = f32_to_f16(s));
}

/// [`f16_to_f32`] over little-endian halves (2 bytes each, as files store them), with the CPU's
/// conversion where it has one.
pub fn f16_bytes_to_f32(src: &[u8], dst: &mut [f32]) {
    assert_eq!(src.len(), 2 * dst.len(), "f16_bytes_to_f32: 2 bytes per value");
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("f16c") && is_x86_feature_detected!("avx") {
        // SAFETY: the features were just detected; the lengths were checked.
        return unsafe { crate::x86_64::convert::f16_bytes_to_f32_f16c(src, dst) };
    }
    dst.iter_mut().zip(src.chunks_exact(2)).for_each(|(d, s)| *d = f16_to_f32(u16::from_le_bytes([s[0], s[1]])));
}

/// Round to nearest even, as hardware conversions do; NaN stays NaN. Branch-free, so loops
/// over it vectorize.
pub fn f32_to_bf16(v: f32) -> u16 {
    let bits = v.to_bits();
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16;
    let quiet_nan = (bits >> 16) | 0x40;
    (if v.is_nan() { quiet_nan } else { rounded }) as u16
}

pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// IEEE binary16, round to nearest even, with subnormals, overflow to infinity and NaN.
pub fn f32_to_f16(v: f32) -> u16 {
    let bits = v.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let man = bits & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        // Subnormal: shift the implicit bit in, then round the dropped bits to nearest even.
        let full = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = full >> shift;
        let rest = full & ((1 << shift) - 1);
        let midpoint = 1 << (shift - 1);
        let round_up = rest > midpoint || (rest == midpoint && half & 1 == 1);
        return sign | (half + round_up as u32) as u16;
    }
    let half = ((e as u32) << 10) | (man >> 13);
    let rest = man & 0x1fff;
    let round_up = rest > 0x1000 || (rest == 0x1000 && half & 1 == 1);
    // A carry out of the mantissa correctly bumps the exponent (up to infinity).
    sign | (half + round_up as u32) as u16
}

pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, _) => {
            // Subnormal: normalize into an f32 exponent.
            let shift = man.leading_zeros() - 21;
            sign | ((127 - 15 + 1 - shift) << 23) | (((man << shift) & 0x3ff) << 13)
        }
        (0x1f, _) => sign | 0x7f80_0000 | (man << 13),
        _ => sign | ((exp + 127 - 15) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

/// Activation rows rounded to bf16 pairs, `[m][k / 2][2]` (odd `k` padded with zero), for
/// kernels that multiply in bf16 (`vdpbf16ps`, `BFDOT`).
pub fn activations_to_bf16(x: &[f32], k: usize, out: &mut Vec<u16>) {
    out.clear();
    out.resize(x.len() / k * k.div_ceil(2) * 2, 0);
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512bw") {
        // SAFETY: the features were just detected.
        return unsafe { rows_to_bf16_avx512(x, k, out) };
    }
    rows_to_bf16(x, k, out);
}

/// [`activations_to_bf16`]'s conversion into `out`, sized and zeroed: written through slices,
/// not pushed, so it vectorizes (integer steps only: the same bits at any vector width).
#[inline(always)]
fn rows_to_bf16(x: &[f32], k: usize, out: &mut [u16]) {
    for (row, dst) in x.chunks_exact(k).zip(out.chunks_exact_mut(k.div_ceil(2) * 2)) {
        dst.iter_mut().zip(row).for_each(|(h, &v)| *h = f32_to_bf16(v));
    }
}

/// [`rows_to_bf16`] compiled for AVX-512, 16 values at a time: a prefill converts every GEMM's
/// input, a vision tower's attention a million scores per head.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn rows_to_bf16_avx512(x: &[f32], k: usize, out: &mut [u16]) {
    rows_to_bf16(x, k, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn bf16_activations_are_the_same_bits_at_every_vector_width() {
        if !is_x86_feature_detected!("avx512bw") {
            return;
        }
        let specials = [0.0, -0.0, 1e-40, -3e-39, f32::MIN_POSITIVE, f32::MAX, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1.0039062, 1.0117188];
        for k in [1, 7, 33, 77] {
            let x: Vec<f32> = (0..5 * k).map(|i| if i % 4 == 0 { specials[i % specials.len()] } else { (i as f32 * 0.7311).sin() * 1e3 }).collect();
            let (mut portable, mut wide) = (vec![0; 5 * k.div_ceil(2) * 2], vec![0; 5 * k.div_ceil(2) * 2]);
            rows_to_bf16(&x, k, &mut portable);
            // SAFETY: detected above.
            unsafe { rows_to_bf16_avx512(&x, k, &mut wide) };
            assert_eq!(portable, wide, "k = {k}");
        }
    }

    #[test]
    fn f16_round_trips_every_half() {
        for h in 0..=u16::MAX {
            let v = f16_to_f32(h);
            if v.is_nan() {
                assert!(f16_to_f32(f32_to_f16(v)).is_nan());
            } else {
                assert_eq!(f32_to_f16(v), h, "half {h:#06x} -> {v}");
            }
        }
    }

    #[test]
    fn f16_slices_convert_as_values_do() {
        // Odd lengths, ties, subnormals, overflow, infinities and NaN.
        let mut values: Vec<f32> = (0..37).map(|i| (i as f32 - 18.0) * 0.3371).collect();
        values.extend([1.0 + 1.0 / 2048.0, 1.0 + 3.0 / 2048.0, 65520.0, -1e-7, 3e-5, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e-8]);
        for len in [0, 1, 7, 8, 9, values.len()] {
            let mut got = vec![0; len];
            f32_to_f16_slice(&values[..len], &mut got);
            let want: Vec<u16> = values[..len].iter().map(|&v| f32_to_f16(v)).collect();
            assert_eq!(got, want, "length {len}");
        }
    }

    #[test]
    fn f16_bytes_widen_as_values_do() {
        // Every half, then odd lengths.
        let all: Vec<u16> = (0..=u16::MAX).collect();
        let bytes: Vec<u8> = all.iter().flat_map(|h| h.to_le_bytes()).collect();
        let mut got = vec![0.0; all.len()];
        f16_bytes_to_f32(&bytes, &mut got);
        for (&h, &v) in all.iter().zip(&got) {
            assert!(v.to_bits() == f16_to_f32(h).to_bits() || (v.is_nan() && f16_to_f32(h).is_nan()), "half {h:#06x}");
        }
        for len in [1, 7, 9, 17] {
            let mut got = vec![0.0; len];
            f16_bytes_to_f32(&bytes[1000..1000 + 2 * len], &mut got);
            assert_eq!(got, (500..500 + len as u16).map(f16_to_f32).collect::<Vec<_>>());
        }
    }

    #[test]
    fn f16_rounds_to_nearest_even() {
        assert_eq!(f32_to_f16(1.0 + 1.0 / 2048.0), 0x3c00); // tie, even stays
        assert_eq!(f32_to_f16(1.0 + 3.0 / 2048.0), 0x3c02); // tie, odd rounds up
        assert_eq!(f32_to_f16(65520.0), 0x7c00); // rounds past the largest half
        assert_eq!(f32_to_f16(1e-8), 0);
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
    }

    #[test]
    fn packing_on_several_threads_equals_packing_on_one() {
        let pool = ThreadPool::new(3, false);
        for (n, k) in [(1, 1), (17, 7), (50, 33), (16, 64)] {
            let w: Vec<f32> = (0..n * k).map(|i| ((i * 7919) % 1000) as f32 / 250.0 - 2.0).collect();
            let read_row = |row: usize, out: &mut [f32]| out.copy_from_slice(&w[row * k..(row + 1) * k]);
            for dtype in [WeightDtype::F32, WeightDtype::BF16, WeightDtype::F16] {
                let (one, many) = (PackedWeights::pack(&w, n, k, dtype), PackedWeights::pack_rows(n, k, dtype, &pool, &read_row));
                match (&one.data, &many.data) {
                    (PackedData::F32(a), PackedData::F32(b)) => assert_eq!(&a[..], &b[..], "{dtype:?} {n}x{k}"),
                    (PackedData::Half(a), PackedData::Half(b)) => assert_eq!(&a[..], &b[..], "{dtype:?} {n}x{k}"),
                    _ => panic!("{dtype:?}: packed as different types"),
                }
            }
            let quantize = |row: usize, q: &mut [i8]| crate::int8::quantize_weight_row(&w[row * k..(row + 1) * k], q);
            let (one, many) = (crate::Int8Weights::quantize(&w, n, k), crate::Int8Weights::pack_rows(n, k, &pool, &quantize));
            assert_eq!((&one.data[..], &one.scales, &one.col_sums), (&many.data[..], &many.scales, &many.col_sums), "int8 {n}x{k}");
        }
    }

    #[test]
    fn rows_come_back_from_every_layout() {
        let (n, k) = (19, 7);
        let w: Vec<f32> = (0..n * k).map(|i| i as f32 * 0.25).collect();
        for dtype in [WeightDtype::F32, WeightDtype::BF16, WeightDtype::F16] {
            let p = PackedWeights::pack(&w, n, k, dtype);
            for r in [0, 5, 16, 18] {
                assert_eq!(p.row(r), &w[r * k..(r + 1) * k], "{dtype:?} row {r}");
            }
        }
    }
}
