//! NEON kernels. Reachable only through [`super::paths`], which checks the CPU first.
//!
//! GEMM tiles are up to 6 rows by one 16-column panel: 24 q-register accumulators, 4 for the
//! panel's weights at one `k`, and the activation as a by-element FMA operand. f16 weights widen
//! with `fcvtl`; bf16 pairs widen with a shift (even `k`) and a mask (odd `k`), whose 8 widened
//! registers leave room for 5 rows only. Activations stay f32. Every output is a sequential sum
//! over `k`, so results do not depend on `m`.

use crate::dispatch::GemmArgs;
use crate::packed::{PackedWeights, WeightDtype, PANEL};
use crate::portable::gemm::for_each_tile;
use std::arch::aarch64::*;
use std::ops::Range;

/// q registers per output row of a panel.
pub(super) const QUADS: usize = PANEL / 4;

/// A tile's accumulators: `R` rows by one panel.
pub(super) type Acc<const R: usize> = [[float32x4_t; QUADS]; R];

/// Where a tile reads and writes.
pub(super) struct Tile {
    /// Activation element of the tile's first row, and elements from one row to the next.
    pub x: usize,
    pub x_stride: usize,
    /// First weight element of the tile's panel.
    pub w: usize,
    /// Output element of the tile's top-left corner; valid columns from there.
    pub out: *mut f32,
    pub ldo: usize,
    pub cols: usize,
}

impl Tile {
    /// The tile whose top-left output is row `row`, first column of `panel`.
    pub(super) unsafe fn at(w: &PackedWeights, row: usize, panel: usize, x_stride: usize, out: *mut f32, ldo: usize) -> Tile {
        let cols = (w.n - panel * PANEL).min(PANEL);
        Tile { x: row * x_stride, x_stride, w: panel * w.panel_stride(), out: out.add(row * ldo + panel * PANEL), ldo, cols }
    }
}

#[inline(always)]
pub(super) unsafe fn zero_acc<const R: usize>() -> Acc<R> {
    [[vdupq_n_f32(0.0); QUADS]; R]
}

#[inline(always)]
pub(super) unsafe fn store<const R: usize>(acc: &Acc<R>, t: &Tile) {
    for (r, row) in acc.iter().enumerate() {
        let dst = t.out.add(r * t.ldo);
        if t.cols == PANEL {
            store_row(row, dst);
        } else {
            // The last panel of a matrix may be partial: keep the writes inside the output.
            let mut spill = [0f32; PANEL];
            store_row(row, spill.as_mut_ptr());
            std::ptr::copy_nonoverlapping(spill.as_ptr(), dst, t.cols);
        }
    }
}

#[inline(always)]
unsafe fn store_row(row: &[float32x4_t; QUADS], dst: *mut f32) {
    for (q, v) in row.iter().enumerate() {
        vst1q_f32(dst.add(4 * q), *v);
    }
}

/// `acc[r] += x[r][kk] * w` for every row `r` of the tile.
#[inline(always)]
unsafe fn fma_rows<const R: usize>(acc: &mut Acc<R>, w: &[float32x4_t; QUADS], x: *const f32, t: &Tile, kk: usize) {
    for (r, row) in acc.iter_mut().enumerate() {
        let xv = *x.add(t.x + r * t.x_stride + kk);
        for (a, wq) in row.iter_mut().zip(w) {
            *a = vfmaq_n_f32(*a, *wq, xv);
        }
    }
}

/// f32 or f16 weights (`load` widens the panel's 16 weights at an element offset) times f32
/// activations.
#[inline(always)]
unsafe fn tile_wide<const R: usize>(x: *const f32, k: usize, t: &Tile, load: impl Fn(usize) -> [float32x4_t; QUADS]) {
    let mut acc = zero_acc::<R>();
    for kk in 0..k {
        fma_rows(&mut acc, &load(t.w + kk * PANEL), x, t, kk);
    }
    store(&acc, t);
}

/// bf16 weights times f32 activations. Each 32-bit lane holds one output's (even `k`, odd `k`)
/// pair, the even one in the low half: shifting it up gives the even weight as f32, masking the
/// low half off gives the odd one.
#[inline(always)]
unsafe fn tile_bf16<const R: usize>(x: *const f32, w: *const u16, k: usize, t: &Tile) {
    let mut acc = zero_acc::<R>();
    let high_half = vdupq_n_u32(0xffff_0000);
    for kp in 0..k.div_ceil(2) {
        let pairs: [uint32x4_t; QUADS] = std::array::from_fn(|q| vreinterpretq_u32_u16(vld1q_u16(w.add(t.w + kp * 2 * PANEL + 8 * q))));
        fma_rows(&mut acc, &pairs.map(|p| vreinterpretq_f32_u32(vshlq_n_u32::<16>(p))), x, t, 2 * kp);
        // An odd k's last pair is padding, with no activation to multiply.
        if 2 * kp + 1 < k {
            fma_rows(&mut acc, &pairs.map(|p| vreinterpretq_f32_u32(vandq_u32(p, high_half))), x, t, 2 * kp + 1);
        }
    }
    store(&acc, t);
}

/// The panel's 16 f16 weights at element `at`, widened to f32.
#[inline(always)]
unsafe fn widen_f16(w: *const u16, at: usize) -> [float32x4_t; QUADS] {
    let lo = vreinterpretq_f16_u16(vld1q_u16(w.add(at)));
    let hi = vreinterpretq_f16_u16(vld1q_u16(w.add(at + 8)));
    [vcvt_f32_f16(vget_low_f16(lo)), vcvt_high_f32_f16(lo), vcvt_f32_f16(vget_low_f16(hi)), vcvt_high_f32_f16(hi)]
}

/// # Safety
/// As [`crate::portable::gemm::gemm`]; only handed out on CPUs with NEON.
pub unsafe fn gemm(a: &GemmArgs, w: &PackedWeights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    let (k, x) = (w.k, a.x.as_ptr());
    let max_rows = if w.dtype == WeightDtype::BF16 { 5 } else { 6 };
    for_each_tile(a.m, panels, max_rows, 1, |row, rows, panel, _| {
        let t = Tile::at(w, row, panel, k, out, ldo);
        match w.dtype {
            WeightDtype::BF16 => by_rows!(rows, tile_bf16, (x, w.half_data().as_ptr(), k, &t), [1 2 3 4 5]),
            WeightDtype::F32 => {
                let wp = w.f32_data().as_ptr();
                let load = |at: usize| std::array::from_fn(|q| vld1q_f32(wp.add(at + 4 * q)));
                by_rows!(rows, tile_wide, (x, k, &t, load), [1 2 3 4 5 6])
            }
            WeightDtype::F16 => {
                let wp = w.half_data().as_ptr();
                by_rows!(rows, tile_wide, (x, k, &t, |at: usize| widen_f16(wp, at)), [1 2 3 4 5 6])
            }
        }
    });
}
