//! Kernels written once over a lane abstraction ([`F32Vector`]) and instantiated per ISA, the
//! way ggml maps one vector API onto each architecture. Each architecture folder implements the
//! trait for its registers and stamps the kernels out with [`vector_kernels!`] inside its
//! `#[target_feature]` functions, so every intrinsic inlines.

pub mod attention;
pub mod elementwise;

use crate::portable;

/// `LANES` f32 lanes of one SIMD register. Every method is `unsafe`: the caller guarantees the
/// CPU feature and the pointer ranges.
pub trait F32Vector: Copy {
    const LANES: usize;
    /// Vector registers the ISA has (16 on AVX2, 32 on AVX-512 and NEON): sizes the tiles.
    const REGISTERS: usize;
    unsafe fn splat(v: f32) -> Self;
    unsafe fn load(p: *const f32) -> Self;
    /// `LANES` bfloat16 bit patterns, widened to f32.
    unsafe fn load_bf16(p: *const u16) -> Self;
    /// `LANES` int8 values, converted to f32 (reads exactly `LANES` bytes).
    unsafe fn load_i8(p: *const i8) -> Self;
    unsafe fn store(self, p: *mut f32);
    /// Hints that the cache line holding `p` is read soon; never faults, whatever `p` is.
    unsafe fn prefetch(p: *const u8);
    unsafe fn add(self, o: Self) -> Self;
    unsafe fn sub(self, o: Self) -> Self;
    unsafe fn mul(self, o: Self) -> Self;
    unsafe fn div(self, o: Self) -> Self;
    unsafe fn min(self, o: Self) -> Self;
    /// Lane-wise maximum; a NaN lane of `self` yields `o`'s lane.
    unsafe fn max(self, o: Self) -> Self;
    /// `self * a + b`, fused.
    unsafe fn mul_add(self, a: Self, b: Self) -> Self;
    unsafe fn max_lane(self) -> f32;
    /// Round to nearest, ties to even.
    unsafe fn round(self) -> Self;
    /// `2^n` for lanes holding integers `n` in `-126..=127`.
    unsafe fn exp2_int(self) -> Self;
    /// Bit `i` set where lane `i` of `self` is greater than `o`'s (false for NaN).
    unsafe fn gt_bits(self, o: Self) -> u32;
    /// Bit `i` set where lane `i` of `self` equals `o`'s.
    unsafe fn eq_bits(self, o: Self) -> u32;
    /// Lane `i` from `self` where bit `i` of `bits` is set, from `o` where it is clear.
    unsafe fn select_bits(self, o: Self, bits: u32) -> Self;
    /// Lane `i` takes lane `i ^ 1`.
    unsafe fn swap_pairs(self) -> Self;

    #[inline(always)]
    unsafe fn zero() -> Self {
        Self::splat(0.0)
    }

    /// [`portable::exp`] lane by lane, the same steps in the same order.
    #[inline(always)]
    unsafe fn exp(self) -> Self {
        let x = self.max(Self::splat(portable::EXP_LOWEST)).min(Self::splat(portable::EXP_HIGHEST));
        let n = x.mul(Self::splat(std::f32::consts::LOG2_E)).round();
        let r = n.mul_add(Self::splat(-portable::LN2_HIGH), x);
        let r = n.mul_add(Self::splat(-portable::LN2_LOW), r);
        let mut p = Self::splat(portable::EXP_POLYNOMIAL[0]);
        for c in &portable::EXP_POLYNOMIAL[1..] {
            p = p.mul_add(r, Self::splat(*c));
        }
        p.mul_add(r.mul(r), r.add(Self::splat(1.0))).mul(n.exp2_int())
    }
}

