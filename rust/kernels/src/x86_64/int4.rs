//! W4A8 GEMMs on x86_64 (layout and epilogue in [`crate::int4`]). The 4-bit quants are
//! unsigned (0..=15) and the activations signed, exactly the operand types of `vpdpbusd` and
//! `vpmaddubsw`: no offset trick is needed, the weights' offset is applied per block in floats.
//!
//! - AVX-512 VNNI: a chunk's low and high nibbles are two registers of 16 outputs x 4 inputs;
//!   each takes one `vpdpbusd` with the 4 activations broadcast, 8 per block, in two chains.
//!   Tiles of up to 4 rows by one panel; decode takes 1 row by up to 4 panels.
//! - AVX2 (+ FMA, F16C): the same chunks in halves of 8 outputs; `vpmaddubsw` products (at most
//!   2 x 15 x 127 per 16-bit lane, 8 groups summing to under 2^15) add in 16 bits, one
//!   `vpmaddwd` per block widens them. Tiles of up to 2 rows by one panel, decode 1 by 2.
//!
//! Each block's sums go through the scheme's float steps, so results match the portable twin
//! bit for bit.

use crate::int4::{Int4Offset, Int4Weights, QuantizedBlocks, NIBBLE_BYTES, QBLOCK};
use crate::packed::PANEL;
use crate::portable::gemm::for_each_tile;
use std::arch::x86_64::*;
use std::ops::Range;

/// Where a tile reads and writes: rows from `row` of `x`, panels from `panel` of `w`.
struct Tile<'a> {
    x: &'a QuantizedBlocks,
    w: &'a Int4Weights,
    row: usize,
    panel: usize,
    out: *mut f32,
    ldo: usize,
}

impl Tile<'_> {
    /// Row `r`'s activations of block `b`, and the block's scale and quant sum.
    #[inline(always)]
    unsafe fn x_block(&self, r: usize, b: usize) -> (*const i8, f32, i32) {
        let i = (self.row + r) * self.x.blocks() + b;
        (self.x.q.as_ptr().add((self.row + r) * self.x.k + b * QBLOCK), self.x.scales[i], self.x.sums[i])
    }

    /// The activations' group `g` (inputs 4g..4g + 4) as one 32-bit lane.
    #[inline(always)]
    unsafe fn group(x: *const i8, g: usize) -> i32 {
        (x.add(4 * g) as *const i32).read_unaligned()
    }
}

/// The scheme's float step on 16 outputs: `s` sums, `t` the activation quants' sum.
#[inline(always)]
unsafe fn accumulate16(offset: Int4Offset, acc: __m512, s: __m512i, t: i32, dx: f32, d: __m512, m: __m512) -> __m512 {
    let ddx = _mm512_mul_ps(d, _mm512_set1_ps(dx));
    match offset {
        Int4Offset::Eight => _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(s, _mm512_set1_epi32(8 * t))), ddx, acc),
        Int4Offset::Min => _mm512_fmadd_ps(m, _mm512_set1_ps(t as f32 * dx), _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), ddx, acc)),
    }
}

/// As [`accumulate16`] on 8 outputs.
#[inline(always)]
unsafe fn accumulate8(offset: Int4Offset, acc: __m256, s: __m256i, t: i32, dx: f32, d: __m256, m: __m256) -> __m256 {
    let ddx = _mm256_mul_ps(d, _mm256_set1_ps(dx));
    match offset {
        Int4Offset::Eight => _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(s, _mm256_set1_epi32(8 * t))), ddx, acc),
        Int4Offset::Min => _mm256_fmadd_ps(m, _mm256_set1_ps(t as f32 * dx), _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), ddx, acc)),
    }
}

