//! x86_64 kernels: AVX-512 (with bf16 dot products) and AVX2 + FMA + F16C.

pub mod avx2;
pub mod avx512;

use crate::Kernels;

pub fn paths() -> Vec<Kernels> {
    let mut paths = Vec::new();
    let has_avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c");
    if has_avx2 && avx512::detected() {
        paths.push(Kernels { isa: "avx512", gemm: avx512::gemm, bf16_activations: true, dot: avx2::dot, axpy: avx2::axpy });
    }
    if has_avx2 {
        paths.push(Kernels { isa: "avx2", gemm: avx2::gemm, bf16_activations: false, dot: avx2::dot, axpy: avx2::axpy });
    }
    paths
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_path_matches_portable_on_odd_sizes() {
        for k in super::paths() {
            crate::portable::twin_tests::check_against_portable(&k);
        }
    }
}
