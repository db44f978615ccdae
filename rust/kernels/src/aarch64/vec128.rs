//! [`F32Vector`] on NEON registers, and the vector kernels built on it.

use crate::vector::{vector_kernels, F32Vector};
use std::arch::aarch64::*;

#[derive(Clone, Copy)]
pub struct F32x4(float32x4_t);

impl F32Vector for F32x4 {
    const LANES: usize = 4;
    const REGISTERS: usize = 32;
    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        F32x4(vdupq_n_f32(v))
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        F32x4(vld1q_f32(p))
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u16) -> Self {
        F32x4(vreinterpretq_f32_u32(vshll_n_u16::<16>(vld1_u16(p))))
    }
    #[inline(always)]
    unsafe fn load_i8(p: *const i8) -> Self {
        // Four bytes, read as one unaligned u32 so nothing past them is touched.
        let bytes = vreinterpret_s8_u32(vdup_n_u32((p as *const u32).read_unaligned()));
        F32x4(vcvtq_f32_s32(vmovl_s16(vget_low_s16(vmovl_s8(bytes)))))
    }
    #[inline(always)]
    unsafe fn prefetch(p: *const u8) {
        // The prefetch intrinsic is unstable on aarch64; PRFM is one instruction.
        std::arch::asm!("prfm pldl1keep, [{p}]", p = in(reg) p, options(nostack, readonly, preserves_flags))
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        vst1q_f32(p, self.0)
    }
    #[inline(always)]
    unsafe fn add(self, o: Self) -> Self {
        F32x4(vaddq_f32(self.0, o.0))
    }
    #[inline(always)]
    unsafe fn sub(self, o: Self) -> Self {
        F32x4(vsubq_f32(self.0, o.0))
    }
    #[inline(always)]
    unsafe fn mul(self, o: Self) -> Self {
        F32x4(vmulq_f32(self.0, o.0))
    }
    #[inline(always)]
    unsafe fn div(self, o: Self) -> Self {
        F32x4(vdivq_f32(self.0, o.0))
    }
    #[inline(always)]
    unsafe fn min(self, o: Self) -> Self {
        F32x4(vminq_f32(self.0, o.0))
    }
    #[inline(always)]
    unsafe fn max(self, o: Self) -> Self {
        // fmaxnm takes the number when one operand is NaN.
        F32x4(vmaxnmq_f32(self.0, o.0))
    }
    #[inline(always)]
    unsafe fn mul_add(self, a: Self, b: Self) -> Self {
        F32x4(vfmaq_f32(b.0, self.0, a.0))
    }
    #[inline(always)]
    unsafe fn max_lane(self) -> f32 {
        vmaxnmvq_f32(self.0)
    }
    #[inline(always)]
    unsafe fn round(self) -> Self {
        F32x4(vrndnq_f32(self.0))
    }
    #[inline(always)]
    unsafe fn exp2_int(self) -> Self {
        let n = vcvtnq_s32_f32(self.0);
        F32x4(vreinterpretq_f32_s32(vshlq_n_s32::<23>(vaddq_s32(n, vdupq_n_s32(127)))))
    }
    #[inline(always)]
    unsafe fn gt_bits(self, o: Self) -> u32 {
        lane_bits(vcgtq_f32(self.0, o.0))
    }
    #[inline(always)]
    unsafe fn eq_bits(self, o: Self) -> u32 {
        lane_bits(vceqq_f32(self.0, o.0))
    }
    #[inline(always)]
    unsafe fn select_bits(self, o: Self, bits: u32) -> Self {
        let lane_bit = vld1q_u32([1u32, 2, 4, 8].as_ptr());
        let set = vtstq_u32(vdupq_n_u32(bits), lane_bit);
        F32x4(vbslq_f32(set, self.0, o.0))
    }
    #[inline(always)]
    unsafe fn swap_pairs(self) -> Self {
        F32x4(vrev64q_f32(self.0))
    }
}

/// A comparison's all-ones lanes as bits `0..4`.
#[inline(always)]
unsafe fn lane_bits(mask: uint32x4_t) -> u32 {
    vaddvq_u32(vandq_u32(mask, vld1q_u32([1u32, 2, 4, 8].as_ptr())))
}

vector_kernels!(F32x4, "neon");
