//! 8-bit block GEMMs on aarch64 (layout and epilogue in [`crate::int8_block`]), compiled once
//! per quant width: narrower quants are unpacked to bytes as they are loaded, the offset comes
//! off, then signed by signed. A chunk's quarter (16 bytes) is 4 outputs x 4 inputs.
//!
//! - `i8mm`: `SMMLA` as the 4-bit path's ([`super::int4::tile_smmla`]): chunks `2j` and
//!   `2j + 1` zipped by 32-bit lanes hold each output pair's inputs `8j..8j + 8`, and each half
//!   block takes its own 2 `SMMLA`s per output pair. Single rows take the `dotprod` tile.
//! - `dotprod`: `SDOT` by element, 4 per half block and quarter; tiles of up to 4 rows.
//! - `neon`: widening multiplies (as the 4-bit path's).
//!
//! Integer sums are exact and the float steps fixed: results match the portable twin bit for bit.

use super::int4::{chunk_quarters, half_sums, halves, pair_halves, pair_outputs, pair_sums, tile_smmla, PairedBlock, PairedQuarter, Tile, CHUNK_BLOCKS};
use crate::int4::QuantizedBlocks;
use crate::int8_block::{by_quant_bits, quant_bytes, upper_fields, Int8BlockWeights, NIBBLE_BYTES};
use crate::packed::PANEL;
use crate::portable::gemm::for_each_tile_in_chunks;
use std::arch::aarch64::*;
use std::ops::Range;

/// Stored quants as weights: the offset off, as signed bytes.
#[inline(always)]
unsafe fn signed(quants: uint8x16_t, offset: uint8x16_t) -> int8x16_t {
    vreinterpretq_s8_u8(vsubq_u8(quants, offset))
}

/// Quarter `q` of the 8 chunks of a record's `BITS`-bit quants, unpacked to bytes: a nibble
/// and the field `g % fields` of an upper chunk's byte moved to bits 4.. (`vshlq_u8` shifts
/// right by a negative count).
#[inline(always)]
unsafe fn quant_quarters<const BITS: u32>(rec: *const u8, q: usize) -> [uint8x16_t; 8] {
    if BITS == 8 {
        return chunk_quarters::<8>(rec, q);
    }
    let nibbles = chunk_quarters::<4>(rec, q);
    let (fields, width) = (upper_fields(BITS), BITS as i8 - 4);
    let mask = vdupq_n_u8((((1 << width) - 1) << 4) as u8);
    std::array::from_fn(|g| {
        let low = if g < 4 { vandq_u8(nibbles[g], vdupq_n_u8(0x0f)) } else { vshrq_n_u8::<4>(nibbles[g - 4]) };
        let upper = vld1q_u8(rec.add(NIBBLE_BYTES + 64 * (g / fields) + 16 * q));
        let moved = vshlq_u8(upper, vdupq_n_s8(4 - width * (g % fields) as i8));
        vorrq_u8(low, vandq_u8(moved, mask))
    })
}

/// Quarter `q` of the 8 chunks of a record for `SDOT`, offset removed: groups 0..8.
#[inline(always)]
unsafe fn quarter<const BITS: u32>(rec: *const u8, q: usize, offset: uint8x16_t) -> [int8x16_t; 8] {
    quant_quarters::<BITS>(rec, q).map(|c| signed(c, offset))
}

/// Quarter `q` of a record for `SMMLA`, offset removed: chunks `2j` and `2j + 1` zipped give
/// inputs `8j..8j + 8`.
#[inline(always)]
unsafe fn paired_quarter<const BITS: u32>(rec: *const u8, q: usize, offset: uint8x16_t) -> PairedQuarter {
    let c = quant_quarters::<BITS>(rec, q);
    let eights: [[uint8x16_t; 2]; 4] = std::array::from_fn(|j| pair_outputs(c[2 * j], c[2 * j + 1]));
    std::array::from_fn(|pair| std::array::from_fn(|j| signed(eights[j][pair], offset)))
}

/// The scales of each half block of the outputs from byte `at` of a record's scales, by `load`
/// (`halves` or `pair_halves`).
#[inline(always)]
unsafe fn half_scales<const BITS: u32>(rec: *const u8, at: usize, load: impl Fn(*const u8) -> float32x4_t) -> [float32x4_t; 2] {
    std::array::from_fn(|h| load(rec.add(quant_bytes(BITS) + 2 * PANEL * h + at)))
}

/// [`crate::int8_block::accumulate_half`] on 4 outputs, with `dx` broadcast.
#[inline(always)]
unsafe fn accumulate_half(acc: float32x4_t, s: int32x4_t, d: float32x4_t, dx: float32x4_t) -> float32x4_t {
    vfmaq_f32(acc, vcvtq_f32_s32(s), vmulq_f32(d, dx))
}

