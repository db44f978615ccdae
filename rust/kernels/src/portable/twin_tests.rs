use super::{rope_tables, RopeStyle};
use crate::delta_rule::DeltaRun;
use crate::dispatch::GemmArgs;
use crate::int4::{Int4Offset, Int4Weights, QuantizedBlocks};
use crate::int8_block::{Int8BlockWeights, HALF_BLOCK};
use crate::packed::f32_to_f16;
use crate::packed::{activations_to_bf16, PackedWeights, WeightDtype};
use crate::{Int8Gemm, Int8Weights, Kernels, QuantizedRows, ThreadPool};

pub(crate) fn data(n: usize, seed: f32) -> Vec<f32> {
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

/// The delta rule compiled for a path against the portable build: the same outputs and state,
/// bit for bit, on odd sizes, chunked from a chunk edge and from inside a chunk, and stepped.
fn check_delta_rule(simd: &Kernels) {
    let reference = Kernels::portable();
    for (tokens, dk, dv) in [(1, 3, 5), (7, 5, 3), (65, 16, 9), (130, 9, 17)] {
        let (q, k, v) = (data(tokens * dk, 1.0), data(tokens * dk, 2.0), data(tokens * dv, 3.0));
        let g: Vec<f32> = data(tokens, 4.0).iter().map(|x| -0.3 * (x + 1.0)).collect();
        let beta: Vec<f32> = data(tokens, 5.0).iter().map(|x| 0.5 * (x + 1.0)).collect();
        let run = DeltaRun { q: &q, k: &k, v: &v, g: &g, beta: &beta, key_dim: dk, value_dim: dv };
        for position in [0, 37] {
            let outputs = |kern: &Kernels| {
                let (mut state, mut out) = (data(dk * dv, 6.0), vec![0.0; tokens * dv]);
                (kern.delta_rule_chunked)(&run, position, &mut state, &mut out);
                let mut stepped = vec![0.0; tokens * dv];
                (kern.delta_rule_recurrent)(&run, &mut state, &mut stepped);
                (out, stepped, state)
            };
            assert!(outputs(&reference) == outputs(simd), "{} delta rule: {tokens} tokens, {dk}x{dv}, from position {position}", simd.isa);
        }
    }
}

/// Compares a SIMD GEMM with the portable one for every weight dtype on odd sizes, and checks
/// that a row computed alone, or a panel range computed apart, gives the same bits as the whole.
fn check_gemm(simd: &Kernels) {
    let reference = Kernels::portable();
    for dtype in [WeightDtype::F32, WeightDtype::F16, WeightDtype::BF16] {
        // 577 inputs: wide and odd; 53 rows: more than one 48-row block of AVX2's widened bf16 panels.
        for k in [1, 3, 7, 16, 17, 33, 100, 577] {
            for (m, n) in [(1, 1), (1, 37), (1, 81), (2, 40), (3, 7), (5, 48), (13, 17), (14, 65), (29, 33), (53, 21)] {
                let x = data(m * k, 1.0);
                let w = PackedWeights::pack(&data(n * k, 2.0), n, k, dtype);
                let want = run_gemm(&reference, &x, &w, 0..w.panels());
                let got = run_gemm(simd, &x, &w, 0..w.panels());
                if simd.bf16_activations && dtype == WeightDtype::BF16 {
                    // bf16-rounded activations cost up to 2^-8 relative per product.
                    for (i, (a, b)) in want.iter().zip(&got).enumerate() {
                        assert!((a - b).abs() <= 1e-2 * k as f32, "{} {dtype:?} k={k} m={m} n={n} at {i}: {a} vs {b}", simd.isa);
                    }
                } else {
                    same(&format!("gemm {dtype:?} k={k} m={m} n={n}"), simd.isa, &want, &got);
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

/// The reference's bits exactly: every path computes what its portable twin does, in the same
/// order, so results agree across ISAs.
fn same(kernel: &str, isa: &str, want: &[f32], got: &[f32]) {
    assert_eq!(want.len(), got.len(), "{isa} {kernel}: lengths");
    for (i, (a, b)) in want.iter().zip(got).enumerate() {
        assert!(a.to_bits() == b.to_bits(), "{isa} {kernel} at {i} of {}: {a} vs {b}", want.len());
    }
}

const ODD_SIZES: [usize; 11] = [1, 3, 7, 8, 15, 16, 17, 33, 64, 100, 577];

fn check_rows(simd: &Kernels) {
    let (reference, isa) = (Kernels::portable(), simd.isa);
    for n in ODD_SIZES {
        let (x, y) = (data(n, 1.0), data(n, 2.0));
        let (a, b) = ((reference.dot)(&x, &y), (simd.dot)(&x, &y));
        same("dot", isa, &[a], &[b]);
        let (mut y1, mut y2) = (y.clone(), y.clone());
        (reference.axpy)(0.37, &x, &mut y1);
        (simd.axpy)(0.37, &x, &mut y2);
        same("axpy", isa, &y1, &y2);

        let (w, delta) = (data(n, 3.0), data(n, 4.0));
        for d in [None, Some(&delta[..])] {
            let (mut x1, mut x2, mut o1, mut o2) = (x.clone(), x.clone(), vec![0.0; n], vec![0.0; n]);
            (reference.add_rmsnorm)(&mut x1, d, &w, 1e-5, &mut o1);
            (simd.add_rmsnorm)(&mut x2, d, &w, 1e-5, &mut o2);
            same("add_rmsnorm residual", isa, &x1, &x2);
            same("add_rmsnorm", isa, &o1, &o2);
        }

        // Gates over the range where silu and exp change shape, and past it.
        let gate: Vec<f32> = x.iter().map(|v| v * 30.0).collect();
        let (mut o1, mut o2) = (vec![0.0; n], vec![0.0; n]);
        (reference.silu_mul)(&gate, &y, &mut o1);
        (simd.silu_mul)(&gate, &y, &mut o2);
        same("silu_mul", isa, &o1, &o2);
        (reference.gelu_tanh_mul)(&gate, &y, &mut o1);
        (simd.gelu_tanh_mul)(&gate, &y, &mut o2);
        same("gelu_tanh_mul", isa, &o1, &o2);
        // Ups across the clamp too.
        let up: Vec<f32> = y.iter().map(|v| v * 20.0).collect();
        (reference.clamped_swiglu_mul)(&gate, &up, &mut o1);
        (simd.clamped_swiglu_mul)(&gate, &up, &mut o2);
        same("clamped_swiglu_mul", isa, &o1, &o2);

        let (mut s1, mut s2) = (gate.clone(), gate.clone());
        (reference.softmax)(&mut s1);
        (simd.softmax)(&mut s2);
        same("softmax", isa, &s1, &s2);

        // Caps that keep the gates on tanh's polynomial, on its exponential and saturated.
        for cap in [100.0, 30.0, 1.0] {
            let (mut c1, mut c2) = (gate.clone(), gate.clone());
            (reference.softcap)(&mut c1, cap);
            (simd.softcap)(&mut c2, cap);
            same(&format!("softcap {cap}"), isa, &c1, &c2);
        }

        let mut logits = data(n, 5.0);
        logits[n / 2] = 3.0; // a maximum inside the vector body or the tail
        logits[n - 1] = 3.0; // and a tie later on: the first one wins
        assert_eq!((reference.argmax)(&logits), (simd.argmax)(&logits), "{isa} argmax n={n}");
        let ties: Vec<f32> = logits.iter().map(|v| (v * 4.0).round()).collect(); // many equal values
        for k in [1, 2, 5, 40] {
            for values in [&logits, &ties] {
                let (mut t1, mut t2) = (Vec::new(), Vec::new());
                (reference.top_k)(values, k, &mut t1);
                (simd.top_k)(values, k, &mut t2);
                assert_eq!(t1, t2, "{isa} top_k k={k} n={n}");
            }
        }

        let mask: Vec<u32> = (0..n.div_ceil(32)).map(|i| [u32::MAX, 0, 0x5555_1234, 0x8000_0001][i % 4]).collect();
        let (mut l1, mut l2) = (logits.clone(), logits.clone());
        (reference.apply_token_mask)(&mut l1, &mask);
        (simd.apply_token_mask)(&mut l2, &mask);
        assert_eq!(l1, l2, "{isa} apply_token_mask n={n}");
    }
    // Where the kernels switch formulas or saturate, and past the exponential's range.
    let edges = [
        0.0,
        -0.0,
        1e-30,
        -1e-8,
        0.625,
        -0.625,
        0.625_000_06,
        -0.624_999_94,
        20.0,
        -20.0,
        -20.000_002,
        44.0,
        -45.0,
        1e4,
        -1e4,
        f32::INFINITY,
        f32::NEG_INFINITY,
    ];
    let (mut o1, mut o2) = (vec![0.0; edges.len()], vec![0.0; edges.len()]);
    (reference.gelu_tanh_mul)(&edges, &[1.5; 17], &mut o1);
    (simd.gelu_tanh_mul)(&edges, &[1.5; 17], &mut o2);
    same("gelu_tanh_mul at its edges", isa, &o1, &o2);
    let with_nan = [&[f32::NAN], &edges[..16]].concat();
    (reference.clamped_swiglu_mul)(&with_nan, &with_nan, &mut o1);
    (simd.clamped_swiglu_mul)(&with_nan, &with_nan, &mut o2);
    same("clamped_swiglu_mul at its edges", isa, &o1, &o2);
    let (mut c1, mut c2) = (edges.to_vec(), edges.to_vec());
    (reference.softcap)(&mut c1, 1.0);
    (simd.softcap)(&mut c2, 1.0);
    same("softcap at its edges", isa, &c1, &c2);

    let nan_first = [f32::NAN, 1.0, 7.0, 7.0, -2.0, 0.5, 3.0, 1.0, 2.0, 7.5, 0.0];
    assert_eq!((reference.argmax)(&nan_first), (simd.argmax)(&nan_first), "{isa} argmax with NaN");

    for d in [2, 6, 16, 64, 80, 128] {
        for style in [RopeStyle::Neox, RopeStyle::GptJ] {
            let angles: Vec<f64> = (0..d / 2).map(|i| 7.0 * 0.3f64.powi(i as i32)).collect();
            let (mut cos, mut sin) = (vec![0.0; d], vec![0.0; d]);
            rope_tables(&angles, style, &mut cos, &mut sin);
            let (mut h1, mut h2) = (data(3 * d, 6.0), data(3 * d, 6.0));
            (reference.rope)(&mut h1, &cos, &sin, style);
            (simd.rope)(&mut h2, &cos, &sin, style);
            same("rope", isa, &h1, &h2);
        }
    }
}

/// Says which paths a twin test compared with portable, and asserts they are exactly those
/// feature detection gives this CPU (`detected`: name, present), so none is skipped unseen.
pub fn assert_paths_ran(kind: &str, ran: &[&str], detected: &[(&str, bool)]) {
    eprintln!("{kind} paths compared with portable: {ran:?}");
    let mut expected: Vec<&str> = detected.iter().filter(|(_, present)| *present).map(|(name, _)| *name).collect();
    let mut ran = ran.to_vec();
    expected.sort_unstable();
    ran.sort_unstable();
    assert_eq!(ran, expected, "{kind}: the paths compared are not the ones this CPU supports");
}

pub fn check_against_portable(simd: &Kernels) {
    check_gemm(simd);
    check_rows(simd);
    check_delta_rule(simd);
    super::attention::tests::check_attention(simd);
}

/// An int8 GEMM against the portable one on odd sizes: the same bits, whatever the rows and the
/// panel split.
pub fn check_int8_against_portable(simd: &Int8Gemm) {
    let run = |path: &Int8Gemm, x: &[f32], w: &Int8Weights, k: usize, panels: std::ops::Range<usize>| {
        let mut rows = QuantizedRows::default();
        rows.quantize(x, k);
        let mut out = vec![f32::NAN; rows.m * w.n];
        // SAFETY: `out` is [m, n] and this thread is its only user.
        unsafe { (path.gemm)(&rows, w, panels, out.as_mut_ptr(), w.n) };
        out
    };
    let reference = Int8Gemm::portable();
    // Every batch from 1 to 17 rows and two past 16, inner sizes with and without a tail past
    // whole 64-byte steps (AMX tiles).
    let outputs = [16, 7, 33, 48, 23, 37, 17, 65, 40, 81];
    let shapes = [(1, 1), (1, 37)].into_iter().chain((2..=17).chain([29, 33]).map(|m| (m, outputs[m % outputs.len()])));
    for k in [1, 3, 8, 17, 64, 100, 128, 577] {
        for (m, n) in shapes.clone() {
            // Values reaching both ends of the int8 range, and rows of zeros.
            let x: Vec<f32> = data(m * k, 1.0).iter().enumerate().map(|(i, v)| if i / k == 1 { 0.0 } else { v * 3.0 }).collect();
            let w = Int8Weights::quantize(&data(n * k, 2.0), n, k);
            let want = run(&reference, &x, &w, k, 0..w.panels());
            let got = run(simd, &x, &w, k, 0..w.panels());
            assert_eq!(want, got, "{} int8 k={k} m={m} n={n}", simd.isa);
            let cut = w.panels() / 2;
            let (mut left, right) = (run(simd, &x, &w, k, 0..cut), run(simd, &x, &w, k, cut..w.panels()));
            left.iter_mut().zip(&right).filter(|(l, _)| l.is_nan()).for_each(|(l, r)| *l = *r);
            assert_eq!(left, got, "{} int8: split panel ranges differ", simd.isa);
        }
    }
}

/// A block GEMM run on a path: `gemm(path, rows, weights, panels, out)`.
type BlockGemm<'a, W> = dyn Fn(&Int8Gemm, &QuantizedBlocks, &W, std::ops::Range<usize>, &mut [f32]) + 'a;

/// A block-quantized GEMM (`gemm(path, rows, panels, out)`, weights `[n, k]` built by
/// `weights(n, k)`) against the portable path on odd row and output counts: the same bits,
/// whatever the rows, the batch and the panel split.
fn check_blocks_against_portable<W>(simd: &Int8Gemm, kind: &str, weights: &dyn Fn(usize, usize) -> (W, usize), gemm: &BlockGemm<'_, W>) {
    let run = |path: &Int8Gemm, x: &[f32], w: &W, k: usize, n: usize, panels: std::ops::Range<usize>| {
        let mut rows = QuantizedBlocks::default();
        rows.quantize(x, k, &ThreadPool::new(1, false));
        let mut out = vec![f32::NAN; rows.m * n];
        gemm(path, &rows, w, panels, &mut out);
        out
    };
    let reference = Int8Gemm::portable();
    // 1120 inputs are 35 blocks: kernels that cut long rows into chunks of blocks end on a short one.
    // Every batch from 1 to 17 rows and two past 32 (AMX tiles are 16 rows), output counts
    // mostly not multiples of 16.
    let outputs = [40, 7, 33, 48, 23, 37, 17, 65, 16, 81];
    let shapes = [(1, 1), (1, 37), (1, 81)].into_iter().chain((2..=17).chain([33, 40]).map(|m| (m, outputs[m % outputs.len()])));
    for k in [32, 96, 320, 1120] {
        for (m, n) in shapes.clone() {
            // Values reaching both ends of the int8 range, an outlier, a row of zeros and one of
            // positive values only (the largest sums of products: 16-bit partial sums overflow
            // there first).
            let row = |i: usize, v: f32| match i / k {
                1 => 0.0,
                2 => 3.0 + v.abs() * 0.1,
                _ => v * 3.0,
            };
            let mut x: Vec<f32> = data(m * k, 1.0).iter().enumerate().map(|(i, &v)| row(i, v)).collect();
            x[k / 2] = 40.0;
            let (w, panels) = weights(n, k);
            let want = run(&reference, &x, &w, k, n, 0..panels);
            let got = run(simd, &x, &w, k, n, 0..panels);
            assert_eq!(want, got, "{} {kind} k={k} m={m} n={n}", simd.isa);
            for i in 0..m {
                let alone = run(simd, &x[i * k..(i + 1) * k], &w, k, n, 0..panels);
                assert_eq!(alone, got[i * n..(i + 1) * n], "{} {kind}: row {i} differs alone vs batched", simd.isa);
            }
            let cut = panels / 2;
            let (mut left, right) = (run(simd, &x, &w, k, n, 0..cut), run(simd, &x, &w, k, n, cut..panels));
            left.iter_mut().zip(&right).filter(|(l, _)| l.is_nan()).for_each(|(l, r)| *l = *r);
            assert_eq!(left, got, "{} {kind}: split panel ranges differ", simd.isa);
        }
    }
}

/// The W4A8 GEMM (every offset, MXFP4 on all its codes and a spread of scales too) and the
/// 8-bit block GEMM against the portable ones.
pub fn check_blocks_paths_against_portable(simd: &Int8Gemm) {
    check_blocks_against_portable(
        simd,
        "int4 Mxfp4 (every code)",
        &|n, k| {
            let w = every_code_mxfp4(n, k);
            let panels = w.panels();
            (w, panels)
        },
        // SAFETY: `out` is [m, n] and this thread is its only user.
        &|path, rows, w, panels, out| unsafe { (path.gemm_q4)(rows, w, panels, out.as_mut_ptr(), w.n) },
    );
    for offset in [Int4Offset::Eight, Int4Offset::Min, Int4Offset::Mxfp4] {
        check_blocks_against_portable(
            simd,
            &format!("int4 {offset:?}"),
            &|n, k| {
                let w = Int4Weights::quantize(&data(n * k, 2.0), n, k, offset);
                let panels = w.panels();
                (w, panels)
            },
            // SAFETY: `out` is [m, n] and this thread is its only user.
            &|path, rows, w, panels, out| unsafe { (path.gemm_q4)(rows, w, panels, out.as_mut_ptr(), w.n) },
        );
    }
    for bits in [8, 6, 5] {
        check_blocks_against_portable(
            simd,
            &format!("int8 blocks of {bits}-bit quants"),
            &|n, k| {
                let w = full_range_blocks(n, k, bits);
                let panels = w.panels();
                (w, panels)
            },
            // SAFETY: as above.
            &|path, rows, w, panels, out| unsafe { (path.gemm_q8)(rows, w, panels, out.as_mut_ptr(), w.n) },
        );
    }
}

/// MXFP4 weights whose codes take all 16 values (every fourth row only code 7, 6: the largest
/// level) and whose e8m0 scales range from the two subnormal ones (0 and 1) over the usual ones
/// to 2^33.
fn every_code_mxfp4(n: usize, k: usize) -> Int4Weights {
    Int4Weights::pack_rows(n, k, Int4Offset::Mxfp4, &ThreadPool::new(1, false), &|row, out| {
        for (j, q) in out.nibbles.iter_mut().enumerate() {
            *q = if row % 4 == 3 { 0x77 } else { ((row * k + 2 * j) * 131 % 257 % 256) as u8 };
        }
        for (b, e) in out.scales.iter_mut().enumerate() {
            *e = match (row * 7 + b) % 23 {
                0 => 0,
                1 => 1,
                2 => 160,
                other => 112 + other as u16,
            };
        }
    })
}

/// 8-bit block weights whose quants take every value of their width (both ends included),
/// with scales of both signs.
fn full_range_blocks(n: usize, k: usize, bits: u32) -> Int8BlockWeights {
    let scales = data(n * k / HALF_BLOCK, 3.0);
    Int8BlockWeights::pack_rows(n, k, bits, &ThreadPool::new(1, false), &|row, out| {
        for (j, q) in out.quants.iter_mut().enumerate() {
            *q = ((row * k + j) * 131 % 257 % (1 << bits)) as u8;
        }
        for (h, d) in out.scales.iter_mut().enumerate() {
            *d = f32_to_f16(scales[row * k / HALF_BLOCK + h] * 0.01);
        }
    })
}

/// The portable W4A8 GEMM against a float product of the dequantized weights.
#[test]
fn portable_int4_is_the_dequantized_product() {
    let (m, n, k) = (3, 21, 96);
    let x = data(m * k, 1.0);
    for offset in [Int4Offset::Eight, Int4Offset::Min, Int4Offset::Mxfp4] {
        let w = Int4Weights::quantize(&data(n * k, 2.0), n, k, offset);
        let mut rows = QuantizedBlocks::default();
        rows.quantize(&x, k, &ThreadPool::new(1, false));
        let mut out = vec![0.0; m * n];
        // SAFETY: `out` is [m, n] and this thread is its only user.
        unsafe { crate::portable::int4::gemm_q4(&rows, &w, 0..w.panels(), out.as_mut_ptr(), n) };
        for i in 0..m {
            for j in 0..n {
                let want: f32 = w.row(j).iter().zip(&x[i * k..(i + 1) * k]).map(|(a, b)| a * b).sum();
                // The activations' int8 rounding: half a step of each block's scale per input.
                let tol = x[i * k..(i + 1) * k].iter().fold(0f32, |a, v| a.max(v.abs())) / 254.0 * k as f32 * 0.6;
                assert!((out[i * n + j] - want).abs() <= tol, "{offset:?} ({i}, {j}): {} vs {want}", out[i * n + j]);
            }
        }
    }
}

#[test]
fn portable_block_gemms_are_batch_invariant() {
    check_blocks_paths_against_portable(&Int8Gemm::portable());
}

/// The portable 8-bit block GEMM against a float product of the dequantized weights, at every
/// quant width.
#[test]
fn portable_int8_blocks_are_the_dequantized_product() {
    let (m, n, k) = (3, 21, 96);
    let x = data(m * k, 1.0);
    let mut rows = QuantizedBlocks::default();
    rows.quantize(&x, k, &ThreadPool::new(1, false));
    for bits in [8, 6, 5] {
        let w = full_range_blocks(n, k, bits);
        let mut out = vec![0.0; m * n];
        // SAFETY: `out` is [m, n] and this thread is its only user.
        unsafe { crate::portable::int8_block::gemm_q8(&rows, &w, 0..w.panels(), out.as_mut_ptr(), n) };
        for i in 0..m {
            for j in 0..n {
                let row = w.row(j);
                let want: f32 = row.iter().zip(&x[i * k..(i + 1) * k]).map(|(a, b)| a * b).sum();
                // Activations off by half a step each (a 254th of their largest), times the weights.
                let step = x[i * k..(i + 1) * k].iter().fold(0f32, |a, v| a.max(v.abs())) / 254.0;
                let tol = step * row.iter().map(|v| v.abs()).sum::<f32>() + want.abs() * 1e-5 + 1e-5;
                assert!((out[i * n + j] - want).abs() <= tol, "{bits} bits ({i}, {j}): {} vs {want}", out[i * n + j]);
            }
        }
    }
}

#[test]
fn portable_is_batch_invariant() {
    check_against_portable(&Kernels::portable());
}
