//! AVX-512 GEMMs (need avx512f/bw/vl and avx512_bf16: Zen 4, Sapphire Rapids, Cooper Lake).
//! f32 and f16 weights widen to f32 and use FMA. bf16 weights go one of two ways, each a path of
//! its own ([`super::paths`] orders them by CPU):
//! - `gemm_bf16_dot`: bf16-rounded activations times the weight pairs with `vdpbf16ps`, twice the
//!   FMA rate where it runs at full rate (Zen 4/5).
//! - `gemm`: f32 activations times the weights widened to f32 in registers, with FMA (32
//!   registers leave room for the widened pairs beside 24 accumulators, so unlike AVX2 no tile
//!   needs the panel widened ahead). On an Intel Xeon with AMX (2 threads, 512-token prefill at
//!   Llama-3.2-1B shapes) `vdpbf16ps` ran at 69-78 tok/s and this path at 101-116.
//!
//! A tile is up to 12 rows by 2 panels (24 zmm accumulators), 1-2 rows by up to 4 panels in
//! decode; every output is a sequential sum over `k`, so results do not depend on `m`.

use crate::dispatch::GemmArgs;
use crate::packed::{PackedWeights, WeightDtype, PANEL};
use crate::portable::gemm::for_each_tile;
use std::arch::x86_64::*;
use std::ops::Range;

const MAX_ROWS: usize = 12;
const PANELS_PER_TILE: usize = 2;
/// Panels a one-row tile of the widening GEMM spans (4 independent FMA chains; two rows, half).
const DECODE_PANELS: usize = 4;
/// Tiles of at most this many rows (decode) stream weights at the memory's pace: each panel's
/// next [`PREFETCH_BYTES`] are requested ahead of the hardware prefetcher, which restarts at
/// every 4 KiB page. Measured on batch-1 decode's weight stream (a Zen 5 KVM guest, 2 threads,
/// weights still in 4 KiB pages then): +3–5% when the memory delivers 60+ GB/s, within 1% either
/// way at 45 GB/s.
const PREFETCH_MAX_ROWS: usize = 2;
const PREFETCH_BYTES: usize = 1024;

/// Where a tile reads and writes.
struct Tile {
    /// Activation row of the tile's first row, and elements between rows.
    x: usize,
    x_stride: usize,
    /// First weight element of the tile's first panel, and elements between panels.
    w: usize,
    w_stride: usize,
    /// Output element of the tile's top-left corner; valid columns from there.
    out: *mut f32,
    ldo: usize,
    cols: usize,
}

#[inline(always)]
unsafe fn store<const R: usize, const NP: usize>(acc: &[[__m512; NP]; R], t: &Tile) {
    for (r, row) in acc.iter().enumerate() {
        for (p, v) in row.iter().enumerate() {
            let dst = t.out.add(r * t.ldo + p * PANEL);
            let valid = t.cols.saturating_sub(p * PANEL);
            if valid >= PANEL {
                _mm512_storeu_ps(dst, *v);
            } else if valid > 0 {
                _mm512_mask_storeu_ps(dst, ((1u32 << valid) - 1) as u16, *v);
            }
        }
    }
}

#[inline(always)]
unsafe fn tile_bf16<const R: usize, const NP: usize>(x: *const u16, w: *const u16, pairs: usize, t: &Tile) {
    let mut acc = [[_mm512_setzero_ps(); NP]; R];
    for kp in 0..pairs {
        let mut wv = [_mm512_setzero_si512(); NP];
        for (p, v) in wv.iter_mut().enumerate() {
            let at = w.add(t.w + p * t.w_stride + kp * 2 * PANEL);
            if R <= PREFETCH_MAX_ROWS {
                // Near the end of the weights this points past them: a prefetch never faults.
                _mm_prefetch::<_MM_HINT_T0>(at.cast::<i8>().wrapping_add(PREFETCH_BYTES));
            }
            *v = _mm512_loadu_si512(at as *const _);
        }
        for (r, row) in acc.iter_mut().enumerate() {
            let xv = _mm512_set1_epi32((x.add(t.x + r * t.x_stride + 2 * kp) as *const i32).read_unaligned());
            for (a, v) in row.iter_mut().zip(&wv) {
                *a = _mm512_dpbf16_ps(*a, std::mem::transmute::<__m512i, __m512bh>(xv), std::mem::transmute::<__m512i, __m512bh>(*v));
            }
        }
    }
    store(&acc, t);
}

/// f32 or f16 weights (`load` widens 16 weights at an element offset) times f32 activations.
#[inline(always)]
unsafe fn tile_wide<const R: usize, const NP: usize>(x: *const f32, k: usize, t: &Tile, load: impl Fn(usize) -> __m512) {
    let mut acc = [[_mm512_setzero_ps(); NP]; R];
    for kk in 0..k {
        let mut wv = [_mm512_setzero_ps(); NP];
        for (p, v) in wv.iter_mut().enumerate() {
            *v = load(t.w + p * t.w_stride + kk * PANEL);
        }
        for (r, row) in acc.iter_mut().enumerate() {
            let xv = _mm512_set1_ps(*x.add(t.x + r * t.x_stride + kk));
            for (a, v) in row.iter_mut().zip(&wv) {
                *a = _mm512_fmadd_ps(xv, *v, *a);
            }
        }
    }
    store(&acc, t);
}

