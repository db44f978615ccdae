//! aarch64 kernels: NEON (SVE, SDOT, I8MM and BF16 paths arrive with the kernels issue).

pub mod neon;

use crate::Kernels;

pub fn kernels() -> Option<Kernels> {
    if std::arch::is_aarch64_feature_detected!("neon") {
        Some(Kernels { isa: "neon", gemm_bt: neon::gemm_bt, dot: neon::dot, axpy: neon::axpy })
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn neon_matches_portable_on_odd_sizes() {
        if let Some(k) = super::kernels() {
            crate::portable::twin_tests::check_against_portable(&k);
        }
    }
}
