use super::*;

#[test]
fn dot_matches_naive_f64() {
    for n in [0, 1, 7, 8, 9, 31, 33, 100] {
        let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
        let y: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
        let want: f64 = x.iter().zip(&y).map(|(a, b)| *a as f64 * *b as f64).sum();
        assert!((dot(&x, &y) as f64 - want).abs() < 1e-4, "n={n}");
    }
}

#[test]
fn softmax_sums_to_one_and_keeps_order() {
    let mut x = vec![1.0, 3.0, -2.0, 3.5];
    softmax(&mut x);
    assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    assert!(x[3] > x[1] && x[1] > x[0] && x[0] > x[2]);
}

#[test]
fn rope_at_position_zero_is_identity_and_preserves_norm() {
    let mut h = vec![1.0, 2.0, 3.0, 4.0];
    rope_neox(&mut h, &[1.0, 1.0], &[0.0, 0.0]);
    assert_eq!(h, vec![1.0, 2.0, 3.0, 4.0]);
    let (c, s) = (0.3f32.cos(), 0.3f32.sin());
    rope_neox(&mut h, &[c, c], &[s, s]);
    let norm: f32 = h.iter().map(|v| v * v).sum();
    assert!((norm - 30.0).abs() < 1e-4);
}

#[test]
fn rmsnorm_of_constant_is_weight() {
    let x = vec![2.0; 5];
    let mut out = vec![0.0; 5];
    rmsnorm(&x, &[1.0, 2.0, 3.0, 4.0, 5.0], 0.0, &mut out);
    assert_eq!(out, vec![1.0, 2.0, 3.0, 4.0, 5.0]);
}
