//! int8 GEMMs for W8A8 on aarch64 (layout and epilogue in [`crate::int8`]). Rust's `SDOT` and
//! `SMMLA` intrinsics are unstable, so each is a one-instruction `asm!` the compiler allocates
//! registers for like an intrinsic.
//!
//! - `i8mm`: `SMMLA` multiplies a 2-row by 8-input block of activations with two outputs' 8
//!   weights (16 contiguous bytes of a panel block) into a 2x2 tile; 4 rows by a 16-output panel
//!   keep 16 accumulators. Rows left over (an odd batch, decode) take the `SDOT` tile.
//! - `dotprod`: `SDOT` with the block's 8 activations in both halves of a register gives each
//!   output two 4-wide partial sums; 2 rows by a panel keep 16 accumulators.
//! - `neon`: widening multiplies (`smull`) and pairwise adds, for cores without dot products.
//!
//! The sums are exact integers, so results match the portable twin bit for bit.

use crate::int8::{Int8Tile, Int8Weights, QuantizedRows, K_BLOCK};
use crate::packed::PANEL;
use crate::portable::gemm::for_each_tile;
use std::arch::aarch64::*;
use std::arch::asm;
use std::ops::Range;

/// Registers of one panel block: 16 outputs x 8 inputs, two outputs per register.
const REGS: usize = PANEL / 2;

type Tile<'a> = Int8Tile<'a>;

/// Block `b` of the tile's panel: 16 outputs x 8 inputs, two outputs per register.
#[inline(always)]
unsafe fn w_regs(t: &Tile, b: usize) -> [int8x16_t; REGS] {
    let p = t.w_block(b);
    std::array::from_fn(|q| vld1q_s8(p.add(16 * q)))
}

/// Tile row `r`'s 16 sums, four registers of four outputs, through the shared epilogue.
#[inline(always)]
unsafe fn store(t: &Tile, r: usize, sums: [int32x4_t; 4]) {
    let mut all = [0i32; PANEL];
    for (q, s) in sums.iter().enumerate() {
        vst1q_s32(all.as_mut_ptr().add(4 * q), *s);
    }
    t.store(r, &all);
}

#[inline(always)]
unsafe fn sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    asm!("sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b", acc = inout(vreg) acc, a = in(vreg) a, b = in(vreg) b,
         options(pure, nomem, nostack, preserves_flags));
    acc
}

#[inline(always)]
pub(super) unsafe fn smmla(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    asm!("smmla {acc:v}.4s, {a:v}.16b, {b:v}.16b", acc = inout(vreg) acc, a = in(vreg) a, b = in(vreg) b,
         options(pure, nomem, nostack, preserves_flags));
    acc
}

/// `R` rows with `SDOT`: per output register, lanes (out 2q, first half), (2q, second half),
/// (2q + 1, first), (2q + 1, second); neighbouring pairs fold into four outputs per register.
#[inline(always)]
unsafe fn tile_sdot<const R: usize>(t: &Tile) {
    let mut acc = [[vdupq_n_s32(0); REGS]; R];
    for b in 0..t.w.k_padded / K_BLOCK {
        let w = w_regs(t, b);
        for (r, a) in acc.iter_mut().enumerate() {
            let x = vreinterpretq_s8_s64(vld1q_dup_s64(t.x_block(r, b) as *const i64));
            for (aq, wq) in a.iter_mut().zip(&w) {
                *aq = sdot(*aq, *wq, x);
            }
        }
    }
    for (r, a) in acc.iter().enumerate() {
        store(t, r, std::array::from_fn(|q| vpaddq_s32(a[2 * q], a[2 * q + 1])));
    }
}

