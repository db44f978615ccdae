//! Picks the best implementation of each kernel for this CPU, once.
//!
//! `RSGL_KERNELS=portable|avx2|avx512|avx512-bf16|neon|neon-bf16|sve-bf16` forces one path (to
//! test every branch on one machine); asking for a path the CPU lacks falls back to portable with a warning.

use crate::delta_rule::DeltaRun;
use crate::int4::{Int4Weights, QuantizedBlocks};
use crate::int8::{Int8Weights, QuantizedRows};
use crate::int8_block::Int8BlockWeights;
use crate::packed::PackedWeights;
use crate::paged::AttentionTask;
use crate::portable::RopeStyle;
use std::ops::Range;
use std::sync::OnceLock;

/// A GEMM's activations: `m` rows of `k` f32, and the same rounded to bf16 pairs when the
/// kernel table has `bf16_activations` and the weights are bf16 (see
/// [`crate::packed::activations_to_bf16`]); empty otherwise.
pub struct GemmArgs<'a> {
    pub m: usize,
    pub x: &'a [f32],
    pub x_bf16: &'a [u16],
}

/// `out[i * ldo + j] = x[i, :] · w[j, :]` over the columns of `panels` (see
/// [`crate::portable::gemm::gemm`] for the contract). Each output element is reduced in the same
/// order whatever `m` is, so a sequence gets bit-identical results alone or in a batch.
pub type GemmFn = unsafe fn(a: &GemmArgs, w: &PackedWeights, panels: Range<usize>, out: *mut f32, ldo: usize);
/// The W8A8 GEMM over per-row quantized activations ([`crate::portable::int8::gemm_i8`]).
pub type GemmI8Fn = unsafe fn(x: &QuantizedRows, w: &Int8Weights, panels: Range<usize>, out: *mut f32, ldo: usize);

/// The W4A8 GEMM over per-block quantized activations ([`crate::portable::int4::gemm_q4`]).
pub type GemmQ4Fn = unsafe fn(x: &QuantizedBlocks, w: &Int4Weights, panels: Range<usize>, out: *mut f32, ldo: usize);

/// The 8-bit block GEMM over per-block quantized activations ([`crate::portable::int8_block::gemm_q8`]).
pub type GemmQ8Fn = unsafe fn(x: &QuantizedBlocks, w: &Int8BlockWeights, panels: Range<usize>, out: *mut f32, ldo: usize);

/// The GEMMs on int8 activations (W8A8 `gemm`, 4-bit and 8-bit blocks) and the name of their path
/// ("portable", "avx2", "avx512-vnni", "avx512-amx", "neon", "dotprod", "i8mm"): chosen by the CPU's integer
/// dot products.
#[derive(Clone, Copy)]
pub struct Int8Gemm {
    pub isa: &'static str,
    pub gemm: GemmI8Fn,
    pub gemm_q4: GemmQ4Fn,
    pub gemm_q8: GemmQ8Fn,
}

impl Int8Gemm {
    pub fn portable() -> Int8Gemm {
        use crate::portable::{int4, int8, int8_block};
        Int8Gemm { isa: "portable", gemm: int8::gemm_i8, gemm_q4: int4::gemm_q4, gemm_q8: int8_block::gemm_q8 }
    }

    /// The int8 paths this CPU supports, best first.
    pub fn simd_paths() -> Vec<Int8Gemm> {
        #[cfg(target_arch = "x86_64")]
        {
            crate::x86_64::int8_paths()
        }
        #[cfg(target_arch = "aarch64")]
        {
            crate::aarch64::int8_paths()
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            Vec::new()
        }
    }

    /// The best path here.
    pub fn best() -> Int8Gemm {
        Self::simd_paths().into_iter().next().unwrap_or_else(Self::portable)
    }
}

