//! int8 GEMMs for W8A8 on x86_64 (layout and epilogue in [`crate::int8`]).
//!
//! - AVX-512 VNNI: `vpdpbusd` multiplies unsigned by signed bytes, so activations are offset by
//!   128 (a sign-bit flip) and `128 * sum(w)`, precomputed at pack time, is taken off at the end.
//!   A tile is up to 6 rows by one panel (decode: 1 row by 4 panels, 2 by 2): each row keeps two
//!   registers of (output, half-block) partial sums per panel for even blocks and two for odd
//!   ones, folded into 16 outputs once per tile.
//! - AVX2: `vpmaddubsw` with the sign trick (|x| times w carrying x's sign): the pairs it adds in
//!   16 bits stay within 2 * 127 * 127, where an offset activation (up to 255) would saturate.
//!   Up to 2 rows per tile, 4 registers of partial sums each.
//!
//! The sums are exact integers, so results match the portable twin bit for bit.

use crate::int8::{Int8Tile, Int8Weights, QuantizedRows, K_BLOCK};
use crate::packed::PANEL;
use crate::portable::gemm::for_each_tile;
use std::arch::x86_64::*;
use std::ops::Range;

type Tile<'a> = Int8Tile<'a>;

/// A block's 8 activations as one 64-bit lane, to broadcast.
#[inline(always)]
unsafe fn x_lane(t: &Tile, r: usize, b: usize) -> i64 {
    (t.x_block(r, b) as *const i64).read_unaligned()
}

/// Adds block `b` of `R` rows by `NP` panels into `acc`.
#[inline(always)]
unsafe fn vnni_block<const R: usize, const NP: usize>(t: &Tile, b: usize, acc: &mut [[[__m512i; 2]; NP]; R]) {
    let w: [[__m512i; 2]; NP] = std::array::from_fn(|p| {
        let wp = t.w_block(b).add(p * t.w.panel_stride());
        [_mm512_loadu_si512(wp as *const _), _mm512_loadu_si512(wp.add(64) as *const _)]
    });
    for (r, row) in acc.iter_mut().enumerate() {
        let xu = _mm512_xor_si512(_mm512_set1_epi64(x_lane(t, r, b)), _mm512_set1_epi8(-128));
        for (a, wp) in row.iter_mut().zip(&w) {
            a[0] = _mm512_dpbusd_epi32(a[0], xu, wp[0]);
            a[1] = _mm512_dpbusd_epi32(a[1], xu, wp[1]);
        }
    }
}

/// `R` rows by `NP` panels; even and odd blocks go to two sets of accumulators, so a short tile
/// (decode) still has independent `vpdpbusd` chains to overlap. Integer sums do not care about
/// the order.
#[inline(always)]
unsafe fn tile_vnni<const R: usize, const NP: usize>(t: &Tile) {
    let zero = [[[_mm512_setzero_si512(); 2]; NP]; R];
    let (mut even_blocks, mut odd_blocks) = (zero, zero);
    let blocks = t.w.k_padded / K_BLOCK;
    for b in (0..blocks - blocks % 2).step_by(2) {
        vnni_block(t, b, &mut even_blocks);
        vnni_block(t, b + 1, &mut odd_blocks);
    }
    if blocks % 2 == 1 {
        vnni_block(t, blocks - 1, &mut even_blocks);
    }
    // Lanes hold (output, first half) and (output, second half) in turn: add neighbours.
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    for p in 0..NP {
        let first = (t.panel + p) * PANEL;
        let offset = _mm512_slli_epi32::<7>(_mm512_loadu_si512(t.w.col_sums.as_ptr().add(first) as *const _));
        let w_scales = _mm512_loadu_ps(t.w.scales.as_ptr().add(first));
        let valid = ((1u32 << (t.w.n - first).min(PANEL)) - 1) as u16;
        for r in 0..R {
            let lo = _mm512_add_epi32(even_blocks[r][p][0], odd_blocks[r][p][0]);
            let hi = _mm512_add_epi32(even_blocks[r][p][1], odd_blocks[r][p][1]);
            let pairs = _mm512_add_epi32(_mm512_permutex2var_epi32(lo, even, hi), _mm512_permutex2var_epi32(lo, odd, hi));
            let sums = _mm512_cvtepi32_ps(_mm512_sub_epi32(pairs, offset));
            // (sum * x_scale) * w_scale, the epilogue's order.
            let i = t.row + r;
            let values = _mm512_mul_ps(_mm512_mul_ps(sums, _mm512_set1_ps(t.x.scales[i])), w_scales);
            _mm512_mask_storeu_ps(t.out.add(i * t.ldo + first), valid, values);
        }
    }
}

