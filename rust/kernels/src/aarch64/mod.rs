//! aarch64 kernels: NEON everywhere, `BFDOT` for bf16 weights where the CPU has FEAT_BF16.

/// Calls `$f::<R>$args` with `R` = `$rows`, which must be one of the listed tile heights.
macro_rules! by_rows {
    ($rows:expr, $f:ident, $args:tt, [$($r:literal)*]) => {
        match $rows {
            $($r => $f::<$r> $args,)*
            rows => unreachable!("no tile of {rows} rows"),
        }
    };
}

pub mod bf16;
pub mod neon;

use crate::Kernels;
use std::arch::is_aarch64_feature_detected;

/// The paths this CPU supports, best first.
pub fn paths() -> Vec<Kernels> {
    let mut paths = Vec::new();
    if !is_aarch64_feature_detected!("neon") {
        return paths;
    }
    if is_aarch64_feature_detected!("bf16") {
        paths.push(Kernels { isa: "neon-bf16", gemm: bf16::gemm, bf16_activations: true, dot: neon::dot, axpy: neon::axpy });
    }
    paths.push(Kernels { isa: "neon", gemm: neon::gemm, bf16_activations: false, dot: neon::dot, axpy: neon::axpy });
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
