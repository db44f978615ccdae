//! 8-bit block GEMMs on x86_64 (layout and epilogue in [`crate::int8_block`]), compiled once
//! per quant width; narrower quants are unpacked to bytes as they are loaded.
//!
//! - AVX-512 VNNI: the stored quants are unsigned (`w + offset`), `vpdpbusd`'s unsigned operand:
//!   4 per half block, then `offset x Σ q_x` of the half (summed when activations are
//!   quantized) comes off. Tiles as the 4-bit GEMM's.
//! - AVX2: 8-bit quants lose their offset first (|w| <= 127), and `vpmaddubsw` takes |x| with
//!   w carrying x's sign; narrower quants (at most 63: no pair of products saturates 16 bits)
//!   are `vpmaddubsw`'s unsigned operand as they are, and the offset's share comes off the sums
//!   as with VNNI. Each group's 16-bit pairs widen with `vpmaddwd` before they add.
//!
//! Integer sums are exact and the float steps fixed: results match the portable twin bit for bit.

use super::int4::{block_tiles, by_halves_avx2, chunk_blocks, group, prefetch_ahead, vnni_tiles, Tile};
use crate::int4::{Int4Offset, QuantizedBlocks};
use crate::int8_block::{by_quant_bits, quant_bytes, record_bytes, upper_fields, Int8BlockWeights, CHUNK_BYTES, NIBBLE_BYTES};
use crate::portable::gemm::{for_each_tile_in_chunks, unroll};
use std::arch::x86_64::*;
use std::ops::Range;

/// How far left (negative: right) field `g % fields` of an upper chunk's bytes moves to sit
/// at bits 4.. of its byte, and the mask that keeps it there. 16-bit shifts move it: the bits
/// that cross from the neighbouring byte land outside the mask.
#[inline(always)]
fn upper_shift<const BITS: u32>(g: usize) -> (i32, i8) {
    let width = BITS as i32 - 4;
    (4 - width * (g % upper_fields(BITS)) as i32, (((1 << width) - 1) << 4) as i8)
}

/// Bytes `at..at + 32` of 8-bit chunk `g` of a record's quants, unpacked.
#[inline(always)]
pub(super) unsafe fn quants_avx2<const BITS: u32>(rec: *const u8, g: usize, at: usize) -> __m256i {
    let load = |offset: usize| _mm256_loadu_si256(rec.add(offset + at) as *const _);
    if BITS == 8 {
        return load(CHUNK_BYTES * g);
    }
    let nibbles = load(CHUNK_BYTES * (g % 4));
    let low = _mm256_and_si256(if g < 4 { nibbles } else { _mm256_srli_epi16::<4>(nibbles) }, _mm256_set1_epi8(0x0f));
    let upper = load(NIBBLE_BYTES + CHUNK_BYTES * (g / upper_fields(BITS)));
    let (shift, mask) = upper_shift::<BITS>(g);
    let moved = if shift >= 0 { _mm256_sll_epi16(upper, _mm_cvtsi32_si128(shift)) } else { _mm256_srl_epi16(upper, _mm_cvtsi32_si128(-shift)) };
    _mm256_or_si256(low, _mm256_and_si256(moved, _mm256_set1_epi8(mask)))
}

/// Pairs of products of 32 unpacked quants `q` with the activations' group `xg` (`magnitudes`:
/// its absolute values), as the module doc says for each width.
#[inline(always)]
unsafe fn products<const BITS: u32>(q: __m256i, xg: __m256i, magnitudes: __m256i, offset: __m256i) -> __m256i {
    if BITS == 8 {
        _mm256_maddubs_epi16(magnitudes, _mm256_sign_epi8(_mm256_sub_epi8(q, offset), xg))
    } else {
        _mm256_maddubs_epi16(q, xg)
    }
}

/// Where a half block's sum starts: zero for 8-bit quants (their offset is off already), else
/// minus the offset times the half's activation sum `x_sum`.
#[inline(always)]
unsafe fn offset_share<const BITS: u32>(offset: u8, x_sum: i32) -> __m256i {
    _mm256_set1_epi32(if BITS == 8 { 0 } else { -(offset as i32) * x_sum })
}

