//! 8-bit block GEMMs on x86_64 (layout and epilogue in [`crate::int8_block`]).
//!
//! - AVX-512 VNNI: the stored quants are unsigned (`w + offset`), `vpdpbusd`'s unsigned operand:
//!   4 per half block, then `offset x Σ q_x` of the half (summed when activations are
//!   quantized) comes off. Tiles as the 4-bit GEMM's.
//! - AVX2: the offset comes off the quants first (|w| <= 127), and `vpmaddubsw` takes |x| with
//!   w carrying x's sign; each group's 16-bit pairs widen with `vpmaddwd` before they add.
//!
//! Integer sums are exact and the float steps fixed: results match the portable twin bit for bit.

use super::int4::{block_tiles, chunk_blocks, group, prefetch_ahead, vnni_tiles, Tile};
use crate::int4::QuantizedBlocks;
use crate::int8_block::{Int8BlockWeights, QUANT_BYTES, RECORD_BYTES};
use crate::portable::gemm::{for_each_row, for_each_tile_in_chunks};
use std::arch::x86_64::*;
use std::ops::Range;

// Panels and weight groups index the accumulator tile, the records and the activations in lockstep.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn tile_vnni<const R: usize, const NP: usize, const UNUSED: bool>(t: &Tile<Int8BlockWeights>, blocks: Range<usize>) {
    let offset = t.w.offset as i32;
    let mut acc: [[__m512; NP]; R] = std::array::from_fn(|r| std::array::from_fn(|p| t.load16(r, p, t.w.n, blocks.start == 0)));
    for b in blocks {
        for p in 0..NP {
            let rec = t.w.record(t.panel + p, b);
            prefetch_ahead(rec, RECORD_BYTES);
            let w: [__m512i; 8] = std::array::from_fn(|g| _mm512_loadu_si512(rec.add(64 * g) as *const _));
            let d: [__m512; 2] = std::array::from_fn(|h| _mm512_cvtph_ps(_mm256_loadu_si256(rec.add(QUANT_BYTES + 32 * h) as *const _)));
            for_each_row!(R, |r| {
                let (x, dx, sums) = t.x_block(r, b);
                for h in 0..2 {
                    // The quants' offset comes off first: integer sums, so the order is free.
                    let mut s = _mm512_set1_epi32(-offset * sums[h]);
                    for g in 4 * h..4 * h + 4 {
                        s = _mm512_dpbusd_epi32(s, w[g], _mm512_set1_epi32(group(x, g)));
                    }
                    acc[r][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(d[h], _mm512_set1_ps(dx)), acc[r][p]);
                }
            });
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (p, a) in acc.iter().enumerate() {
            t.store16(r, p, t.w.n, *a);
        }
    }
}

// As the 4-bit AVX2 tile: decode takes both halves of its panels per block, a batch one half
// at a time.
#[inline(always)]
unsafe fn tile_avx2<const R: usize, const NP: usize, const UNUSED: bool>(t: &Tile<Int8BlockWeights>, blocks: Range<usize>) {
    if R == 1 {
        halves_avx2::<R, NP, 2>(t, blocks, 0);
    } else {
        for half in 0..2 {
            halves_avx2::<R, NP, 1>(t, blocks.clone(), half);
        }
    }
}

/// `R` rows by halves `first_half..first_half + H` of `NP` panels.
// Panels and halves index the accumulator tile, the records and the masks in lockstep.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn halves_avx2<const R: usize, const NP: usize, const H: usize>(t: &Tile<Int8BlockWeights>, blocks: Range<usize>, first_half: usize) {
    let (offset, ones) = (_mm256_set1_epi8(t.w.offset as i8), _mm256_set1_epi16(1));
    let masks: [[__m256i; H]; NP] = std::array::from_fn(|p| std::array::from_fn(|h| t.half_mask(p, first_half + h, t.w.n)));
    let mut acc: [[[__m256; H]; NP]; R] =
        std::array::from_fn(|r| std::array::from_fn(|p| std::array::from_fn(|h| t.load8(r, p, first_half + h, masks[p][h], blocks.start == 0))));
    for b in blocks {
        let x: [(*const i8, f32); R] = std::array::from_fn(|r| {
            let (x, dx, _) = t.x_block(r, b);
            (x, dx)
        });
        for p in 0..NP {
            let rec = t.w.record(t.panel + p, b);
            if first_half == 0 {
                prefetch_ahead(rec, RECORD_BYTES);
            }
            for h in 0..H {
                let half = first_half + h;
                // The record's two scales per output: inputs 0..16 (groups 0..4), then 16..32.
                for k in 0..2 {
                    let mut sums = [_mm256_setzero_si256(); R];
                    for g in 4 * k..4 * k + 4 {
                        let w = _mm256_sub_epi8(_mm256_loadu_si256(rec.add(64 * g + 32 * half) as *const _), offset);
                        for_each_row!(R, |r| {
                            let xg = _mm256_set1_epi32(group(x[r].0, g));
                            let pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(xg), _mm256_sign_epi8(w, xg));
                            sums[r] = _mm256_add_epi32(sums[r], _mm256_madd_epi16(pairs, ones));
                        });
                    }
                    let d = _mm256_cvtph_ps(_mm_loadu_si128(rec.add(QUANT_BYTES + 32 * k + 16 * half) as *const _));
                    for_each_row!(R, |r| {
                        acc[r][p][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[r]), _mm256_mul_ps(d, _mm256_set1_ps(x[r].1)), acc[r][p][h]);
                    });
                }
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (p, halves) in acc.iter().enumerate() {
            for (h, values) in halves.iter().enumerate() {
                t.store8(r, p, first_half + h, masks[p][h], *values);
            }
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn gemm_vnni(x: &QuantizedBlocks, w: &Int8BlockWeights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    let (max_rows, panels_per_tile) = vnni_tiles(x.m);
    let tile = block_tiles!(tile_vnni, &Tile { x, w, row: 0, panel: 0, out, ldo }, false);
    for_each_tile_in_chunks(x.m, panels, max_rows, panels_per_tile, w.blocks(), chunk_blocks(w.blocks()), tile);
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gemm_avx2(x: &QuantizedBlocks, w: &Int8BlockWeights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    let panels_per_tile = if x.m == 1 { 2 } else { 1 };
    let tile = block_tiles!(tile_avx2, &Tile { x, w, row: 0, panel: 0, out, ldo }, false);
    for_each_tile_in_chunks(x.m, panels, 4, panels_per_tile, w.blocks(), chunk_blocks(w.blocks()), tile);
}

/// # Safety
/// As [`crate::portable::gemm_q8::gemm_q8`]; only handed out after detecting VNNI.
pub unsafe fn gemm_q8_vnni(x: &QuantizedBlocks, w: &Int8BlockWeights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    gemm_vnni(x, w, panels, out, ldo)
}

/// # Safety
/// As above, after detecting avx2, fma and f16c.
pub unsafe fn gemm_q8_avx2(x: &QuantizedBlocks, w: &Int8BlockWeights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    gemm_avx2(x, w, panels, out, ldo)
}
