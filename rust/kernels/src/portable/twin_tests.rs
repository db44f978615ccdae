use crate::dispatch::GemmArgs;
use crate::packed::{activations_to_bf16, PackedWeights, WeightDtype};
use crate::Kernels;

fn data(n: usize, seed: f32) -> Vec<f32> {
    (0..n).map(|i| ((i as f32 + seed) * 0.731).sin()).collect()
}

fn run_gemm(kern: &Kernels, x: &[f32], w: &PackedWeights, panels: std::ops::Range<usize>) -> Vec<f32> {
    let m = x.len() / w.k;
    let mut x_bf16 = Vec::new();
    if kern.bf16_activations && w.dtype == WeightDtype::BF16 {
        activations_to_bf16(x, w.k, &mut x_bf16);
    }
    let mut out = vec![f32::NAN; m * w.n];
    // SAFETY: `out` is [m, n] and this thread is its only user.
    unsafe { (kern.gemm)(&GemmArgs { m, x, x_bf16: &x_bf16 }, w, panels, out.as_mut_ptr(), w.n) };
    out
}

/// Compares a SIMD GEMM with the portable one for every weight dtype on odd sizes, and checks
/// that a row computed alone, or a panel range computed apart, gives the same bits as the whole.
fn check_gemm(simd: &Kernels) {
    let reference = Kernels::portable();
    for dtype in [WeightDtype::F32, WeightDtype::F16, WeightDtype::BF16] {
        for k in [1, 3, 7, 16, 17, 33, 100] {
            for (m, n) in [(1, 1), (1, 37), (3, 7), (5, 48), (13, 17), (14, 65), (29, 33)] {
                let x = data(m * k, 1.0);
                let w = PackedWeights::pack(&data(n * k, 2.0), n, k, dtype);
                let want = run_gemm(&reference, &x, &w, 0..w.panels());
                let got = run_gemm(simd, &x, &w, 0..w.panels());
                // bf16-rounded activations cost up to 2^-8 relative per product.
                let tol = if simd.bf16_activations && dtype == WeightDtype::BF16 { 1e-2 } else { 1e-5 } * k as f32;
                for (i, (a, b)) in want.iter().zip(&got).enumerate() {
                    assert!((a - b).abs() <= tol, "{} {dtype:?} k={k} m={m} n={n} at {i}: {a} vs {b}", simd.isa);
                }
                for i in 0..m {
                    let alone = run_gemm(simd, &x[i * k..(i + 1) * k], &w, 0..w.panels());
                    assert_eq!(alone, got[i * n..(i + 1) * n], "{} {dtype:?}: row {i} differs alone vs batched", simd.isa);
                }
                let cut = w.panels() / 2;
                let (mut left, right) = (run_gemm(simd, &x, &w, 0..cut), run_gemm(simd, &x, &w, cut..w.panels()));
                for (l, r) in left.iter_mut().zip(&right) {
                    if l.is_nan() {
                        *l = *r;
                    }
                }
                assert_eq!(left, got, "{} {dtype:?}: split panel ranges differ", simd.isa);
            }
        }
    }
}

pub fn check_against_portable(simd: &Kernels) {
    check_gemm(simd);
    let reference = Kernels::portable();
    for k in [1, 3, 7, 8, 15, 16, 17, 33, 100] {
        let (x, y) = (data(k, 1.0), data(k, 2.0));
        let (a, b) = ((reference.dot)(&x, &y), (simd.dot)(&x, &y));
        assert!((a - b).abs() <= 1e-5 * k as f32, "{} dot k={k}: {a} vs {b}", simd.isa);
        let (x, mut y1) = (data(k, 3.0), data(k, 4.0));
        let mut y2 = y1.clone();
        (reference.axpy)(0.37, &x, &mut y1);
        (simd.axpy)(0.37, &x, &mut y2);
        for (a, b) in y1.iter().zip(&y2) {
            assert!((a - b).abs() <= 1e-5, "{} axpy k={k}", simd.isa);
        }
    }
}

#[test]
fn portable_is_batch_invariant() {
    check_against_portable(&Kernels::portable());
}
