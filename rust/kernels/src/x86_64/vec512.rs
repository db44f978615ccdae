//! [`F32Vector`] on AVX-512 registers, and the vector kernels built on it.

use crate::vector::{vector_kernels, F32Vector};
use std::arch::x86_64::*;

#[derive(Clone, Copy)]
pub struct F32x16(__m512);

impl F32Vector for F32x16 {
    const LANES: usize = 16;
    const REGISTERS: usize = 32;
    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        F32x16(_mm512_set1_ps(v))
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        F32x16(_mm512_loadu_ps(p))
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u16) -> Self {
        F32x16(_mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i)))))
    }
    #[inline(always)]
    unsafe fn load_i8(p: *const i8) -> Self {
        F32x16(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i))))
    }
    #[inline(always)]
    unsafe fn prefetch(p: *const u8) {
        _mm_prefetch::<_MM_HINT_T0>(p as *const i8)
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        _mm512_storeu_ps(p, self.0)
    }
    #[inline(always)]
    unsafe fn add(self, o: Self) -> Self {
        F32x16(_mm512_add_ps(self.0, o.0))
    }
    #[inline(always)]
    unsafe fn sub(self, o: Self) -> Self {
        F32x16(_mm512_sub_ps(self.0, o.0))
    }
    #[inline(always)]
    unsafe fn mul(self, o: Self) -> Self {
        F32x16(_mm512_mul_ps(self.0, o.0))
    }
    #[inline(always)]
    unsafe fn div(self, o: Self) -> Self {
        F32x16(_mm512_div_ps(self.0, o.0))
    }
    #[inline(always)]
    unsafe fn min(self, o: Self) -> Self {
        F32x16(_mm512_min_ps(self.0, o.0))
    }
    #[inline(always)]
    unsafe fn max(self, o: Self) -> Self {
        // vmaxps returns its second operand when either is NaN.
        F32x16(_mm512_max_ps(self.0, o.0))
    }
    #[inline(always)]
    unsafe fn mul_add(self, a: Self, b: Self) -> Self {
        F32x16(_mm512_fmadd_ps(self.0, a.0, b.0))
    }
    #[inline(always)]
    unsafe fn max_lane(self) -> f32 {
        _mm512_reduce_max_ps(self.0)
    }
    #[inline(always)]
    unsafe fn round(self) -> Self {
        F32x16(_mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(self.0))
    }
    #[inline(always)]
    unsafe fn exp2_int(self) -> Self {
        let n = _mm512_cvtps_epi32(self.0);
        F32x16(_mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(n, _mm512_set1_epi32(127)))))
    }
    #[inline(always)]
    unsafe fn gt_bits(self, o: Self) -> u32 {
        _mm512_cmp_ps_mask::<_CMP_GT_OQ>(self.0, o.0) as u32
    }
    #[inline(always)]
    unsafe fn eq_bits(self, o: Self) -> u32 {
        _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(self.0, o.0) as u32
    }
    #[inline(always)]
    unsafe fn select_bits(self, o: Self, bits: u32) -> Self {
        F32x16(_mm512_mask_blend_ps(bits as u16, o.0, self.0))
    }
    #[inline(always)]
    unsafe fn swap_pairs(self) -> Self {
        F32x16(_mm512_permute_ps::<0b10_11_00_01>(self.0))
    }
}

vector_kernels!(F32x16, "avx512f,avx512bw,avx512vl,fma");