/// bf16 weights times f32 activations: each 16-column pair vector widens in registers, a shift
/// for even `k` and a mask for odd `k`, then FMA in order of `k`.
#[inline(always)]
unsafe fn tile_bf16_wide<const R: usize, const NP: usize>(x: *const f32, k: usize, w: *const u16, t: &Tile) {
    let mut acc = [[_mm512_setzero_ps(); NP]; R];
    let high = _mm512_set1_epi32(0xffff_0000u32 as i32);
    for kp in 0..k.div_ceil(2) {
        let (mut even, mut odd) = ([_mm512_setzero_ps(); NP], [_mm512_setzero_ps(); NP]);
        for p in 0..NP {
            let at = w.add(t.w + p * t.w_stride + kp * 2 * PANEL);
            if R <= PREFETCH_MAX_ROWS {
                _mm_prefetch::<_MM_HINT_T0>(at.cast::<i8>().wrapping_add(PREFETCH_BYTES));
            }
            let pairs = _mm512_loadu_si512(at as *const _);
            even[p] = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(pairs));
            odd[p] = _mm512_castsi512_ps(_mm512_and_si512(pairs, high));
        }
        let has_odd = 2 * kp + 1 < k;
        for (r, row) in acc.iter_mut().enumerate() {
            let xr = x.add(t.x + r * t.x_stride + 2 * kp);
            let x0 = _mm512_set1_ps(*xr);
            for (a, e) in row.iter_mut().zip(&even) {
                *a = _mm512_fmadd_ps(x0, *e, *a);
            }
            if has_odd {
                let x1 = _mm512_set1_ps(*xr.add(1));
                for (a, o) in row.iter_mut().zip(&odd) {
                    *a = _mm512_fmadd_ps(x1, *o, *a);
                }
            }
        }
    }
    store(&acc, t);
}

/// Tiles of one or two rows span up to [`DECODE_PANELS`] / rows panels; taller tiles one or two.
macro_rules! by_shape {
    ($rows:expr, $np:expr, $f:ident, $args:tt) => {
        by_tile_shape!(
            $rows,
            $np,
            $f,
            $args,
            [(3, 1)(3, 2)(4, 1)(4, 2)(5, 1)(5, 2)(6, 1)(6, 2)(7, 1)(7, 2)(8, 1)(8, 2)(9, 1)(9, 2)(10, 1)(10, 2)(11, 1)(11, 2)(12, 1)(12, 2)]
        )
    };
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,fma,f16c")]
unsafe fn gemm_avx512(a: &GemmArgs, w: &PackedWeights, panels: Range<usize>, out: *mut f32, ldo: usize, bf16_dot: bool) {
    let widening = w.dtype == WeightDtype::BF16 && !bf16_dot;
    let k = w.k;
    let stride = w.panel_stride();
    let panels_per_tile = if widening && a.m <= 2 { DECODE_PANELS / a.m } else { PANELS_PER_TILE };
    for_each_tile(a.m, panels, MAX_ROWS, panels_per_tile, |row, rows, panel, np| {
        let cols = (w.n - panel * PANEL).min(np * PANEL);
        let mut t = Tile { x: row * k, x_stride: k, w: panel * stride, w_stride: stride, out: out.add(row * ldo + panel * PANEL), ldo, cols };
        match w.dtype {
            WeightDtype::BF16 if widening => by_shape!(rows, np, tile_bf16_wide, (a.x.as_ptr(), k, w.half_data().as_ptr(), &t)),
            WeightDtype::BF16 => {
                let pairs = k.div_ceil(2);
                (t.x, t.x_stride) = (row * 2 * pairs, 2 * pairs);
                let (x, wp) = (a.x_bf16.as_ptr(), w.half_data().as_ptr());
                by_shape!(rows, np, tile_bf16, (x, wp, pairs, &t))
            }
            WeightDtype::F32 => {
                let wp = w.f32_data().as_ptr();
                let load = |at: usize| _mm512_loadu_ps(wp.add(at));
                by_shape!(rows, np, tile_wide, (a.x.as_ptr(), k, &t, load))
            }
            WeightDtype::F16 => {
                let wp = w.half_data().as_ptr();
                let load = |at: usize| _mm512_cvtph_ps(_mm256_loadu_si256(wp.add(at) as *const __m256i));
                by_shape!(rows, np, tile_wide, (a.x.as_ptr(), k, &t, load))
            }
        }
    });
}

/// The widening GEMM (f32 activations).
///
/// # Safety
/// As [`crate::portable::gemm::gemm`]; only handed out after detecting the CPU features.
pub unsafe fn gemm(a: &GemmArgs, w: &PackedWeights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    gemm_avx512(a, w, panels, out, ldo, false)
}

/// The `vdpbf16ps` GEMM (bf16-rounded activations for bf16 weights).
///
/// # Safety
/// As [`gemm`].
pub unsafe fn gemm_bf16_dot(a: &GemmArgs, w: &PackedWeights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    gemm_avx512(a, w, panels, out, ldo, true)
}

pub fn detected() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512bf16")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}