/// The row kernels; each contract is the doc of its portable twin in [`crate::portable`].
pub type AxpyFn = fn(a: f32, x: &[f32], y: &mut [f32]);
pub type DotFn = fn(x: &[f32], y: &[f32]) -> f32;
pub type AddRmsNormFn = fn(x: &mut [f32], delta: Option<&[f32]>, weight: &[f32], eps: f32, out: &mut [f32]);
/// `out = activation(gate) * up`, row by row (silu, gelu-tanh, gpt-oss's clamped SwiGLU).
pub type GatedActivationFn = fn(gate: &[f32], up: &[f32], out: &mut [f32]);
pub type SoftmaxFn = fn(x: &mut [f32]);
pub type SoftcapFn = fn(x: &mut [f32], cap: f32);
pub type RopeFn = fn(heads: &mut [f32], cos: &[f32], sin: &[f32], style: RopeStyle);
pub type ArgmaxFn = fn(x: &[f32]) -> usize;
pub type TopKFn = fn(x: &[f32], k: usize, out: &mut Vec<(f32, u32)>);
pub type TokenMaskFn = fn(logits: &mut [f32], allowed: &[u32]);
/// Paged attention of one task ([`crate::portable::attention::attention`] for the contract).
pub type AttentionFn = unsafe fn(task: &AttentionTask, out: *mut f32, out_stride: usize);
/// The softmax partials of some of a task's key blocks
/// ([`crate::portable::attention::attention_partials`]); [`crate::paged::merge_partials`] turns
/// all of them into `attention`'s output, bit for bit.
pub type AttentionPartialsFn = fn(task: &AttentionTask, blocks: std::ops::Range<usize>, partials: &mut [f32]);
/// [`crate::paged::merge_partials`].
pub type MergePartialsFn = unsafe fn(task: &AttentionTask, partials: &[f32], out: *mut f32, out_stride: usize);
/// [`crate::delta_rule::chunked`]: a run starting at `position`.
pub type DeltaRuleChunkedFn = fn(run: &DeltaRun, position: usize, state: &mut [f32], out: &mut [f32]);
pub type DeltaRuleRecurrentFn = fn(run: &DeltaRun, state: &mut [f32], out: &mut [f32]);

/// The kernels chosen for this CPU.
#[derive(Clone, Copy)]
pub struct Kernels {
    /// Name of the chosen path ("portable", "avx2", "avx512", "avx512-bf16", "neon", "neon-bf16", "sve-bf16"), reported by
    /// the engine.
    pub isa: &'static str,
    pub gemm: GemmFn,
    /// The GEMMs on int8 activations: the CPU's best for the widest SIMD paths, the same
    /// ISA's for narrower ones (so a forced `avx2` runs AVX2 throughout), portable with the
    /// portable path.
    pub gemm_i8: Int8Gemm,
    /// Whether `gemm` multiplies bf16 weights by bf16-rounded activations (`GemmArgs::x_bf16`).
    pub bf16_activations: bool,
    pub dot: DotFn,
    pub axpy: AxpyFn,
    pub add_rmsnorm: AddRmsNormFn,
    pub silu_mul: GatedActivationFn,
    pub gelu_tanh_mul: GatedActivationFn,
    pub clamped_swiglu_mul: GatedActivationFn,
    pub softmax: SoftmaxFn,
    pub softcap: SoftcapFn,
    pub rope: RopeFn,
    pub argmax: ArgmaxFn,
    pub top_k: TopKFn,
    pub apply_token_mask: TokenMaskFn,
    pub attention: AttentionFn,
    /// Key blocks of one task on several threads (flash-decoding).
    pub attention_partials: AttentionPartialsFn,
    pub merge_partials: MergePartialsFn,
    /// The gated delta rule: the portable Rust compiled for the path's vector width (the same
    /// bits: no sum is reordered, no multiply-add fused).
    pub delta_rule_chunked: DeltaRuleChunkedFn,
    pub delta_rule_recurrent: DeltaRuleRecurrentFn,
}

