//! Weight conversions at load: float32 rows to IEEE half with F16C, 8 values per instruction
//! (the portable conversion is a dozen integer operations per value).

use std::arch::x86_64::*;

/// As [`crate::packed::f32_to_f16`] on every value (round to nearest even).
///
/// # Safety
/// The CPU must have F16C (and AVX); `dst` is at least as long as `src`.
#[target_feature(enable = "avx,f16c")]
pub unsafe fn f32_to_f16_f16c(src: &[f32], dst: &mut [u16]) {
    assert!(dst.len() >= src.len());
    let whole = src.len() / 8 * 8;
    for i in (0..whole).step_by(8) {
        let half = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(src.as_ptr().add(i)));
        _mm_storeu_si128(dst.as_mut_ptr().add(i).cast(), half);
    }
    for (d, &s) in dst[whole..].iter_mut().zip(&src[whole..]) {
        *d = crate::packed::f32_to_f16(s);
    }
}

/// As [`crate::packed::f16_to_f32`] on every little-endian half in `src` (2 bytes each).
///
/// # Safety
/// The CPU must have F16C (and AVX); `dst` holds `src.len() / 2` values.
#[target_feature(enable = "avx,f16c")]
pub unsafe fn f16_bytes_to_f32_f16c(src: &[u8], dst: &mut [f32]) {
    assert_eq!(src.len(), 2 * dst.len());
    let whole = dst.len() / 8 * 8;
    for i in (0..whole).step_by(8) {
        let halves = _mm_loadu_si128(src.as_ptr().add(2 * i).cast());
        _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(halves));
    }
    for (d, s) in dst[whole..].iter_mut().zip(src[2 * whole..].chunks_exact(2)) {
        *d = crate::packed::f16_to_f32(u16::from_le_bytes([s[0], s[1]]));
    }
}
