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
    for style in [RopeStyle::Neox, RopeStyle::GptJ] {
        let (mut cos, mut sin) = (vec![0.0; 4], vec![0.0; 4]);
        let mut h = vec![1.0, 2.0, 3.0, 4.0];
        rope_tables(&[0.0, 0.0], style, &mut cos, &mut sin);
        rope(&mut h, &cos, &sin, style);
        assert_eq!(h, vec![1.0, 2.0, 3.0, 4.0]);
        rope_tables(&[0.3, 1.1], style, &mut cos, &mut sin);
        rope(&mut h, &cos, &sin, style);
        let norm: f32 = h.iter().map(|v| v * v).sum();
        assert!((norm - 30.0).abs() < 1e-4);
    }
}

#[test]
fn rope_styles_pair_elements_as_documented() {
    // A quarter turn maps (x0, x1) to (-x1, x0) for each rotated pair.
    let quarter = std::f64::consts::FRAC_PI_2;
    let (mut cos, mut sin) = (vec![0.0; 4], vec![0.0; 4]);
    let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-6);
    rope_tables(&[quarter, quarter], RopeStyle::Neox, &mut cos, &mut sin);
    let mut h = vec![1.0, 2.0, 3.0, 4.0];
    rope(&mut h, &cos, &sin, RopeStyle::Neox);
    assert!(close(&h, &[-3.0, -4.0, 1.0, 2.0]), "{h:?}");
    rope_tables(&[quarter, quarter], RopeStyle::GptJ, &mut cos, &mut sin);
    let mut h = vec![1.0, 2.0, 3.0, 4.0];
    rope(&mut h, &cos, &sin, RopeStyle::GptJ);
    assert!(close(&h, &[-2.0, 1.0, -4.0, 3.0]), "{h:?}");
}

#[test]
fn add_rmsnorm_of_constant_is_weight() {
    let mut x = vec![1.0; 5];
    let mut out = vec![0.0; 5];
    add_rmsnorm(&mut x, Some(&[1.0; 5]), &[1.0, 2.0, 3.0, 4.0, 5.0], 0.0, &mut out);
    assert_eq!(x, vec![2.0; 5]);
    assert_eq!(out, vec![1.0, 2.0, 3.0, 4.0, 5.0]);
}

#[test]
fn top_k_ranks_by_value_then_index() {
    let x = [1.0, 5.0, f32::NAN, 5.0, -1.0, 7.0];
    let mut out = Vec::new();
    top_k(&x, 3, &mut out);
    assert_eq!(out, vec![(7.0, 5), (5.0, 1), (5.0, 3)]);
    top_k(&x, 0, &mut out);
    assert!(out.is_empty());
    assert_eq!(argmax(&x), 5);
}

#[test]
fn token_mask_keeps_allowed_bits_only() {
    let mut logits = vec![1.0; 40];
    apply_token_mask(&mut logits, &[0b101, 1 << 7]);
    let kept: Vec<usize> = (0..40).filter(|&i| logits[i] == 1.0).collect();
    assert_eq!(kept, vec![0, 2, 39]);
}

#[test]
fn ln_is_within_two_ulp() {
    let mut x = 1.0e-30f32;
    while x < 1.0e30 {
        let (got, want) = (ln(x) as f64, (x as f64).ln());
        let ulp = (want.abs() as f32).max(f32::MIN_POSITIVE);
        let ulp = (f32::from_bits(ulp.to_bits() + 1) - ulp) as f64;
        assert!((got - want).abs() <= 2.0 * ulp, "ln({x}) = {got}, want {want}");
        x *= 1.013;
    }
    assert_eq!(ln(1.0), 0.0);
}

#[test]
fn exp_is_within_two_ulp_and_clamps() {
    for i in -87_000..88_000 {
        let x = i as f32 * 1e-3 + 3.7e-4;
        let (got, want) = (exp(x) as f64, (x as f64).exp());
        let ulp = f32::EPSILON as f64 * want;
        assert!((got - want).abs() <= 2.0 * ulp, "exp({x}) = {got}, want {want}");
    }
    assert_eq!(exp(-200.0), exp(-87.4));
    assert!((exp(-200.0) / f32::MIN_POSITIVE - 1.0).abs() < 1e-5);
    assert_eq!(exp(200.0), exp(88.0));
}

