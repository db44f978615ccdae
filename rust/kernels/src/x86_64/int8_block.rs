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

// Decode takes a tile's panels whole, a batch one half at a time.
#[inline(always)]
unsafe fn tile_avx2<const R: usize, const NP: usize, const UNUSED: bool>(t: &Tile<Int8BlockWeights>, blocks: Range<usize>) {
    if R == 1 {
        decode_avx2::<NP>(t, blocks);
    } else {
        for half in 0..2 {
            half_avx2::<R, NP>(t, blocks.clone(), half);
        }
    }
}

/// One row by all of `NP` panels: each group of the row's activations is broadcast (and its
/// magnitudes taken) once for every panel and half, which share it. The float steps are the
/// batched tile's, in its order.
// Panels and halves index the accumulators, the records and the masks in lockstep.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn decode_avx2<const NP: usize>(t: &Tile<Int8BlockWeights>, blocks: Range<usize>) {
    let (offset, ones) = (_mm256_set1_epi8(t.w.offset as i8), _mm256_set1_epi16(1));
    let masks: [[__m256i; 2]; NP] = std::array::from_fn(|p| std::array::from_fn(|h| t.half_mask(p, h, t.w.n)));
    let mut acc: [[__m256; 2]; NP] = std::array::from_fn(|p| std::array::from_fn(|h| t.load8(0, p, h, masks[p][h], blocks.start == 0)));
    for b in blocks {
        let (x, dx, _) = t.x_block(0, b);
        let records: [*const u8; NP] = std::array::from_fn(|p| t.w.record(t.panel + p, b));
        for rec in records {
            prefetch_ahead(rec, RECORD_BYTES);
        }
        // The record's two scales per output: inputs 0..16 (groups 0..4), then 16..32.
        for k in 0..2 {
            let mut sums = [[_mm256_setzero_si256(); 2]; NP];
            for g in 4 * k..4 * k + 4 {
                let xg = _mm256_set1_epi32(group(x, g));
                let magnitudes = _mm256_abs_epi8(xg);
                for p in 0..NP {
                    for h in 0..2 {
                        let w = _mm256_sub_epi8(_mm256_loadu_si256(records[p].add(64 * g + 32 * h) as *const _), offset);
                        let pairs = _mm256_maddubs_epi16(magnitudes, _mm256_sign_epi8(w, xg));
                        sums[p][h] = _mm256_add_epi32(sums[p][h], _mm256_madd_epi16(pairs, ones));
                    }
                }
            }
            for p in 0..NP {
                for h in 0..2 {
                    let d = _mm256_cvtph_ps(_mm_loadu_si128(records[p].add(QUANT_BYTES + 32 * k + 16 * h) as *const _));
                    acc[p][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[p][h]), _mm256_mul_ps(d, _mm256_set1_ps(dx)), acc[p][h]);
                }
            }
        }
    }
    for p in 0..NP {
        for h in 0..2 {
            t.store8(0, p, h, masks[p][h], acc[p][h]);
        }
    }
}

/// `R` rows by half `half` of `NP` panels.
// Panels index the accumulator tile, the records and the masks in lockstep.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn half_avx2<const R: usize, const NP: usize>(t: &Tile<Int8BlockWeights>, blocks: Range<usize>, half: usize) {
    let (offset, ones) = (_mm256_set1_epi8(t.w.offset as i8), _mm256_set1_epi16(1));
    let masks: [__m256i; NP] = std::array::from_fn(|p| t.half_mask(p, half, t.w.n));
    let mut acc: [[__m256; NP]; R] = std::array::from_fn(|r| std::array::from_fn(|p| t.load8(r, p, half, masks[p], blocks.start == 0)));
    for b in blocks {
        let x: [(*const i8, f32); R] = std::array::from_fn(|r| {
            let (x, dx, _) = t.x_block(r, b);
            (x, dx)
        });
        for p in 0..NP {
            let rec = t.w.record(t.panel + p, b);
            if half == 0 {
                prefetch_ahead(rec, RECORD_BYTES);
            }
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
                    acc[r][p] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[r]), _mm256_mul_ps(d, _mm256_set1_ps(x[r].1)), acc[r][p]);
                });
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (p, values) in acc.iter().enumerate() {
            t.store8(r, p, half, masks[p], *values);
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