/// 4 rows with `SMMLA`: per row pair and output register, the 2x2 tile (row i: out 2q, 2q + 1;
/// row i + 1: the same); two registers' halves zip into four outputs of one row.
#[inline(always)]
unsafe fn tile_smmla(t: &Tile) {
    let mut acc = [[vdupq_n_s32(0); REGS]; 2];
    for b in 0..t.w.k_padded / K_BLOCK {
        let w = w_regs(t, b);
        for (pair, a) in acc.iter_mut().enumerate() {
            let rows = vcombine_s8(vld1_s8(t.x_block(2 * pair, b)), vld1_s8(t.x_block(2 * pair + 1, b)));
            for (aq, wq) in a.iter_mut().zip(&w) {
                *aq = smmla(*aq, rows, *wq);
            }
        }
    }
    for (pair, a) in acc.iter().enumerate() {
        let (a, d) = (|q: usize| vreinterpretq_s64_s32(a[q]), vreinterpretq_s32_s64);
        store(t, 2 * pair, std::array::from_fn(|q| d(vzip1q_s64(a(2 * q), a(2 * q + 1)))));
        store(t, 2 * pair + 1, std::array::from_fn(|q| d(vzip2q_s64(a(2 * q), a(2 * q + 1)))));
    }
}

/// One row with widening multiplies: per output, eight products add pairwise into four lanes.
#[inline(always)]
unsafe fn tile_widening(t: &Tile) {
    let mut acc = [vdupq_n_s32(0); PANEL];
    for b in 0..t.w.k_padded / K_BLOCK {
        let w = w_regs(t, b);
        let x = vld1_s8(t.x_block(0, b));
        for (q, wq) in w.iter().enumerate() {
            acc[2 * q] = vpadalq_s16(acc[2 * q], vmull_s8(vget_low_s8(*wq), x));
            acc[2 * q + 1] = vpadalq_s16(acc[2 * q + 1], vmull_s8(vget_high_s8(*wq), x));
        }
    }
    store(t, 0, std::array::from_fn(|q| vpaddq_s32(vpaddq_s32(acc[4 * q], acc[4 * q + 1]), vpaddq_s32(acc[4 * q + 2], acc[4 * q + 3]))));
}

#[target_feature(enable = "dotprod,i8mm")]
unsafe fn gemm_i8mm(x: &QuantizedRows, w: &Int8Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    for_each_tile(x.m, panels, 4, 1, |row, rows, panel, _| {
        let t = Int8Tile { x, w, row, panel, out, ldo };
        match rows {
            4 => tile_smmla(&t),
            1 => tile_sdot::<1>(&t),
            2 => tile_sdot::<2>(&t),
            3 => {
                tile_sdot::<2>(&t);
                tile_sdot::<1>(&Int8Tile { row: row + 2, ..t });
            }
            rows => unreachable!("no tile of {rows} rows"),
        }
    });
}

#[target_feature(enable = "dotprod")]
unsafe fn gemm_dotprod(x: &QuantizedRows, w: &Int8Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    for_each_tile(x.m, panels, 2, 1, |row, rows, panel, _| {
        let t = Int8Tile { x, w, row, panel, out, ldo };
        if rows == 2 {
            tile_sdot::<2>(&t)
        } else {
            tile_sdot::<1>(&t)
        }
    });
}

#[target_feature(enable = "neon")]
unsafe fn gemm_neon(x: &QuantizedRows, w: &Int8Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    for_each_tile(x.m, panels, 1, 1, |row, _, panel, _| tile_widening(&Int8Tile { x, w, row, panel, out, ldo }));
}

/// # Safety
/// As [`crate::portable::int8::gemm_i8`]; only handed out after detecting i8mm and dotprod.
pub unsafe fn gemm_i8_i8mm(x: &QuantizedRows, w: &Int8Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    gemm_i8mm(x, w, panels, out, ldo)
}

/// # Safety
/// As above, after detecting dotprod.
pub unsafe fn gemm_i8_dotprod(x: &QuantizedRows, w: &Int8Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    gemm_dotprod(x, w, panels, out, ldo)
}

/// # Safety
/// As above, after detecting neon.
pub unsafe fn gemm_i8_neon(x: &QuantizedRows, w: &Int8Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    gemm_neon(x, w, panels, out, ldo)
}