impl Kernels {
    pub fn portable() -> Kernels {
        Kernels {
            isa: "portable",
            gemm: crate::portable::gemm::gemm,
            gemm_i8: Int8Gemm::portable(),
            bf16_activations: false,
            dot: crate::portable::dot,
            axpy: crate::portable::axpy,
            add_rmsnorm: crate::portable::add_rmsnorm,
            silu_mul: crate::portable::silu_mul,
            gelu_tanh_mul: crate::portable::gelu_tanh_mul,
            clamped_swiglu_mul: crate::portable::clamped_swiglu_mul,
            softmax: crate::portable::softmax,
            softcap: crate::portable::softcap,
            rope: crate::portable::rope,
            argmax: crate::portable::argmax,
            top_k: crate::portable::top_k,
            apply_token_mask: crate::portable::apply_token_mask,
            attention: crate::portable::attention::attention,
            attention_partials: crate::portable::attention::attention_partials,
            merge_partials: crate::portable::attention::merge_partials,
            delta_rule_chunked: crate::delta_rule::chunked,
            delta_rule_recurrent: crate::delta_rule::recurrent,
        }
    }

    /// The SIMD paths this CPU supports, best first.
    pub fn simd_paths() -> Vec<Kernels> {
        #[cfg(target_arch = "x86_64")]
        {
            crate::x86_64::paths()
        }
        #[cfg(target_arch = "aarch64")]
        {
            crate::aarch64::paths()
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            Vec::new()
        }
    }

    /// Resolve a path by name: "auto", "portable" or a SIMD path name.
    pub fn by_name(name: &str) -> Option<Kernels> {
        match name {
            "auto" | "" => Some(Self::simd_paths().into_iter().next().unwrap_or_else(Self::portable)),
            "portable" => Some(Self::portable()),
            other => Self::simd_paths().into_iter().find(|k| k.isa == other),
        }
    }

    /// The table for `RSGL_KERNELS=wanted`: [`Self::by_name`], or portable with a warning.
    fn forced(wanted: &str) -> Kernels {
        Self::by_name(wanted).unwrap_or_else(|| {
            eprintln!("rsgl: kernel path {wanted:?} is not available on this CPU; using portable");
            Self::portable()
        })
    }
}

/// The process-wide kernel table (honours `RSGL_KERNELS`).
pub fn kernels() -> &'static Kernels {
    static CHOSEN: OnceLock<Kernels> = OnceLock::new();
    CHOSEN.get_or_init(|| Kernels::forced(&std::env::var("RSGL_KERNELS").unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    use super::{kernels, Kernels};

    /// Every path name the module doc lists.
    const NAMES: [&str; 7] = ["portable", "avx2", "avx512", "avx512-bf16", "neon", "neon-bf16", "sve-bf16"];

    fn best() -> &'static str {
        Kernels::simd_paths().first().map_or("portable", |k| k.isa)
    }

    /// Test lanes that force a path (scripts/aarch64-test.sh) must get it, not a silent fallback;
    /// without `RSGL_KERNELS` the table is the best path.
    #[test]
    fn a_forced_path_is_the_one_used() {
        let wanted = std::env::var("RSGL_KERNELS").unwrap_or_default();
        let expected = if matches!(wanted.as_str(), "" | "auto") { best() } else { wanted.as_str() };
        assert_eq!(kernels().isa, expected);
    }

    #[test]
    fn every_supported_path_can_be_forced_by_name() {
        let supported: Vec<&str> = Kernels::simd_paths().iter().map(|k| k.isa).collect();
        assert!(supported.iter().all(|isa| NAMES.contains(isa)), "undocumented path in {supported:?}");
        for name in NAMES {
            if name == "portable" || supported.contains(&name) {
                assert_eq!(Kernels::forced(name).isa, name);
            } else {
                assert!(Kernels::by_name(name).is_none(), "{name} is not supported here");
                assert_eq!(Kernels::forced(name).isa, "portable", "{name} must fall back to portable");
            }
        }
        for auto in ["auto", ""] {
            assert_eq!(Kernels::forced(auto).isa, best());
        }
        assert!(Kernels::by_name("avx1024").is_none());
        assert_eq!(Kernels::forced("avx1024").isa, "portable");
    }
}
