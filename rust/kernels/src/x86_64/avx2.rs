//! AVX2 + FMA kernels. Safe wrappers are only reachable through [`super::kernels`], which checks
//! the CPU features first.

use std::arch::x86_64::*;

/// Dot products of `R` rows of `x` against one row `w`. The per-row arithmetic is the same for
/// every `R`, so a row gets identical bits whether it is computed alone or with others.
#[inline(always)]
unsafe fn dot_rows<const R: usize>(xs: [&[f32]; R], w: &[f32]) -> [f32; R] {
    let k = w.len();
    let mut acc0 = [_mm256_setzero_ps(); R];
    let mut acc1 = [_mm256_setzero_ps(); R];
    let mut i = 0;
    while i + 16 <= k {
        let w0 = _mm256_loadu_ps(w.as_ptr().add(i));
        let w1 = _mm256_loadu_ps(w.as_ptr().add(i + 8));
        for r in 0..R {
            acc0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xs[r].as_ptr().add(i)), w0, acc0[r]);
            acc1[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xs[r].as_ptr().add(i + 8)), w1, acc1[r]);
        }
        i += 16;
    }
    if i + 8 <= k {
        let w0 = _mm256_loadu_ps(w.as_ptr().add(i));
        for r in 0..R {
            acc0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xs[r].as_ptr().add(i)), w0, acc0[r]);
        }
        i += 8;
    }
    let mut out = [0f32; R];
    for r in 0..R {
        let mut sum = hsum(_mm256_add_ps(acc0[r], acc1[r]));
        for j in i..k {
            sum += xs[r][j] * w[j];
        }
        out[r] = sum;
    }
    out
}

#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let quad = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
    _mm_cvtss_f32(_mm_add_ss(pair, _mm_shuffle_ps(pair, pair, 1)))
}

#[target_feature(enable = "avx2,fma")]
unsafe fn gemm_bt_avx2(x: &[f32], w: &[f32], k: usize, out: &mut [f32]) {
    crate::portable::gemm_bt_rows4(x, w, k, out, |xs, w| dot_rows::<4>(xs, w), |x, w| dot_rows::<1>([x], w)[0]);
}

#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(x: &[f32], y: &[f32]) -> f32 {
    dot_rows::<1>([x], y)[0]
}

#[target_feature(enable = "avx2,fma")]
unsafe fn axpy_avx2(a: f32, x: &[f32], y: &mut [f32]) {
    let n = x.len();
    let va = _mm256_set1_ps(a);
    let mut i = 0;
    while i + 8 <= n {
        let yv = _mm256_fmadd_ps(va, _mm256_loadu_ps(x.as_ptr().add(i)), _mm256_loadu_ps(y.as_ptr().add(i)));
        _mm256_storeu_ps(y.as_mut_ptr().add(i), yv);
        i += 8;
    }
    for j in i..n {
        y[j] += a * x[j];
    }
}

pub fn gemm_bt(x: &[f32], w: &[f32], k: usize, out: &mut [f32]) {
    // SAFETY: only handed out by `super::kernels` after detecting avx2 and fma.
    unsafe { gemm_bt_avx2(x, w, k, out) }
}

pub fn dot(x: &[f32], y: &[f32]) -> f32 {
    assert_eq!(x.len(), y.len());
    // SAFETY: as above.
    unsafe { dot_avx2(x, y) }
}

pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len());
    // SAFETY: as above.
    unsafe { axpy_avx2(a, x, y) }
}