/// Defines, in the calling module, safe entry points for the kernels of [`elementwise`] and
/// [`attention`] on vector type `$v`, each compiled with `$features`, and
/// `fn vector_kernels(isa, gemm, bf16_activations) -> Kernels`. The entry points assume the
/// features: only hand the table out after detecting them.
macro_rules! vector_kernels {
    ($v:ty, $features:literal) => {
        mod vectorized {
            use super::*;
            use crate::delta_rule::DeltaRun;
            use crate::dispatch::{GemmFn, Int8Gemm, Kernels};
            use crate::paged::AttentionTask;
            use crate::portable::RopeStyle;
            use crate::vector::{attention as attn, elementwise as ew};

            #[target_feature(enable = $features)]
            unsafe fn dot_simd(x: &[f32], y: &[f32]) -> f32 {
                ew::dot::<$v>(x, y)
            }
            #[target_feature(enable = $features)]
            unsafe fn axpy_simd(a: f32, x: &[f32], y: &mut [f32]) {
                ew::axpy::<$v>(a, x, y)
            }
            #[target_feature(enable = $features)]
            unsafe fn add_rmsnorm_simd(x: &mut [f32], delta: Option<&[f32]>, weight: &[f32], eps: f32, out: &mut [f32]) {
                ew::add_rmsnorm::<$v>(x, delta, weight, eps, out)
            }
            #[target_feature(enable = $features)]
            unsafe fn silu_mul_simd(gate: &[f32], up: &[f32], out: &mut [f32]) {
                ew::silu_mul::<$v>(gate, up, out)
            }
            #[target_feature(enable = $features)]
            unsafe fn gelu_tanh_mul_simd(gate: &[f32], up: &[f32], out: &mut [f32]) {
                ew::gelu_tanh_mul::<$v>(gate, up, out)
            }
            #[target_feature(enable = $features)]
            unsafe fn clamped_swiglu_mul_simd(gate: &[f32], up: &[f32], out: &mut [f32]) {
                ew::clamped_swiglu_mul::<$v>(gate, up, out)
            }
            #[target_feature(enable = $features)]
            unsafe fn softmax_simd(x: &mut [f32]) {
                ew::softmax::<$v>(x)
            }
            #[target_feature(enable = $features)]
            unsafe fn softcap_simd(x: &mut [f32], cap: f32) {
                ew::softcap::<$v>(x, cap)
            }
            #[target_feature(enable = $features)]
            unsafe fn rope_simd(heads: &mut [f32], cos: &[f32], sin: &[f32], style: RopeStyle) {
                ew::rope::<$v>(heads, cos, sin, style)
            }
            #[target_feature(enable = $features)]
            unsafe fn argmax_simd(x: &[f32]) -> usize {
                ew::argmax::<$v>(x)
            }
            #[target_feature(enable = $features)]
            unsafe fn top_k_simd(x: &[f32], k: usize, out: &mut Vec<(f32, u32)>) {
                ew::top_k::<$v>(x, k, out)
            }
            #[target_feature(enable = $features)]
            unsafe fn apply_token_mask_simd(logits: &mut [f32], allowed: &[u32]) {
                ew::apply_token_mask::<$v>(logits, allowed)
            }
            #[target_feature(enable = $features)]
            unsafe fn attention_simd(task: &AttentionTask, out: *mut f32, out_stride: usize) {
                attn::attention::<$v>(task, attn::Job::Whole { out, out_stride })
            }
            #[target_feature(enable = $features)]
            unsafe fn merge_partials_simd(task: &AttentionTask, partials: &[f32], out: *mut f32, out_stride: usize) {
                crate::paged::merge_partials(task, partials, out, out_stride)
            }
            #[target_feature(enable = $features)]
            unsafe fn attention_partials_simd(task: &AttentionTask, blocks: std::ops::Range<usize>, partials: &mut [f32]) {
                attn::attention::<$v>(task, attn::Job::Partials { blocks, partials })
            }
            #[target_feature(enable = $features)]
            unsafe fn delta_rule_chunked_simd(run: &DeltaRun, position: usize, state: &mut [f32], out: &mut [f32]) {
                crate::delta_rule::chunked(run, position, state, out)
            }
            #[target_feature(enable = $features)]
            unsafe fn delta_rule_recurrent_simd(run: &DeltaRun, state: &mut [f32], out: &mut [f32]) {
                crate::delta_rule::recurrent(run, state, out)
            }

            /// The kernel table of this vector type, with the ISA's own GEMM and the GEMMs on
            /// int8 activations given.
            pub fn vector_kernels(isa: &'static str, gemm: GemmFn, gemm_i8: Int8Gemm, bf16_activations: bool) -> Kernels {
                // SAFETY (every closure): the table is only handed out after detecting $features.
                Kernels {
                    isa,
                    gemm,
                    gemm_i8,
                    bf16_activations,
                    dot: |x, y| unsafe { dot_simd(x, y) },
                    axpy: |a, x, y| unsafe { axpy_simd(a, x, y) },
                    add_rmsnorm: |x, d, w, eps, out| unsafe { add_rmsnorm_simd(x, d, w, eps, out) },
                    silu_mul: |g, u, out| unsafe { silu_mul_simd(g, u, out) },
                    gelu_tanh_mul: |g, u, out| unsafe { gelu_tanh_mul_simd(g, u, out) },
                    clamped_swiglu_mul: |g, u, out| unsafe { clamped_swiglu_mul_simd(g, u, out) },
                    softmax: |x| unsafe { softmax_simd(x) },
                    softcap: |x, cap| unsafe { softcap_simd(x, cap) },
                    rope: |h, c, s, style| unsafe { rope_simd(h, c, s, style) },
                    argmax: |x| unsafe { argmax_simd(x) },
                    top_k: |x, k, out| unsafe { top_k_simd(x, k, out) },
                    apply_token_mask: |l, m| unsafe { apply_token_mask_simd(l, m) },
                    attention: attention_simd,
                    attention_partials: |task, blocks, partials| unsafe { attention_partials_simd(task, blocks, partials) },
                    merge_partials: merge_partials_simd,
                    delta_rule_chunked: |run, position, state, out| unsafe { delta_rule_chunked_simd(run, position, state, out) },
                    delta_rule_recurrent: |run, state, out| unsafe { delta_rule_recurrent_simd(run, state, out) },
                }
            }
        }
        pub use vectorized::vector_kernels;
    };
}
pub(crate) use vector_kernels;
