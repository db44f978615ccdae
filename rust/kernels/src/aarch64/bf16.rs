//! GEMM for CPUs with FEAT_BF16 (Neoverse N2/V1/V2, Graviton 3 and later): bf16 weights
//! multiply bf16-rounded activations with `BFDOT`, two products per f32 lane per instruction,
//! on the packed pair layout as it is. Rust has no BF16 intrinsics, so each `BFDOT` is a
//! one-instruction `asm!` the compiler schedules and allocates registers for like an intrinsic.
//! f32 and f16 weights take the NEON tiles.
//!
//! Tiles are up to 6 rows by one panel (24 accumulators); each output accumulates one pair of
//! `k` per step in order, so results do not depend on `m`.

use super::neon::{self, store, zero_acc, Tile, QUADS};
use crate::dispatch::GemmArgs;
use crate::packed::{PackedWeights, WeightDtype, PANEL};
use crate::portable::gemm::for_each_tile;
use std::arch::aarch64::*;
use std::arch::asm;
use std::ops::Range;

const MAX_ROWS: usize = 6;

/// `acc[i] += w[2i] * x[0] + w[2i + 1] * x[1]` for each f32 lane `i`, where `x` is the bf16
/// pair in `x_pair` (the by-element form reads it from the register's low 32 bits).
#[inline(always)]
unsafe fn bfdot(mut acc: float32x4_t, w: uint16x8_t, x_pair: u32) -> float32x4_t {
    asm!("bfdot {acc:v}.4s, {w:v}.8h, {x:v}.2h[0]", acc = inout(vreg) acc, w = in(vreg) w, x = in(vreg) x_pair,
         options(pure, nomem, nostack, preserves_flags));
    acc
}

/// bf16 weights times bf16 activation pairs (`[m][k / 2][2]`).
#[inline(always)]
unsafe fn tile_bfdot<const R: usize>(x: *const u16, w: *const u16, pairs: usize, t: &Tile) {
    let mut acc = zero_acc::<R>();
    for kp in 0..pairs {
        let wv: [uint16x8_t; QUADS] = std::array::from_fn(|q| vld1q_u16(w.add(t.w + kp * 2 * PANEL + 8 * q)));
        for (r, row) in acc.iter_mut().enumerate() {
            let pair = (x.add(t.x + r * t.x_stride + 2 * kp) as *const u32).read_unaligned();
            for (a, wq) in row.iter_mut().zip(&wv) {
                *a = bfdot(*a, *wq, pair);
            }
        }
    }
    store(&acc, t);
}

#[target_feature(enable = "bf16")]
unsafe fn gemm_bf16(a: &GemmArgs, w: &PackedWeights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    let pairs = w.k.div_ceil(2);
    let (x, wp) = (a.x_bf16.as_ptr(), w.half_data().as_ptr());
    for_each_tile(a.m, panels, MAX_ROWS, 1, |row, rows, panel, _| {
        let t = Tile::at(w, row, panel, 2 * pairs, out, ldo);
        by_rows!(rows, tile_bfdot, (x, wp, pairs, &t), [1 2 3 4 5 6])
    });
}

/// # Safety
/// As [`crate::portable::gemm::gemm`], with `a.x_bf16` filled for bf16 weights; only handed out
/// after detecting bf16.
pub unsafe fn gemm(a: &GemmArgs, w: &PackedWeights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    match w.dtype {
        WeightDtype::BF16 => gemm_bf16(a, w, panels, out, ldo),
        WeightDtype::F32 | WeightDtype::F16 => neon::gemm(a, w, panels, out, ldo),
    }
}