/// 8-bit chunk `g` of a record's quants, unpacked.
#[inline(always)]
pub(super) unsafe fn quants_avx512<const BITS: u32>(rec: *const u8, g: usize) -> __m512i {
    let load = |offset: usize| _mm512_loadu_si512(rec.add(offset) as *const _);
    if BITS == 8 {
        return load(CHUNK_BYTES * g);
    }
    let nibbles = load(CHUNK_BYTES * (g % 4));
    let low = _mm512_and_si512(if g < 4 { nibbles } else { _mm512_srli_epi16::<4>(nibbles) }, _mm512_set1_epi8(0x0f));
    let upper = load(NIBBLE_BYTES + CHUNK_BYTES * (g / upper_fields(BITS)));
    let (shift, mask) = upper_shift::<BITS>(g);
    let moved = if shift >= 0 { _mm512_sll_epi16(upper, _mm_cvtsi32_si128(shift)) } else { _mm512_srl_epi16(upper, _mm_cvtsi32_si128(-shift)) };
    _mm512_or_si512(low, _mm512_and_si512(moved, _mm512_set1_epi8(mask)))
}

// Panels and weight groups index the accumulator tile, the records and the activations in lockstep.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn tile_vnni<const R: usize, const NP: usize, const UNUSED: u8, const BITS: u32>(t: &Tile<Int8BlockWeights>, blocks: Range<usize>) {
    let offset = t.w.offset() as i32;
    let mut acc: [[__m512; NP]; R] = std::array::from_fn(|r| std::array::from_fn(|p| t.load16(r, p, t.w.n, blocks.start == 0)));
    for b in blocks {
        for p in 0..NP {
            let rec = t.w.record(t.panel + p, b);
            prefetch_ahead(rec, record_bytes(BITS));
            let w: [__m512i; 8] = std::array::from_fn(|g| quants_avx512::<BITS>(rec, g));
            let d: [__m512; 2] = std::array::from_fn(|h| _mm512_cvtph_ps(_mm256_loadu_si256(rec.add(quant_bytes(BITS) + 32 * h) as *const _)));
            unroll!(R, |r| {
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

// The closures are inlined as the tiles are: into the caller's AVX2 code.
#[inline(always)]
unsafe fn tile_avx2<const R: usize, const NP: usize, const UNUSED: u8, const BITS: u32>(t: &Tile<Int8BlockWeights>, blocks: Range<usize>) {
    by_halves_avx2::<R>(
        blocks,
        #[inline(always)]
        |blocks| decode_avx2::<NP, BITS>(t, blocks),
        #[inline(always)]
        |blocks, half| half_avx2::<R, NP, BITS>(t, blocks, half),
    );
}

/// One row by all of `NP` panels: each group of the row's activations is broadcast (and its
/// magnitudes taken) once for every panel and half, which share it. The float steps are the
/// batched tile's, in its order.
// Panels and halves index the accumulators, the records and the masks in lockstep.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn decode_avx2<const NP: usize, const BITS: u32>(t: &Tile<Int8BlockWeights>, blocks: Range<usize>) {
    let (offset, ones) = (_mm256_set1_epi8(t.w.offset() as i8), _mm256_set1_epi16(1));
    let masks: [[__m256i; 2]; NP] = std::array::from_fn(|p| std::array::from_fn(|h| t.half_mask(p, h, t.w.n)));
    let mut acc: [[__m256; 2]; NP] = std::array::from_fn(|p| std::array::from_fn(|h| t.load8(0, p, h, masks[p][h], blocks.start == 0)));
    for b in blocks {
        let (x, dx, x_sums) = t.x_block(0, b);
        let records: [*const u8; NP] = std::array::from_fn(|p| t.w.record(t.panel + p, b));
        for rec in records {
            prefetch_ahead(rec, record_bytes(BITS));
        }
        // The record's two scales per output: inputs 0..16 (groups 0..4), then 16..32.
        unroll!(2, |k| {
            let mut sums = [[offset_share::<BITS>(t.w.offset(), x_sums[k]); 2]; NP];
            unroll!(4, |j| {
                let g = 4 * k + j;
                let xg = _mm256_set1_epi32(group(x, g));
                let magnitudes = _mm256_abs_epi8(xg);
                for p in 0..NP {
                    for h in 0..2 {
                        let pairs = products::<BITS>(quants_avx2::<BITS>(records[p], g, 32 * h), xg, magnitudes, offset);
                        sums[p][h] = _mm256_add_epi32(sums[p][h], _mm256_madd_epi16(pairs, ones));
                    }
                }
            });
            for p in 0..NP {
                for h in 0..2 {
                    let d = _mm256_cvtph_ps(_mm_loadu_si128(records[p].add(quant_bytes(BITS) + 32 * k + 16 * h) as *const _));
                    acc[p][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[p][h]), _mm256_mul_ps(d, _mm256_set1_ps(dx)), acc[p][h]);
                }
            }
        });
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
unsafe fn half_avx2<const R: usize, const NP: usize, const BITS: u32>(t: &Tile<Int8BlockWeights>, blocks: Range<usize>, half: usize) {
    let (offset, ones) = (_mm256_set1_epi8(t.w.offset() as i8), _mm256_set1_epi16(1));
    let masks: [__m256i; NP] = std::array::from_fn(|p| t.half_mask(p, half, t.w.n));
    let mut acc: [[__m256; NP]; R] = std::array::from_fn(|r| std::array::from_fn(|p| t.load8(r, p, half, masks[p], blocks.start == 0)));
    for b in blocks {
        let x: [(*const i8, f32, [i32; 2]); R] = std::array::from_fn(|r| t.x_block(r, b));
        for p in 0..NP {
            let rec = t.w.record(t.panel + p, b);
            if half == 0 {
                prefetch_ahead(rec, record_bytes(BITS));
            }
            // The record's two scales per output: inputs 0..16 (groups 0..4), then 16..32.
            unroll!(2, |k| {
                let mut sums: [__m256i; R] = std::array::from_fn(|r| offset_share::<BITS>(t.w.offset(), x[r].2[k]));
                unroll!(4, |j| {
                    let g = 4 * k + j;
                    let q = quants_avx2::<BITS>(rec, g, 32 * half);
                    unroll!(R, |r| {
                        let xg = _mm256_set1_epi32(group(x[r].0, g));
                        let pairs = products::<BITS>(q, xg, _mm256_abs_epi8(xg), offset);
                        sums[r] = _mm256_add_epi32(sums[r], _mm256_madd_epi16(pairs, ones));
                    });
                });
                let d = _mm256_cvtph_ps(_mm_loadu_si128(rec.add(quant_bytes(BITS) + 32 * k + 16 * half) as *const _));
                unroll!(R, |r| {
                    acc[r][p] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[r]), _mm256_mul_ps(d, _mm256_set1_ps(x[r].1)), acc[r][p]);
                });
            });
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (p, values) in acc.iter().enumerate() {
            t.store8(r, p, half, masks[p], *values);
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn gemm_vnni<const BITS: u32>(x: &QuantizedBlocks, w: &Int8BlockWeights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    let (max_rows, panels_per_tile) = vnni_tiles(x.m);
    let tile = block_tiles!(tile_vnni::<BITS>, &Tile { x, w, row: 0, panel: 0, out, ldo }, Int4Offset::Eight);
    for_each_tile_in_chunks(x.m, panels, max_rows, panels_per_tile, w.blocks(), chunk_blocks(w.blocks()), tile);
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gemm_avx2<const BITS: u32>(x: &QuantizedBlocks, w: &Int8BlockWeights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    let panels_per_tile = if x.m == 1 { 2 } else { 1 };
    let tile = block_tiles!(tile_avx2::<BITS>, &Tile { x, w, row: 0, panel: 0, out, ldo }, Int4Offset::Eight);
    for_each_tile_in_chunks(x.m, panels, 4, panels_per_tile, w.blocks(), chunk_blocks(w.blocks()), tile);
}

/// # Safety
/// As [`crate::portable::int8_block::gemm_q8`]; only handed out after detecting VNNI.
pub unsafe fn gemm_q8_vnni(x: &QuantizedBlocks, w: &Int8BlockWeights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    by_quant_bits!(w.bits, gemm_vnni, (x, w, panels, out, ldo))
}

/// # Safety
/// As above, after detecting avx2, fma and f16c.
pub unsafe fn gemm_q8_avx2(x: &QuantizedBlocks, w: &Int8BlockWeights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    by_quant_bits!(w.bits, gemm_avx2, (x, w, panels, out, ldo))
}
