//! NEON kernels. Reachable only through [`super::kernels`], which checks the CPU first.

use std::arch::aarch64::*;

/// A dot product with two 4-lane partial sums (attention scores).
#[inline(always)]
unsafe fn dot_lanes(x: &[f32], w: &[f32]) -> f32 {
    let k = w.len();
    let (mut acc0, mut acc1) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
    let mut i = 0;
    while i + 8 <= k {
        acc0 = vfmaq_f32(acc0, vld1q_f32(x.as_ptr().add(i)), vld1q_f32(w.as_ptr().add(i)));
        acc1 = vfmaq_f32(acc1, vld1q_f32(x.as_ptr().add(i + 4)), vld1q_f32(w.as_ptr().add(i + 4)));
        i += 8;
    }
    let mut sum = vaddvq_f32(vaddq_f32(acc0, acc1));
    for j in i..k {
        sum += x[j] * w[j];
    }
    sum
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

pub fn dot(x: &[f32], y: &[f32]) -> f32 {
    assert_eq!(x.len(), y.len());
    // SAFETY: only handed out by `super::paths` after detecting neon.
    unsafe { dot_lanes(x, y) }
}

pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len());
    // SAFETY: as above.
    unsafe { axpy_neon(a, x, y) }
}