/// `R` rows by one panel over `blocks`, the half-block sums by `SDOT` (`DOT`) or widening
/// multiplies.
#[inline(always)]
unsafe fn tile<const R: usize, const DOT: bool, const BITS: u32>(t: &Tile<Int8BlockWeights>, blocks: Range<usize>) {
    let offset = vdupq_n_u8(t.w.offset());
    let mut acc: [[float32x4_t; 4]; R] = std::array::from_fn(|r| t.load_panel(r, t.w.n, blocks.start == 0));
    for b in blocks {
        let rec = t.w.record(t.panel, b);
        for q in 0..4 {
            let w = quarter::<BITS>(rec, q, offset);
            let d = half_scales::<BITS>(rec, 8 * q, |p| halves(p));
            for (r, acc) in acc.iter_mut().enumerate() {
                let (x, dx, _) = t.x_block(r, b);
                for (s, d) in half_sums::<DOT>(x, &w).iter().zip(&d) {
                    acc[q] = accumulate_half(acc[q], *s, *d, vdupq_n_f32(dx));
                }
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        t.store_panel(r, t.w.n, acc);
    }
}

#[target_feature(enable = "dotprod,i8mm")]
unsafe fn gemm_i8mm<const BITS: u32>(x: &QuantizedBlocks, w: &Int8BlockWeights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    let offset = vdupq_n_u8(w.offset());
    let weights = |panel: usize, b: usize, q: usize| {
        let rec = w.record(panel, b);
        let d: [_; 2] = std::array::from_fn(|pair| half_scales::<BITS>(rec, 8 * q + 4 * pair, |p| pair_halves(p)));
        (paired_quarter::<BITS>(rec, q, offset), d)
    };
    let accumulate = |(w, d): &(PairedQuarter, [[float32x4_t; 2]; 2]), x: &PairedBlock, sums: &mut [float32x4_t; 2]| {
        // Half by half (the order each output takes them), so fewer values are live at once.
        for h in 0..2 {
            for ((sums, s), d) in sums.iter_mut().zip(pair_sums(x, w, 2 * h..2 * h + 2)).zip(d) {
                *sums = accumulate_half(*sums, s, d[h], x.dx);
            }
        }
    };
    for_each_tile_in_chunks(x.m, panels, 8, 1, w.blocks(), CHUNK_BLOCKS, |row, rows, panel, _, blocks| {
        let t = Tile { x, w, row, panel, out, ldo };
        if rows == 1 {
            tile::<1, true, BITS>(&t, blocks)
        } else {
            by_rows!(rows.div_ceil(2), tile_smmla::<_, _>, (&t, w.n, rows, blocks, &weights, &accumulate), [1 2 3 4])
        }
    });
}

#[target_feature(enable = "dotprod")]
unsafe fn gemm_dotprod<const BITS: u32>(x: &QuantizedBlocks, w: &Int8BlockWeights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    for_each_tile_in_chunks(
        x.m,
        panels,
        4,
        1,
        w.blocks(),
        CHUNK_BLOCKS,
        |row, rows, panel, _, blocks| by_rows!(rows, tile::<true, BITS>, (&Tile { x, w, row, panel, out, ldo }, blocks), [1 2 3 4]),
    );
}

#[target_feature(enable = "neon")]
unsafe fn gemm_neon<const BITS: u32>(x: &QuantizedBlocks, w: &Int8BlockWeights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    for_each_tile_in_chunks(
        x.m,
        panels,
        2,
        1,
        w.blocks(),
        CHUNK_BLOCKS,
        |row, rows, panel, _, blocks| by_rows!(rows, tile::<false, BITS>, (&Tile { x, w, row, panel, out, ldo }, blocks), [1 2]),
    );
}

/// # Safety
/// As [`crate::portable::int8_block::gemm_q8`]; only handed out after detecting i8mm and dotprod.
pub unsafe fn gemm_q8_i8mm(x: &QuantizedBlocks, w: &Int8BlockWeights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    by_quant_bits!(w.bits, gemm_i8mm, (x, w, panels, out, ldo))
}

/// # Safety
/// As above, after detecting dotprod.
pub unsafe fn gemm_q8_dotprod(x: &QuantizedBlocks, w: &Int8BlockWeights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    by_quant_bits!(w.bits, gemm_dotprod, (x, w, panels, out, ldo))
}

/// # Safety
/// As above, after detecting neon.
pub unsafe fn gemm_q8_neon(x: &QuantizedBlocks, w: &Int8BlockWeights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    by_quant_bits!(w.bits, gemm_neon, (x, w, panels, out, ldo))
}
