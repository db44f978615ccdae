//! aarch64 kernels: NEON.

pub mod neon;

use crate::Kernels;

pub fn paths() -> Vec<Kernels> {
    if std::arch::is_aarch64_feature_detected!("neon") {
        vec![Kernels { isa: "neon", gemm: crate::portable::gemm::gemm, bf16_activations: false, dot: neon::dot, axpy: neon::axpy }]
    } else {
        Vec::new()
    }
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