#[inline(always)]
unsafe fn tile_vnni<const R: usize, const NP: usize>(t: &Tile) {
    let (offset, nibble) = (t.w.offset, _mm512_set1_epi8(0x0f));
    let mut acc = [[_mm512_setzero_ps(); NP]; R];
    for b in 0..t.w.blocks() {
        for p in 0..NP {
            let rec = t.w.record(t.panel + p, b);
            // Groups 0..4 in the low nibbles of the chunks, 4..8 in the high ones.
            let mut w = [_mm512_setzero_si512(); 8];
            for c in 0..4 {
                let v = _mm512_loadu_si512(rec.add(64 * c) as *const _);
                w[c] = _mm512_and_si512(v, nibble);
                w[c + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nibble);
            }
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(rec.add(NIBBLE_BYTES) as *const _));
            let m = match offset {
                Int4Offset::Min => _mm512_cvtph_ps(_mm256_loadu_si256(rec.add(NIBBLE_BYTES + 2 * PANEL) as *const _)),
                Int4Offset::Eight => _mm512_setzero_ps(),
            };
            for (r, acc) in acc.iter_mut().enumerate() {
                let (x, dx, sum) = t.x_block(r, b);
                let (mut low, mut high) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                for g in 0..4 {
                    low = _mm512_dpbusd_epi32(low, w[g], _mm512_set1_epi32(Tile::group(x, g)));
                    high = _mm512_dpbusd_epi32(high, w[g + 4], _mm512_set1_epi32(Tile::group(x, g + 4)));
                }
                acc[p] = accumulate16(offset, acc[p], _mm512_add_epi32(low, high), sum, dx, d, m);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (p, a) in acc.iter().enumerate() {
            let first = (t.panel + p) * PANEL;
            let valid = ((1u32 << (t.w.n - first).min(PANEL)) - 1) as u16;
            _mm512_mask_storeu_ps(t.out.add((t.row + r) * t.ldo + first), valid, *a);
        }
    }
}

#[inline(always)]
unsafe fn tile_avx2<const R: usize, const NP: usize>(t: &Tile) {
    let (offset, nibble, ones) = (t.w.offset, _mm256_set1_epi8(0x0f), _mm256_set1_epi16(1));
    let mut acc = [[[_mm256_setzero_ps(); 2]; NP]; R];
    for b in 0..t.w.blocks() {
        for p in 0..NP {
            let rec = t.w.record(t.panel + p, b);
            for half in 0..2 {
                let mut w = [_mm256_setzero_si256(); 8];
                for c in 0..4 {
                    let v = _mm256_loadu_si256(rec.add(64 * c + 32 * half) as *const _);
                    w[c] = _mm256_and_si256(v, nibble);
                    w[c + 4] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), nibble);
                }
                let halves = |at: usize| _mm256_cvtph_ps(_mm_loadu_si128(rec.add(at + 16 * half) as *const _));
                let d = halves(NIBBLE_BYTES);
                let m = match offset {
                    Int4Offset::Min => halves(NIBBLE_BYTES + 2 * PANEL),
                    Int4Offset::Eight => _mm256_setzero_ps(),
                };
                for (r, acc) in acc.iter_mut().enumerate() {
                    let (x, dx, sum) = t.x_block(r, b);
                    let product = |g: usize| _mm256_maddubs_epi16(w[g], _mm256_set1_epi32(Tile::group(x, g)));
                    let (mut even, mut odd) = (product(0), product(1));
                    for g in (2..8).step_by(2) {
                        even = _mm256_add_epi16(even, product(g));
                        odd = _mm256_add_epi16(odd, product(g + 1));
                    }
                    let s = _mm256_madd_epi16(_mm256_add_epi16(even, odd), ones);
                    acc[p][half] = accumulate8(offset, acc[p][half], s, sum, dx, d, m);
                }
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (p, halves) in acc.iter().enumerate() {
            let first = (t.panel + p) * PANEL;
            let mut values = [0f32; PANEL];
            _mm256_storeu_ps(values.as_mut_ptr(), halves[0]);
            _mm256_storeu_ps(values.as_mut_ptr().add(8), halves[1]);
            let dst = t.out.add((t.row + r) * t.ldo + first);
            for (c, v) in values[..(t.w.n - first).min(PANEL)].iter().enumerate() {
                *dst.add(c) = *v;
            }
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn gemm_vnni(x: &QuantizedBlocks, w: &Int4Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    let (max_rows, panels_per_tile) = if x.m == 1 { (1, 4) } else { (4, 1) };
    for_each_tile(x.m, panels, max_rows, panels_per_tile, |row, rows, panel, np| {
        by_tile_shape!(rows, np, tile_vnni, (&Tile { x, w, row, panel, out, ldo }), [(3, 1)(4, 1)])
    });
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gemm_avx2(x: &QuantizedBlocks, w: &Int4Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    let panels_per_tile = if x.m == 1 { 2 } else { 1 };
    for_each_tile(x.m, panels, 2, panels_per_tile, |row, rows, panel, np| by_tile_shape!(rows, np, tile_avx2, (&Tile { x, w, row, panel, out, ldo }), []));
}

/// # Safety
/// As [`crate::portable::gemm_q4::gemm_q4`]; only handed out after detecting VNNI.
pub unsafe fn gemm_q4_vnni(x: &QuantizedBlocks, w: &Int4Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    gemm_vnni(x, w, panels, out, ldo)
}

/// # Safety
/// As above, after detecting avx2, fma and f16c.
pub unsafe fn gemm_q4_avx2(x: &QuantizedBlocks, w: &Int4Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    gemm_avx2(x, w, panels, out, ldo)
}
