//! AVX2 + FMA (+ F16C) kernels. Safe wrappers are only reachable through [`super::kernels`],
//! which checks the CPU features first.
//!
//! GEMM tiles are up to 6 rows by one panel (12 ymm accumulators) for f32/f16 weights, 4 rows for
//! bf16, whose pairs widen with a shift (even `k`) and a mask (odd `k`). A GEMM of many rows
//! (prefill) widens each bf16 panel to f32 once per block of rows instead, then runs the f32
//! tiles over it: the widening is paid once per 48 rows, not once per 4. Every output is a
//! sequential sum over `k` either way, so results do not depend on `m`.

use crate::dispatch::GemmArgs;
use crate::packed::{PackedWeights, WeightDtype, PANEL};
use crate::portable::gemm::for_each_tile;
use std::arch::x86_64::*;
use std::ops::Range;

/// Where a tile reads and writes: activation/weight element offsets and the output corner.
struct Tile {
    x: usize,
    k: usize,
    w: usize,
    out: *mut f32,
    ldo: usize,
    cols: usize,
}

#[inline(always)]
unsafe fn store<const R: usize>(acc: &[[__m256; 2]; R], t: &Tile) {
    for (r, row) in acc.iter().enumerate() {
        let dst = t.out.add(r * t.ldo);
        if t.cols == PANEL {
            _mm256_storeu_ps(dst, row[0]);
            _mm256_storeu_ps(dst.add(8), row[1]);
        } else {
            let mut spill = [0f32; PANEL];
            _mm256_storeu_ps(spill.as_mut_ptr(), row[0]);
            _mm256_storeu_ps(spill.as_mut_ptr().add(8), row[1]);
            std::ptr::copy_nonoverlapping(spill.as_ptr(), dst, t.cols);
        }
    }
}

/// f32 or f16 weights (`load` widens 8 weights at an element offset) times f32 activations.
#[inline(always)]
unsafe fn tile_wide<const R: usize>(x: *const f32, t: &Tile, load: impl Fn(usize) -> __m256) {
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    for kk in 0..t.k {
        let w0 = load(t.w + kk * PANEL);
        let w1 = load(t.w + kk * PANEL + 8);
        for (r, a) in acc.iter_mut().enumerate() {
            let xv = _mm256_set1_ps(*x.add(t.x + r * t.k + kk));
            a[0] = _mm256_fmadd_ps(xv, w0, a[0]);
            a[1] = _mm256_fmadd_ps(xv, w1, a[1]);
        }
    }
    store(&acc, t);
}

#[inline(always)]
unsafe fn tile_bf16<const R: usize>(x: *const f32, w: *const u16, t: &Tile) {
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    let high = _mm256_set1_epi32(0xffff_0000u32 as i32);
    for kp in 0..t.k.div_ceil(2) {
        let pair0 = _mm256_loadu_si256(w.add(t.w + kp * 2 * PANEL) as *const __m256i);
        let pair1 = _mm256_loadu_si256(w.add(t.w + kp * 2 * PANEL + PANEL) as *const __m256i);
        let even = [_mm256_castsi256_ps(_mm256_slli_epi32(pair0, 16)), _mm256_castsi256_ps(_mm256_slli_epi32(pair1, 16))];
        let odd = [_mm256_castsi256_ps(_mm256_and_si256(pair0, high)), _mm256_castsi256_ps(_mm256_and_si256(pair1, high))];
        let has_odd = 2 * kp + 1 < t.k;
        for (r, a) in acc.iter_mut().enumerate() {
            let xr = x.add(t.x + r * t.k + 2 * kp);
            let x0 = _mm256_set1_ps(*xr);
            a[0] = _mm256_fmadd_ps(x0, even[0], a[0]);
            a[1] = _mm256_fmadd_ps(x0, even[1], a[1]);
            if has_odd {
                let x1 = _mm256_set1_ps(*xr.add(1));
                a[0] = _mm256_fmadd_ps(x1, odd[0], a[0]);
                a[1] = _mm256_fmadd_ps(x1, odd[1], a[1]);
            }
        }
    }
    store(&acc, t);
}

/// Rows from which a bf16 GEMM widens its panels once per row block (fewer stream the packed
/// bf16 panel directly: decode reads each weight once and widening first would only add work).
const WIDEN_FROM_ROWS: usize = 8;
/// Rows of an f32 tile, and the row block a widened panel serves.
const WIDE_ROWS: usize = 6;
const WIDE_ROW_BLOCK: usize = WIDE_ROWS * 8;