#[inline(always)]
unsafe fn tile_avx2<const R: usize>(t: &Tile) {
    let mut acc = [[_mm256_setzero_si256(); 4]; R];
    let ones = _mm256_set1_epi16(1);
    for b in 0..t.w.k_padded / K_BLOCK {
        let wp = t.w_block(b);
        let w: [__m256i; 4] = std::array::from_fn(|q| _mm256_loadu_si256(wp.add(32 * q) as *const __m256i));
        for (r, a) in acc.iter_mut().enumerate() {
            let x = _mm256_set1_epi64x(x_lane(t, r, b));
            let x_abs = _mm256_abs_epi8(x);
            for (aq, wq) in a.iter_mut().zip(&w) {
                let pairs = _mm256_maddubs_epi16(x_abs, _mm256_sign_epi8(*wq, x));
                *aq = _mm256_add_epi32(*aq, _mm256_madd_epi16(pairs, ones));
            }
        }
    }
    for (r, a) in acc.iter().enumerate() {
        // hadd gives outputs [0 1 4 5 | 2 3 6 7] of two registers; the permute puts them in order.
        let lo = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_hadd_epi32(a[0], a[1]));
        let hi = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_hadd_epi32(a[2], a[3]));
        let mut out = [0i32; PANEL];
        _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, lo);
        _mm256_storeu_si256(out.as_mut_ptr().add(8) as *mut __m256i, hi);
        t.store(r, &out);
    }
}

macro_rules! by_rows {
    ($rows:expr, $f:ident, $t:expr, [$($r:literal)*]) => {
        match $rows {
            $($r => $f::<$r>($t),)*
            rows => unreachable!("no tile of {rows} rows"),
        }
    };
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn gemm_vnni(x: &QuantizedRows, w: &Int8Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    // Decode-sized batches take several panels per tile, for more weight streams in flight.
    let (max_rows, panels_per_tile) = match x.m {
        1 => (1, 4),
        2 => (2, 2),
        _ => (6, 1),
    };
    for_each_tile(x.m, panels, max_rows, panels_per_tile, |row, rows, panel, np| {
        let t = Int8Tile { x, w, row, panel, out, ldo };
        match (rows, np) {
            (1, 4) => tile_vnni::<1, 4>(&t),
            (1, 3) => tile_vnni::<1, 3>(&t),
            (1, 2) => tile_vnni::<1, 2>(&t),
            (2, 2) => tile_vnni::<2, 2>(&t),
            (1, _) => tile_vnni::<1, 1>(&t),
            (2, _) => tile_vnni::<2, 1>(&t),
            (3, _) => tile_vnni::<3, 1>(&t),
            (4, _) => tile_vnni::<4, 1>(&t),
            (5, _) => tile_vnni::<5, 1>(&t),
            (6, _) => tile_vnni::<6, 1>(&t),
            _ => unreachable!("no tile of {rows} rows"),
        }
    });
}

#[target_feature(enable = "avx2")]
unsafe fn gemm_avx2(x: &QuantizedRows, w: &Int8Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    for_each_tile(x.m, panels, 2, 1, |row, rows, panel, _| {
        let t = Int8Tile { x, w, row, panel, out, ldo };
        by_rows!(rows, tile_avx2, &t, [1 2])
    });
}

pub fn vnni_detected() -> bool {
    is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") && is_x86_feature_detected!("avx512vnni")
}

/// # Safety
/// As [`crate::portable::int8::gemm_i8`]; only handed out after [`vnni_detected`].
pub unsafe fn gemm_i8_vnni(x: &QuantizedRows, w: &Int8Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    gemm_vnni(x, w, panels, out, ldo)
}

/// # Safety
/// As [`crate::portable::int8::gemm_i8`]; only handed out after detecting avx2.
pub unsafe fn gemm_i8_avx2(x: &QuantizedRows, w: &Int8Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    gemm_avx2(x, w, panels, out, ldo)
}
