//! bf16 GEMM on SVE with FEAT_BF16 (Graviton 3/4, Neoverse V1/V2/N2, Grace), vector-length
//! agnostic: a panel's 16 outputs are covered by as many vectors as the length needs (one at
//! 512 bits, two at 256, four at 128), each predicated to the outputs that exist, so a partial
//! last panel needs no spill. Rust has no SVE intrinsics: the k loop is one `asm!` block.
//!
//! The packed pair layout (`[k / 2][16][2]`) is what `BFDOT` wants: each 32-bit lane holds one
//! output's (even, odd) weights and a broadcast activation pair multiplies both. Each output
//! accumulates one pair per step in order, so results do not depend on `m`. f32 and f16 weights
//! take the NEON tiles, which are as wide as these machines' memory can feed.

use super::neon;
use crate::dispatch::GemmArgs;
use crate::packed::{PackedWeights, WeightDtype, PANEL};
use std::arch::asm;
use std::ops::Range;

/// Activation rows per tile: 4 accumulators, 1 weight and 4 activation registers.
const ROWS: usize = 4;
/// Bytes of one pair step in a panel: 16 outputs x 2 bf16.
const PAIR_BYTES: usize = 2 * PANEL * 2;

/// f32 lanes of an SVE vector.
#[target_feature(enable = "sve")]
unsafe fn lanes() -> usize {
    let n: usize;
    asm!("cntw {n}", n = out(reg) n, options(pure, nomem, nostack, preserves_flags));
    n
}

/// `ROWS` rows: `out[r][0..n] = sum over pairs of w[pair][0..n] · x[r][pair]`, where `w` points at
/// the first output's pair in the panel's first pair step and `n <= lanes()`.
#[target_feature(enable = "sve,bf16")]
unsafe fn tile_4(w: *const u16, x: [*const u16; ROWS], pairs: usize, n: usize, out: [*mut f32; ROWS]) {
    asm!(
        "dup z0.s, #0",
        "dup z1.s, #0",
        "dup z2.s, #0",
        "dup z3.s, #0",
        "whilelo p0.s, xzr, {n}",
        "whilelo p1.h, xzr, {halves}",
        "2:",
        "ld1h {{z4.h}}, p1/z, [{w}]",
        "ld1rw {{z5.s}}, p0/z, [{x0}]",
        "ld1rw {{z6.s}}, p0/z, [{x1}]",
        "ld1rw {{z7.s}}, p0/z, [{x2}]",
        "ld1rw {{z16.s}}, p0/z, [{x3}]",
        "bfdot z0.s, z4.h, z5.h",
        "bfdot z1.s, z4.h, z6.h",
        "bfdot z2.s, z4.h, z7.h",
        "bfdot z3.s, z4.h, z16.h",
        "add {w}, {w}, #{step}",
        "add {x0}, {x0}, #4",
        "add {x1}, {x1}, #4",
        "add {x2}, {x2}, #4",
        "add {x3}, {x3}, #4",
        "subs {pairs}, {pairs}, #1",
        "b.ne 2b",
        "st1w {{z0.s}}, p0, [{o0}]",
        "st1w {{z1.s}}, p0, [{o1}]",
        "st1w {{z2.s}}, p0, [{o2}]",
        "st1w {{z3.s}}, p0, [{o3}]",
        w = inout(reg) w => _,
        x0 = inout(reg) x[0] => _,
        x1 = inout(reg) x[1] => _,
        x2 = inout(reg) x[2] => _,
        x3 = inout(reg) x[3] => _,
        pairs = inout(reg) pairs => _,
        n = in(reg) n,
        halves = in(reg) 2 * n,
        o0 = in(reg) out[0],
        o1 = in(reg) out[1],
        o2 = in(reg) out[2],
        o3 = in(reg) out[3],
        step = const PAIR_BYTES,
        out("v0") _, out("v1") _, out("v2") _, out("v3") _, out("v4") _, out("v5") _, out("v6") _,
        out("v7") _, out("v16") _, out("p0") _, out("p1") _,
        options(nostack),
    );
}

/// One row, as [`tile_4`].
#[target_feature(enable = "sve,bf16")]
unsafe fn tile_1(w: *const u16, x: *const u16, pairs: usize, n: usize, out: *mut f32) {
    asm!(
        "dup z0.s, #0",
        "dup z1.s, #0",
        "whilelo p0.s, xzr, {n}",
        "whilelo p1.h, xzr, {halves}",
        "2:",
        "ld1h {{z4.h}}, p1/z, [{w}]",
        "ld1rw {{z5.s}}, p0/z, [{x}]",
        "bfdot z0.s, z4.h, z5.h",
        "add {w}, {w}, #{step}",
        "add {x}, {x}, #4",
        "subs {pairs}, {pairs}, #1",
        "b.ne 2b",
        "st1w {{z0.s}}, p0, [{o}]",
        w = inout(reg) w => _,
        x = inout(reg) x => _,
        pairs = inout(reg) pairs => _,
        n = in(reg) n,
        halves = in(reg) 2 * n,
        o = in(reg) out,
        step = const PAIR_BYTES,
        out("v0") _, out("v1") _, out("v4") _, out("v5") _, out("p0") _, out("p1") _,
        options(nostack),
    );
}

#[target_feature(enable = "sve,bf16")]
unsafe fn gemm_bf16(a: &GemmArgs, w: &PackedWeights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    let pairs = w.k.div_ceil(2);
    let (x, wp, lanes) = (a.x_bf16.as_ptr(), w.half_data().as_ptr(), lanes());
    let row_x = |r: usize| x.add(r * 2 * pairs);
    for p in panels {
        let panel_w = wp.add(p * w.panel_stride());
        let outputs = (w.n - p * PANEL).min(PANEL);
        for first in (0..outputs).step_by(lanes) {
            let n = lanes.min(outputs - first);
            let (w_chunk, col) = (panel_w.add(2 * first), p * PANEL + first);
            let whole = a.m / ROWS * ROWS;
            for r in (0..whole).step_by(ROWS) {
                let xs = std::array::from_fn(|i| row_x(r + i));
                let outs = std::array::from_fn(|i| out.add((r + i) * ldo + col));
                tile_4(w_chunk, xs, pairs, n, outs);
            }
            for r in whole..a.m {
                tile_1(w_chunk, row_x(r), pairs, n, out.add(r * ldo + col));
            }
        }
    }
}

/// # Safety
/// As [`crate::portable::gemm::gemm`], with `a.x_bf16` filled for bf16 weights; only handed out
/// after detecting sve and bf16.
pub unsafe fn gemm(a: &GemmArgs, w: &PackedWeights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    match w.dtype {
        WeightDtype::BF16 => gemm_bf16(a, w, panels, out, ldo),
        WeightDtype::F32 | WeightDtype::F16 => neon::gemm(a, w, panels, out, ldo),
    }
}
