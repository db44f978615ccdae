//! 8-bit block GEMMs on aarch64 (layout and epilogue in [`crate::int8_block`]): the offset
//! comes off the stored quants, then signed by signed. A chunk's quarter (16 bytes) is 4
//! outputs x 4 inputs.
//!
//! - `dotprod`: `SDOT` by element, 4 per half block and quarter; tiles of up to 4 rows.
//! - `neon`: widening multiplies (as the 4-bit path's).
//!
//! Integer sums are exact and the float steps fixed: results match the portable twin bit for bit.

use super::int4::{halves, widening_groups, Tile};
use crate::int4::QuantizedBlocks;
use crate::int8_block::{Int8BlockWeights, QUANT_BYTES};
use crate::portable::gemm::for_each_tile;
use std::arch::aarch64::*;
use std::arch::asm;
use std::ops::Range;

/// Quarter `q` of the 8 chunks of a record, offset removed.
#[inline(always)]
unsafe fn quarter(rec: *const u8, q: usize, offset: uint8x16_t) -> [int8x16_t; 8] {
    std::array::from_fn(|g| vreinterpretq_s8_u8(vsubq_u8(vld1q_u8(rec.add(64 * g + 16 * q)), offset)))
}

/// The sums of one quarter's 4 outputs over each half block: `SDOT` by element.
#[inline(always)]
unsafe fn half_sums_sdot(x: *const i8, w: &[int8x16_t; 8]) -> [int32x4_t; 2] {
    let (low, high) = (vld1q_s8(x), vld1q_s8(x.add(16)));
    let mut first = sdot_lane!(vdupq_n_s32(0), w[0], low, 0);
    let mut second = sdot_lane!(vdupq_n_s32(0), w[4], high, 0);
    first = sdot_lane!(first, w[1], low, 1);
    second = sdot_lane!(second, w[5], high, 1);
    first = sdot_lane!(first, w[2], low, 2);
    second = sdot_lane!(second, w[6], high, 2);
    first = sdot_lane!(first, w[3], low, 3);
    second = sdot_lane!(second, w[7], high, 3);
    [first, second]
}

#[inline(always)]
unsafe fn half_sums_widening(x: *const i8, w: &[int8x16_t; 8]) -> [int32x4_t; 2] {
    [widening_groups(x, &w[..4], 0), widening_groups(x, &w[4..], 4)]
}

/// `R` rows by one panel, the half-block sums by `SDOT` (`DOT`) or widening multiplies.
#[inline(always)]
unsafe fn tile<const R: usize, const DOT: bool>(t: &Tile<Int8BlockWeights>) {
    let offset = vdupq_n_u8(t.w.offset);
    let mut acc = [[vdupq_n_f32(0.0); 4]; R];
    for b in 0..t.w.blocks() {
        let rec = t.w.record(t.panel, b);
        for q in 0..4 {
            let w = quarter(rec, q, offset);
            let d = [halves(rec.add(QUANT_BYTES + 8 * q)), halves(rec.add(QUANT_BYTES + 32 + 8 * q))];
            for (r, acc) in acc.iter_mut().enumerate() {
                let (x, dx, _) = t.x_block(r, b);
                let sums = if DOT { half_sums_sdot(x, &w) } else { half_sums_widening(x, &w) };
                for h in 0..2 {
                    acc[q] = vfmaq_f32(acc[q], vcvtq_f32_s32(sums[h]), vmulq_n_f32(d[h], dx));
                }
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        t.store(r, t.w.n, acc);
    }
}

#[target_feature(enable = "dotprod")]
unsafe fn gemm_dotprod(x: &QuantizedBlocks, w: &Int8BlockWeights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    for_each_tile(x.m, panels, 4, 1, |row, rows, panel, _| {
        let t = Tile { x, w, row, panel, out, ldo };
        match rows {
            1 => tile::<1, true>(&t),
            2 => tile::<2, true>(&t),
            3 => tile::<3, true>(&t),
            4 => tile::<4, true>(&t),
            rows => unreachable!("no tile of {rows} rows"),
        }
    });
}

#[target_feature(enable = "neon")]
unsafe fn gemm_neon(x: &QuantizedBlocks, w: &Int8BlockWeights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    for_each_tile(x.m, panels, 2, 1, |row, rows, panel, _| {
        let t = Tile { x, w, row, panel, out, ldo };
        if rows == 2 {
            tile::<2, false>(&t)
        } else {
            tile::<1, false>(&t)
        }
    });
}

/// # Safety
/// As [`crate::portable::gemm_q8::gemm_q8`]; only handed out after detecting dotprod.
pub unsafe fn gemm_q8_dotprod(x: &QuantizedBlocks, w: &Int8BlockWeights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    gemm_dotprod(x, w, panels, out, ldo)
}

/// # Safety
/// As above, after detecting neon.
pub unsafe fn gemm_q8_neon(x: &QuantizedBlocks, w: &Int8BlockWeights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    gemm_neon(x, w, panels, out, ldo)
}
