//! [`F32Vector`] on AVX2 + FMA registers, and the vector kernels built on it.

use crate::vector::{vector_kernels, F32Vector};
use std::arch::x86_64::*;

#[derive(Clone, Copy)]
pub struct F32x8(__m256);

impl F32Vector for F32x8 {
    const LANES: usize = 8;
    const REGISTERS: usize = 16;
    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        F32x8(_mm256_set1_ps(v))
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        F32x8(_mm256_loadu_ps(p))
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u16) -> Self {
        F32x8(_mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i)))))
    }
    #[inline(always)]
    unsafe fn load_i8(p: *const i8) -> Self {
        F32x8(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i))))
    }
    #[inline(always)]
    unsafe fn prefetch(p: *const u8) {
        _mm_prefetch::<_MM_HINT_T0>(p as *const i8)
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        _mm256_storeu_ps(p, self.0)
    }
    #[inline(always)]
    unsafe fn add(self, o: Self) -> Self {
        F32x8(_mm256_add_ps(self.0, o.0))
    }
    #[inline(always)]
    unsafe fn sub(self, o: Self) -> Self {
        F32x8(_mm256_sub_ps(self.0, o.0))
    }
    #[inline(always)]
    unsafe fn mul(self, o: Self) -> Self {
        F32x8(_mm256_mul_ps(self.0, o.0))
    }
    #[inline(always)]
    unsafe fn div(self, o: Self) -> Self {
        F32x8(_mm256_div_ps(self.0, o.0))
    }
    #[inline(always)]
    unsafe fn min(self, o: Self) -> Self {
        F32x8(_mm256_min_ps(self.0, o.0))
    }
    #[inline(always)]
    unsafe fn max(self, o: Self) -> Self {
        // maxps returns its second operand when either is NaN.
        F32x8(_mm256_max_ps(self.0, o.0))
    }
    #[inline(always)]
    unsafe fn mul_add(self, a: Self, b: Self) -> Self {
        F32x8(_mm256_fmadd_ps(self.0, a.0, b.0))
    }
    #[inline(always)]
    unsafe fn max_lane(self) -> f32 {
        let quad = _mm_max_ps(_mm256_castps256_ps128(self.0), _mm256_extractf128_ps(self.0, 1));
        let pair = _mm_max_ps(quad, _mm_movehl_ps(quad, quad));
        _mm_cvtss_f32(_mm_max_ss(pair, _mm_shuffle_ps(pair, pair, 1)))
    }
    #[inline(always)]
    unsafe fn round(self) -> Self {
        F32x8(_mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(self.0))
    }
    #[inline(always)]
    unsafe fn exp2_int(self) -> Self {
        let n = _mm256_cvtps_epi32(self.0);
        F32x8(_mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n, _mm256_set1_epi32(127)))))
    }
    #[inline(always)]
    unsafe fn gt_bits(self, o: Self) -> u32 {
        _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GT_OQ>(self.0, o.0)) as u32
    }
    #[inline(always)]
    unsafe fn eq_bits(self, o: Self) -> u32 {
        _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(self.0, o.0)) as u32
    }
    #[inline(always)]
    unsafe fn select_bits(self, o: Self, bits: u32) -> Self {
        let lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
        let set = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(bits as i32), lane_bit), lane_bit);
        F32x8(_mm256_blendv_ps(o.0, self.0, _mm256_castsi256_ps(set)))
    }
    #[inline(always)]
    unsafe fn swap_pairs(self) -> Self {
        F32x8(_mm256_permute_ps::<0b10_11_00_01>(self.0))
    }
}

vector_kernels!(F32x8, "avx2,fma");
