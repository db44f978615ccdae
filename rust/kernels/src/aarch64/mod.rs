//! aarch64 kernels: NEON everywhere, `BFDOT` for bf16 weights where the CPU has FEAT_BF16, on SVE
//! vectors of any length where it has SVE too; int8 GEMMs on `SMMLA`, `SDOT` or widening NEON.

/// Calls `$f::<R>$args` with `R` = `$rows`, which must be one of the listed tile heights
/// (`$f::<G, ..>`: `$f::<R, G, ..>`).
macro_rules! by_rows {
    (@match $rows:expr, $f:ident, $generics:tt, $args:tt, [$($r:literal)*]) => {
        match $rows {
            $($r => by_rows!(@call $f, $r, $generics, $args),)*
            rows => unreachable!("no tile of {rows} rows"),
        }
    };
    (@call $f:ident, $r:literal, ($($g:tt)*), $args:tt) => {
        $f::<$r $($g)*> $args
    };
    ($rows:expr, $f:ident $(::<$($g:tt),*>)?, $args:tt, [$($r:literal)*]) => {
        by_rows!(@match $rows, $f, ($($(, $g)*)?), $args, [$($r)*])
    };
}

/// `acc + w · x[group LANE]` per output, by element.
macro_rules! sdot_lane {
    ($acc:expr, $w:expr, $x:expr, $lane:literal) => {{
        let mut acc: int32x4_t = $acc;
        asm!(concat!("sdot {acc:v}.4s, {w:v}.16b, {x:v}.4b[", $lane, "]"), acc = inout(vreg) acc, w = in(vreg) $w, x = in(vreg) $x,
             options(pure, nomem, nostack, preserves_flags));
        acc
    }};
}

pub mod bf16;
pub mod int4;
pub mod int8;
pub mod int8_block;
pub mod neon;
pub mod sve;
mod vec128;

use crate::{Int8Gemm, Kernels};
use std::arch::is_aarch64_feature_detected;

/// The paths this CPU supports, best first.
pub fn paths() -> Vec<Kernels> {
    let mut paths = Vec::new();
    if !is_aarch64_feature_detected!("neon") {
        return paths;
    }
    let int8 = Int8Gemm::best();
    if is_aarch64_feature_detected!("bf16") && is_aarch64_feature_detected!("sve") {
        paths.push(vec128::vector_kernels("sve-bf16", sve::gemm, int8, true));
    }
    if is_aarch64_feature_detected!("bf16") {
        paths.push(vec128::vector_kernels("neon-bf16", bf16::gemm, int8, true));
    }
    paths.push(vec128::vector_kernels("neon", neon::gemm, int8, false));
    paths
}

// No SVE int8 GEMMs: SVE's SDOT/SMMLA work per 128-bit segment, NEON's width on N2/V2 and no faster on V1 (2x256-bit SVE = its 4x128-bit NEON pipes).
/// The int8 GEMMs this CPU supports, best first.
pub fn int8_paths() -> Vec<Int8Gemm> {
    let mut paths = Vec::new();
    if !is_aarch64_feature_detected!("neon") {
        return paths;
    }
    let dotprod = is_aarch64_feature_detected!("dotprod");
    if dotprod && is_aarch64_feature_detected!("i8mm") {
        paths.push(Int8Gemm { isa: "i8mm", gemm: int8::gemm_i8_i8mm, gemm_q4: int4::gemm_q4_i8mm, gemm_q8: int8_block::gemm_q8_i8mm });
    }
    if dotprod {
        paths.push(Int8Gemm { isa: "dotprod", gemm: int8::gemm_i8_dotprod, gemm_q4: int4::gemm_q4_dotprod, gemm_q8: int8_block::gemm_q8_dotprod });
    }
    paths.push(Int8Gemm { isa: "neon", gemm: int8::gemm_i8_neon, gemm_q4: int4::gemm_q4_neon, gemm_q8: int8_block::gemm_q8_neon });
    paths
}

#[cfg(test)]
mod tests {
    use crate::portable::twin_tests::{assert_paths_ran, check_against_portable, check_blocks_paths_against_portable, check_int8_against_portable};
    use std::arch::is_aarch64_feature_detected;

    // NEON is in the aarch64 baseline, so its paths are always expected: the lists are never empty.
    #[test]
    fn every_path_matches_portable_on_odd_sizes() {
        let mut ran = Vec::new();
        for k in super::paths() {
            check_against_portable(&k);
            ran.push(k.isa);
        }
        let bf16 = is_aarch64_feature_detected!("bf16");
        assert_paths_ran("SIMD", &ran, &[("sve-bf16", bf16 && is_aarch64_feature_detected!("sve")), ("neon-bf16", bf16), ("neon", true)]);
    }

    #[test]
    fn every_int8_path_matches_portable_exactly() {
        let mut ran = Vec::new();
        for path in super::int8_paths() {
            check_int8_against_portable(&path);
            check_blocks_paths_against_portable(&path);
            ran.push(path.isa);
        }
        let dotprod = is_aarch64_feature_detected!("dotprod");
        assert_paths_ran("int8", &ran, &[("i8mm", dotprod && is_aarch64_feature_detected!("i8mm")), ("dotprod", dotprod), ("neon", true)]);
    }
}
