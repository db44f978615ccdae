//! AVX2 + FMA (+ F16C) kernels. Safe wrappers are only reachable through [`super::kernels`],
//! which checks the CPU features first.
//!
//! GEMM tiles are up to 6 rows by one panel (12 ymm accumulators) for f32/f16 weights, 4 rows for
//! bf16, whose pairs widen with a shift (even `k`) and a mask (odd `k`). A tile of one or two
//! rows (decode) spans several panels instead: each accumulator is one chain of dependent FMAs,
//! and two chains per row cannot keep up with the memory (one ymm of weights per FMA latency).
//! A GEMM of many rows (prefill) widens each bf16 panel to f32 once per block of rows, then runs
//! the f32 tiles over it: the widening is paid once per 48 rows, not once per 4. Every output is
//! a sequential sum over `k` either way, so results do not depend on `m`.

use crate::dispatch::GemmArgs;
use crate::packed::{PackedWeights, WeightDtype, PANEL};
use crate::portable::gemm::for_each_tile;
use std::arch::x86_64::*;
use std::ops::Range;

/// Where a tile reads and writes: activation/weight element offsets and the output corner.
struct Tile {
    x: usize,
    k: usize,
    /// First weight element of the tile's first panel, and elements between panels.
    w: usize,
    w_stride: usize,
    out: *mut f32,
    ldo: usize,
    /// Valid output columns from `out` on (over all the tile's panels).
    cols: usize,
}

#[inline(always)]
unsafe fn store<const R: usize, const NP: usize>(acc: &[[[__m256; 2]; NP]; R], t: &Tile) {
    for (r, row) in acc.iter().enumerate() {
        for (p, halves) in row.iter().enumerate() {
            let dst = t.out.add(r * t.ldo + p * PANEL);
            let valid = t.cols.saturating_sub(p * PANEL).min(PANEL);
            if valid == PANEL {
                _mm256_storeu_ps(dst, halves[0]);
                _mm256_storeu_ps(dst.add(8), halves[1]);
            } else if valid > 0 {
                let mut spill = [0f32; PANEL];
                _mm256_storeu_ps(spill.as_mut_ptr(), halves[0]);
                _mm256_storeu_ps(spill.as_mut_ptr().add(8), halves[1]);
                std::ptr::copy_nonoverlapping(spill.as_ptr(), dst, valid);
            }
        }
    }
}

/// Tiles of at most this many rows (decode) request each panel's next [`PREFETCH_BYTES`] ahead
/// of the hardware prefetcher, which stops at every 4 KiB page. Measured on batch-1 bf16 decode
/// of the default model's shape (Xeon, AVX2 path forced, 2 threads, 3 alternated rounds):
/// 99-108 against 72-92 tok/s.
const PREFETCH_MAX_ROWS: usize = 2;
const PREFETCH_BYTES: usize = 1024;

/// f32 or f16 weights (`load` widens 8 weights at an element offset; `weights` is their base
/// and element size, for prefetching) times f32 activations.
#[inline(always)]
unsafe fn tile_wide<const R: usize, const NP: usize>(x: *const f32, t: &Tile, weights: (*const i8, usize), load: impl Fn(usize) -> __m256) {
    let (prefetch_base, elem_bytes) = weights;
    let mut acc = [[[_mm256_setzero_ps(); 2]; NP]; R];
    for kk in 0..t.k {
        let mut wv = [[_mm256_setzero_ps(); 2]; NP];
        for (p, v) in wv.iter_mut().enumerate() {
            let at = t.w + p * t.w_stride + kk * PANEL;
            if R <= PREFETCH_MAX_ROWS {
                _mm_prefetch::<_MM_HINT_T0>(prefetch_base.wrapping_add(at * elem_bytes + PREFETCH_BYTES));
            }
            *v = [load(at), load(at + 8)];
        }
        for (r, row) in acc.iter_mut().enumerate() {
            let xv = _mm256_set1_ps(*x.add(t.x + r * t.k + kk));
            for (a, v) in row.iter_mut().zip(&wv) {
                a[0] = _mm256_fmadd_ps(xv, v[0], a[0]);
                a[1] = _mm256_fmadd_ps(xv, v[1], a[1]);
            }
        }
    }
    store(&acc, t);
}

