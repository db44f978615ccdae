//! W4A8 GEMMs on aarch64 (layout and epilogue in [`crate::int4`]). A chunk's quarter (16
//! bytes) holds 4 outputs x 4 inputs in its low nibbles and 4 x 4 more in its high ones.
//!
//! - `dotprod`: `SDOT` by element multiplies a quarter's 4 x 4 by one group of 4 activations
//!   (a lane of the block's two activation registers): 8 per quarter and block. Tiles of up to
//!   4 rows by one panel.
//! - `neon`: widening multiplies with the group replicated to every output, pairwise adds.
//!
//! The quants (0..=15) are valid signed bytes, so both paths multiply signed by signed. Each
//! block's sums go through the scheme's float steps: results match the portable twin bit for
//! bit. f16 scales widen with `FCVTL` (base ARMv8, but Rust's intrinsic wants the f16 type).

use crate::int4::{BlockTile, Int4Offset, Int4Weights, QuantizedBlocks, NIBBLE_BYTES};
use crate::packed::PANEL;
use crate::portable::gemm::for_each_tile;
use std::arch::aarch64::*;
use std::arch::asm;
use std::ops::Range;

pub(super) type Tile<'a, W> = BlockTile<'a, W>;

impl<W> Tile<'_, W> {
    /// Stores tile row `r`'s 16 outputs (four registers) of the tile's panel, its valid columns.
    #[inline(always)]
    pub unsafe fn store(&self, r: usize, n: usize, acc: &[float32x4_t; 4]) {
        let first = self.panel * PANEL;
        let mut values = [0f32; PANEL];
        for (q, a) in acc.iter().enumerate() {
            vst1q_f32(values.as_mut_ptr().add(4 * q), *a);
        }
        let dst = self.out.add((self.row + r) * self.ldo + first);
        for (c, v) in values[..(n - first).min(PANEL)].iter().enumerate() {
            *dst.add(c) = *v;
        }
    }
}

/// Four f16 at `p` as f32.
#[inline(always)]
pub(super) unsafe fn halves(p: *const u8) -> float32x4_t {
    let h = vreinterpret_u16_u8(vld1_u8(p));
    let mut out: float32x4_t;
    asm!("fcvtl {out:v}.4s, {h:v}.4h", out = lateout(vreg) out, h = in(vreg) h, options(pure, nomem, nostack, preserves_flags));
    out
}

/// The quarter `q` (outputs 4q..4q + 4) of a record, groups 0..4 then 4..8.
#[inline(always)]
unsafe fn quarter(rec: *const u8, q: usize) -> [int8x16_t; 8] {
    let mut w = [vdupq_n_s8(0); 8];
    for c in 0..4 {
        let v = vld1q_u8(rec.add(64 * c + 16 * q));
        w[c] = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0f)));
        w[c + 4] = vreinterpretq_s8_u8(vshrq_n_u8::<4>(v));
    }
    w
}

