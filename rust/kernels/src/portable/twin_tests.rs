use crate::Kernels;

fn data(n: usize, seed: f32) -> Vec<f32> {
    (0..n).map(|i| ((i as f32 + seed) * 0.731).sin()).collect()
}

pub fn check_against_portable(simd: &Kernels) {
    let reference = Kernels::portable();
    for k in [1, 3, 7, 8, 15, 16, 17, 33, 100] {
        for (m, n) in [(1, 1), (1, 5), (3, 7), (4, 3), (5, 9), (9, 2)] {
            let x = data(m * k, 1.0);
            let w = data(n * k, 2.0);
            let (mut want, mut got) = (vec![0.0; m * n], vec![0.0; m * n]);
            (reference.gemm_bt)(&x, &w, k, &mut want);
            (simd.gemm_bt)(&x, &w, k, &mut got);
            for (a, b) in want.iter().zip(&got) {
                assert!((a - b).abs() <= 1e-4 * (1.0 + a.abs()), "gemm k={k} m={m} n={n}: {a} vs {b}");
            }
            // Batch invariance: each row alone gives the same bits as inside the batch.
            for i in 0..m {
                let mut alone = vec![0.0; n];
                (simd.gemm_bt)(&x[i * k..(i + 1) * k], &w, k, &mut alone);
                assert_eq!(alone, got[i * n..(i + 1) * n], "row {i} differs alone vs batched");
                assert_eq!((simd.dot)(&x[i * k..(i + 1) * k], &w[..k]), got[i * n]);
            }
        }
        let (x, mut y1) = (data(k, 3.0), data(k, 4.0));
        let mut y2 = y1.clone();
        (reference.axpy)(0.37, &x, &mut y1);
        (simd.axpy)(0.37, &x, &mut y2);
        for (a, b) in y1.iter().zip(&y2) {
            assert!((a - b).abs() <= 1e-5, "axpy k={k}");
        }
    }
}

#[test]
fn portable_is_batch_invariant() {
    check_against_portable(&Kernels::portable());
}
