//! x86_64 kernels: AVX2 + FMA (AVX-512 arrives with the kernels issue).

pub mod avx2;

use crate::Kernels;

pub fn kernels() -> Option<Kernels> {
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        Some(Kernels { isa: "avx2", gemm_bt: avx2::gemm_bt, dot: avx2::dot, axpy: avx2::axpy })
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn avx2_matches_portable_on_odd_sizes() {
        if let Some(k) = super::kernels() {
            crate::portable::twin_tests::check_against_portable(&k);
        }
    }
}