#[inline(always)]
unsafe fn tile_bf16<const R: usize, const NP: usize>(x: *const f32, w: *const u16, t: &Tile) {
    let mut acc = [[[_mm256_setzero_ps(); 2]; NP]; R];
    let high = _mm256_set1_epi32(0xffff_0000u32 as i32);
    for kp in 0..t.k.div_ceil(2) {
        let has_odd = 2 * kp + 1 < t.k;
        for p in 0..NP {
            let at = w.add(t.w + p * t.w_stride + kp * 2 * PANEL);
            if R <= PREFETCH_MAX_ROWS {
                _mm_prefetch::<_MM_HINT_T0>(at.cast::<i8>().wrapping_add(PREFETCH_BYTES));
            }
            let pair0 = _mm256_loadu_si256(at as *const __m256i);
            let pair1 = _mm256_loadu_si256(at.add(PANEL) as *const __m256i);
            let even = [_mm256_castsi256_ps(_mm256_slli_epi32(pair0, 16)), _mm256_castsi256_ps(_mm256_slli_epi32(pair1, 16))];
            let odd = [_mm256_castsi256_ps(_mm256_and_si256(pair0, high)), _mm256_castsi256_ps(_mm256_and_si256(pair1, high))];
            for (r, row) in acc.iter_mut().enumerate() {
                let a = &mut row[p];
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

/// Tiles of one or two rows span up to [`DECODE_PANELS`] / rows panels; taller tiles one panel.
macro_rules! by_shape {
    ($rows:expr, $np:expr, $f:ident, $args:tt) => {
        by_tile_shape!($rows, $np, $f, $args, [(3, 1)(4, 1)(5, 1)(6, 1)])
    };
}

/// Panels a one-row tile spans (8 independent accumulator chains); a two-row tile spans half.
const DECODE_PANELS: usize = 4;

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
                let t = Tile { x: row * k, k, w: 0, w_stride: 0, out: out.add(row * ldo + panel * PANEL), ldo, cols };
                by_shape!(rows, 1, tile_wide, (x, &t, (wp.cast(), 4), |at: usize| _mm256_loadu_ps(wp.add(at))));
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
    let panels_per_tile = if a.m <= 2 { DECODE_PANELS / a.m } else { 1 };
    let x = a.x.as_ptr();
    for_each_tile(a.m, panels, max_rows, panels_per_tile, |row, rows, panel, np| {
        let cols = (w.n - panel * PANEL).min(np * PANEL);
        let t = Tile { x: row * k, k, w: panel * stride, w_stride: stride, out: out.add(row * ldo + panel * PANEL), ldo, cols };
        match w.dtype {
            WeightDtype::BF16 => by_shape!(rows, np, tile_bf16, (x, w.half_data().as_ptr(), &t)),
            WeightDtype::F32 => {
                let wp = w.f32_data().as_ptr();
                by_shape!(rows, np, tile_wide, (x, &t, (wp.cast(), 4), |at: usize| _mm256_loadu_ps(wp.add(at))))
            }
            WeightDtype::F16 => {
                let wp = w.half_data().as_ptr();
                by_shape!(rows, np, tile_wide, (x, &t, (wp.cast(), 2), |at: usize| _mm256_cvtph_ps(_mm_loadu_si128(wp.add(at) as *const __m128i))))
            }
        }
    });
}

/// # Safety
/// As [`crate::portable::gemm::gemm`]; only handed out after detecting avx2, fma and f16c.
pub unsafe fn gemm(a: &GemmArgs, w: &PackedWeights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    gemm_avx2(a, w, panels, out, ldo)
}