#[test]
fn partials_add_in_the_documented_tree() {
    let mut lanes = [0f32; SUM_LANES];
    lanes[0] = 1e8;
    lanes[8] = -1e8;
    lanes[1] = 1.0;
    // (1e8 + -1e8) + 1 = 1: lane 1 would be lost if it met 1e8 before -1e8 cancelled it.
    assert_eq!(add_partials(lanes), 1.0);
    let x: Vec<f32> = (0..37).map(|i| i as f32).collect();
    assert_eq!(dot(&x, &x), (0..37).map(|i| (i * i) as f32).sum::<f32>());
}

/// A float32 gelu within 1e-6 of the f64 formula (relative, or absolute near 0): as close as
/// PyTorch's own float32 `gelu(approximate="tanh")`, whose `1 + tanh` cancels for negative
/// gates. Saturated gates give the limits.
#[test]
fn gelu_tanh_matches_the_f64_formula() {
    let gelu = |g: f32| {
        let mut out = [0.0];
        gelu_tanh_mul(&[g], &[1.0], &mut out);
        out[0]
    };
    let c = (2.0 / std::f64::consts::PI).sqrt();
    for i in -10_000..10_000 {
        let g = i as f32 * 1e-3 + 3.7e-4;
        let x = g as f64;
        let want = 0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh());
        let got = gelu(g) as f64;
        assert!((got - want).abs() <= 1e-6 * want.abs().max(1.0), "gelu_tanh({g}) = {got}, want {want}");
    }
    assert_eq!(gelu(1e4), 1e4);
    assert!(gelu(-1e4).abs() < 1e-30 && gelu(-1e4) <= 0.0);
    assert_eq!(gelu(f32::INFINITY), f32::INFINITY);
    assert_eq!(gelu(f32::NEG_INFINITY), 0.0);
    assert_eq!(gelu(0.0), 0.0);
    let mut out = [0.0; 2];
    gelu_tanh_mul(&[2.0, -1.0], &[3.0, -2.0], &mut out);
    assert_eq!(out, [gelu(2.0) * 3.0, gelu(-1.0) * -2.0]);
}

/// Within 2 ulp of f64's tanh on both branches (and tiny arguments); ±1 when saturated, NaN
/// kept.
#[test]
fn tanh_is_within_two_ulp() {
    for i in -60_000..60_000 {
        let y = i as f32 * 1e-3 + 3.7e-5;
        let (got, want) = (tanh(y) as f64, (y as f64).tanh());
        let ulp = f32::EPSILON as f64 * want.abs();
        assert!((got - want).abs() <= 2.0 * ulp, "tanh({y}) = {got}, want {want}");
    }
    for y in [1e-30f32, -3e-8, 1e-4] {
        assert_eq!(tanh(y), y);
    }
    assert_eq!(tanh(0.0), 0.0);
    assert_eq!((tanh(45.0), tanh(-1e4), tanh(f32::INFINITY), tanh(f32::NEG_INFINITY)), (1.0, -1.0, 1.0, -1.0));
    assert!(tanh(f32::NAN).is_nan());
}

/// `cap * tanh(x / cap)` to float32 rounding of f64's, and bounded by the cap.
#[test]
fn softcap_matches_f64_tanh() {
    let cap = 30.0f32;
    let mut x: Vec<f32> = (-20_000..20_000).map(|i| i as f32 * 1e-2 + 3.7e-3).collect();
    let want: Vec<f64> = x.iter().map(|&v| cap as f64 * (v as f64 / cap as f64).tanh()).collect();
    softcap(&mut x, cap);
    for (got, want) in x.iter().zip(want) {
        assert!((*got as f64 - want).abs() <= 4.0 * f32::EPSILON as f64 * want.abs(), "{got} vs {want}");
    }
    let mut far = [1e9, -f32::INFINITY];
    softcap(&mut far, cap);
    assert_eq!(far, [cap, -cap]);
}