/// `R` rows by one panel, the sums of each quarter by `SDOT` (`DOT`) or widening multiplies,
/// through the float steps (`MIN`: the weights store minimums, else they are `-8 d`); stores
/// the panel's valid columns.
#[inline(always)]
unsafe fn tile<const R: usize, const DOT: bool, const MIN: bool>(t: &Tile<Int4Weights>) {
    let mut acc = [[vdupq_n_f32(0.0); 4]; R];
    for b in 0..t.w.blocks() {
        let rec = t.w.record(t.panel, b);
        for q in 0..4 {
            let w = quarter(rec, q);
            let d = halves(rec.add(NIBBLE_BYTES + 8 * q));
            let m = if MIN { halves(rec.add(NIBBLE_BYTES + 2 * PANEL + 8 * q)) } else { vmulq_n_f32(d, -8.0) };
            for (r, acc) in acc.iter_mut().enumerate() {
                let (x, dx, tx) = t.x.block_scales(t.row + r, b);
                let s = vcvtq_f32_s32(if DOT { sums_sdot(x, &w) } else { sums_widening(x, &w) });
                acc[q] = vfmaq_f32(vfmaq_f32(acc[q], s, vmulq_n_f32(d, *dx)), m, vdupq_n_f32(*tx));
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        t.store(r, t.w.n, acc);
    }
}

#[inline(always)]
unsafe fn sums_sdot(x: *const i8, w: &[int8x16_t; 8]) -> int32x4_t {
    let (low, high) = (vld1q_s8(x), vld1q_s8(x.add(16)));
    let mut a = sdot_lane!(vdupq_n_s32(0), w[0], low, 0);
    let mut b = sdot_lane!(vdupq_n_s32(0), w[4], high, 0);
    a = sdot_lane!(a, w[1], low, 1);
    b = sdot_lane!(b, w[5], high, 1);
    a = sdot_lane!(a, w[2], low, 2);
    b = sdot_lane!(b, w[6], high, 2);
    a = sdot_lane!(a, w[3], low, 3);
    b = sdot_lane!(b, w[7], high, 3);
    vaddq_s32(a, b)
}

#[inline(always)]
unsafe fn sums_widening(x: *const i8, w: &[int8x16_t; 8]) -> int32x4_t {
    widening_groups(x, w, 0)
}

/// The sums of 4 outputs over `w.len()` groups of 4 inputs, activations from group `first`,
/// by widening multiplies: per group, its 4 activations under each of the 4 outputs; products
/// pairwise into (output, half) lanes, outputs 0-1 from the low half, 2-3 from the high one.
#[inline(always)]
pub(super) unsafe fn widening_groups(x: *const i8, w: &[int8x16_t], first: usize) -> int32x4_t {
    let (mut front, mut back) = (vdupq_n_s32(0), vdupq_n_s32(0));
    for (g, wg) in w.iter().enumerate() {
        let xg = vreinterpretq_s8_s32(vdupq_n_s32((x.add(4 * (first + g)) as *const i32).read_unaligned()));
        front = vpadalq_s16(front, vmull_s8(vget_low_s8(*wg), vget_low_s8(xg)));
        back = vpadalq_s16(back, vmull_high_s8(*wg, xg));
    }
    vpaddq_s32(front, back)
}

#[target_feature(enable = "dotprod")]
unsafe fn gemm_dotprod(x: &QuantizedBlocks, w: &Int4Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    for_each_tile(x.m, panels, 4, 1, |row, rows, panel, _| {
        let t = Tile { x, w, row, panel, out, ldo };
        match (rows, w.offset == Int4Offset::Min) {
            (1, true) => tile::<1, true, true>(&t),
            (2, true) => tile::<2, true, true>(&t),
            (3, true) => tile::<3, true, true>(&t),
            (4, true) => tile::<4, true, true>(&t),
            (1, false) => tile::<1, true, false>(&t),
            (2, false) => tile::<2, true, false>(&t),
            (3, false) => tile::<3, true, false>(&t),
            (4, false) => tile::<4, true, false>(&t),
            (rows, _) => unreachable!("no tile of {rows} rows"),
        }
    });
}

#[target_feature(enable = "neon")]
unsafe fn gemm_neon(x: &QuantizedBlocks, w: &Int4Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    for_each_tile(x.m, panels, 2, 1, |row, rows, panel, _| {
        let t = Tile { x, w, row, panel, out, ldo };
        match (rows, w.offset == Int4Offset::Min) {
            (2, true) => tile::<2, false, true>(&t),
            (2, false) => tile::<2, false, false>(&t),
            (_, true) => tile::<1, false, true>(&t),
            (_, false) => tile::<1, false, false>(&t),
        }
    });
}

/// # Safety
/// As [`crate::portable::gemm_q4::gemm_q4`]; only handed out after detecting dotprod.
pub unsafe fn gemm_q4_dotprod(x: &QuantizedBlocks, w: &Int4Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    gemm_dotprod(x, w, panels, out, ldo)
}

/// # Safety
/// As above, after detecting neon.
pub unsafe fn gemm_q4_neon(x: &QuantizedBlocks, w: &Int4Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    gemm_neon(x, w, panels, out, ldo)
}
