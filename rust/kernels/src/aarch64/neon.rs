//! NEON kernels. Reachable only through [`super::kernels`], which checks the CPU first.

use std::arch::aarch64::*;

/// Dot products of `R` rows of `x` against one row `w`, with per-row arithmetic independent
/// of `R` (a row gets identical bits alone or in a batch).
#[inline(always)]
unsafe fn dot_rows<const R: usize>(xs: [&[f32]; R], w: &[f32]) -> [f32; R] {
    let k = w.len();
    let mut acc0 = [vdupq_n_f32(0.0); R];
    let mut acc1 = [vdupq_n_f32(0.0); R];
    let mut i = 0;
    while i + 8 <= k {
        let w0 = vld1q_f32(w.as_ptr().add(i));
        let w1 = vld1q_f32(w.as_ptr().add(i + 4));
        for r in 0..R {
            acc0[r] = vfmaq_f32(acc0[r], vld1q_f32(xs[r].as_ptr().add(i)), w0);
            acc1[r] = vfmaq_f32(acc1[r], vld1q_f32(xs[r].as_ptr().add(i + 4)), w1);
        }
        i += 8;
    }
    let mut out = [0f32; R];
    for r in 0..R {
        let mut sum = vaddvq_f32(vaddq_f32(acc0[r], acc1[r]));
        for j in i..k {
            sum += xs[r][j] * w[j];
        }
        out[r] = sum;
    }
    out
}

#[target_feature(enable = "neon")]
unsafe fn gemm_bt_neon(x: &[f32], w: &[f32], k: usize, out: &mut [f32]) {
    crate::portable::gemm_bt_rows4(x, w, k, out, |xs, w| dot_rows::<4>(xs, w), |x, w| dot_rows::<1>([x], w)[0]);
}

#[target_feature(enable = "neon")]
unsafe fn axpy_neon(a: f32, x: &[f32], y: &mut [f32]) {
    let n = x.len();
    let mut i = 0;
    while i + 4 <= n {
        let yv = vfmaq_n_f32(vld1q_f32(y.as_ptr().add(i)), vld1q_f32(x.as_ptr().add(i)), a);
        vst1q_f32(y.as_mut_ptr().add(i), yv);
        i += 4;
    }
    for j in i..n {
        y[j] += a * x[j];
    }
}

pub fn gemm_bt(x: &[f32], w: &[f32], k: usize, out: &mut [f32]) {
    // SAFETY: only handed out by `super::kernels` after detecting neon.
    unsafe { gemm_bt_neon(x, w, k, out) }
}

pub fn dot(x: &[f32], y: &[f32]) -> f32 {
    assert_eq!(x.len(), y.len());
    // SAFETY: as above.
    unsafe { dot_rows::<1>([x], y)[0] }
}

pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len());
    // SAFETY: as above.
    unsafe { axpy_neon(a, x, y) }
}