/// A bf16 panel (`[k / 2][PANEL][2]`) widened to the f32 panel layout (`[k][PANEL]`): the same
/// values `tile_bf16` widens in registers.
#[inline(always)]
unsafe fn widen_panel(w: *const u16, k: usize, out: &mut [f32]) {
    let high = _mm256_set1_epi32(0xffff_0000u32 as i32);
    let dst = out.as_mut_ptr();
    for kp in 0..k.div_ceil(2) {
        let pair0 = _mm256_loadu_si256(w.add(kp * 2 * PANEL) as *const __m256i);
        let pair1 = _mm256_loadu_si256(w.add(kp * 2 * PANEL + PANEL) as *const __m256i);
        let even = dst.add(2 * kp * PANEL);
        _mm256_storeu_ps(even, _mm256_castsi256_ps(_mm256_slli_epi32(pair0, 16)));
        _mm256_storeu_ps(even.add(8), _mm256_castsi256_ps(_mm256_slli_epi32(pair1, 16)));
        if 2 * kp + 1 < k {
            _mm256_storeu_ps(even.add(PANEL), _mm256_castsi256_ps(_mm256_and_si256(pair0, high)));
            _mm256_storeu_ps(even.add(PANEL + 8), _mm256_castsi256_ps(_mm256_and_si256(pair1, high)));
        }
    }
}

macro_rules! by_rows {
    ($rows:expr, $f:ident, $args:tt) => {
        match $rows {
            1 => $f::<1> $args,
            2 => $f::<2> $args,
            3 => $f::<3> $args,
            4 => $f::<4> $args,
            5 => $f::<5> $args,
            6 => $f::<6> $args,
            _ => unreachable!("tiles have 1..=6 rows"),
        }
    };
}

/// bf16 weights for many rows: each panel widened once per row block, then f32 tiles.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gemm_bf16_widened(a: &GemmArgs, w: &PackedWeights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    let (k, stride, x) = (w.k, w.panel_stride(), a.x.as_ptr());
    let mut widened = vec![0f32; k * PANEL];
    let wp = widened.as_ptr();
    for block in (0..a.m).step_by(WIDE_ROW_BLOCK) {
        let block_end = (block + WIDE_ROW_BLOCK).min(a.m);
        for panel in panels.clone() {
            widen_panel(w.half_data().as_ptr().add(panel * stride), k, &mut widened);
            let cols = (w.n - panel * PANEL).min(PANEL);
            for row in (block..block_end).step_by(WIDE_ROWS) {
                let rows = WIDE_ROWS.min(block_end - row);
                let t = Tile { x: row * k, k, w: 0, out: out.add(row * ldo + panel * PANEL), ldo, cols };
                by_rows!(rows, tile_wide, (x, &t, |at: usize| _mm256_loadu_ps(wp.add(at))));
            }
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gemm_avx2(a: &GemmArgs, w: &PackedWeights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    if w.dtype == WeightDtype::BF16 && a.m >= WIDEN_FROM_ROWS {
        return gemm_bf16_widened(a, w, panels, out, ldo);
    }
    let (k, stride) = (w.k, w.panel_stride());
    let max_rows = if w.dtype == WeightDtype::BF16 { 4 } else { 6 };
    let x = a.x.as_ptr();
    for_each_tile(a.m, panels, max_rows, 1, |row, rows, panel, _| {
        let cols = (w.n - panel * PANEL).min(PANEL);
        let t = Tile { x: row * k, k, w: panel * stride, out: out.add(row * ldo + panel * PANEL), ldo, cols };
        match w.dtype {
            WeightDtype::BF16 => by_rows!(rows, tile_bf16, (x, w.half_data().as_ptr(), &t)),
            WeightDtype::F32 => {
                let wp = w.f32_data().as_ptr();
                by_rows!(rows, tile_wide, (x, &t, |at: usize| _mm256_loadu_ps(wp.add(at))))
            }
            WeightDtype::F16 => {
                let wp = w.half_data().as_ptr();
                by_rows!(rows, tile_wide, (x, &t, |at: usize| _mm256_cvtph_ps(_mm_loadu_si128(wp.add(at) as *const __m128i))))
            }
        }
    });
}

/// # Safety
/// As [`crate::portable::gemm::gemm`]; only handed out after detecting avx2, fma and f16c.
pub unsafe fn gemm(a: &GemmArgs, w: &PackedWeights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    gemm_avx2(a, w, panels, out, ldo)
}

