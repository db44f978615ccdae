//! x86_64 kernels: AVX-512 (two paths for bf16 weights: widening + FMA, `vdpbf16ps`) and AVX2 +
//! FMA + F16C; GEMMs in `avx2` and `avx512`, every other kernel from the vector kernels over
//! `vec256` / `vec512`.

/// Calls a GEMM tile function `$f::<ROWS, PANELS>` for the run-time shape: the decode shapes
/// (one row by 1..=4 panels, two rows by 1..=2) and the taller `(rows, panels)` shapes listed.
macro_rules! by_tile_shape {
    ($rows:expr, $np:expr, $f:ident, $args:tt, [$(($r:literal, $p:literal))*]) => {
        match ($rows, $np) {
            (1, 1) => $f::<1, 1> $args,
            (1, 2) => $f::<1, 2> $args,
            (1, 3) => $f::<1, 3> $args,
            (1, 4) => $f::<1, 4> $args,
            (2, 1) => $f::<2, 1> $args,
            (2, 2) => $f::<2, 2> $args,
            $(($r, $p) => $f::<$r, $p> $args,)*
            (rows, panels) => unreachable!("no GEMM tile of {rows} rows by {panels} panels"),
        }
    };
}

pub mod amx;
pub mod avx2;
pub mod avx512;
pub mod convert;
pub mod int4;
pub mod int8;
pub mod int8_block;
mod vec256;
mod vec512;

use crate::{Int8Gemm, Kernels};
use std::arch::x86_64::__cpuid;

pub fn paths() -> Vec<Kernels> {
    let mut paths = Vec::new();
    let has_avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c");
    if has_avx2 && avx512::detected() {
        let best_int8 = Int8Gemm::best();
        let widening = vec512::vector_kernels("avx512", avx512::gemm, best_int8, false);
        let bf16_dot = vec512::vector_kernels("avx512-bf16", avx512::gemm_bf16_dot, best_int8, true);
        // Intel cores run `vdpbf16ps` below the FMA rate (see `avx512`); Zen 4/5 at twice it.
        if is_amd() {
            paths.extend([bf16_dot, widening]);
        } else {
            paths.extend([widening, bf16_dot]);
        }
    }
    if has_avx2 {
        paths.push(vec256::vector_kernels("avx2", avx2::gemm, avx2_int8(), false));
    }
    paths
}

fn is_amd() -> bool {
    let vendor = __cpuid(0);
    [vendor.ebx, vendor.edx, vendor.ecx].iter().flat_map(|r| r.to_le_bytes()).eq(*b"AuthenticAMD")
}

/// The int8 GEMMs this CPU supports, best first.
pub fn int8_paths() -> Vec<Int8Gemm> {
    let mut paths = Vec::new();
    if amx::detected() {
        // AMX from a few rows, VNNI below (see `amx`).
        paths.push(Int8Gemm { isa: "avx512-amx", gemm: amx::gemm_i8_amx, gemm_q4: amx::gemm_q4_amx, gemm_q8: amx::gemm_q8_amx });
    }
    if int8::vnni_detected() {
        paths.push(Int8Gemm { isa: "avx512-vnni", gemm: int8::gemm_i8_vnni, gemm_q4: int4::gemm_q4_vnni, gemm_q8: int8_block::gemm_q8_vnni });
    }
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
        paths.push(avx2_int8());
    }
    paths
}

/// The AVX2 GEMMs on int8 activations; only handed out after detecting avx2, fma and f16c.
fn avx2_int8() -> Int8Gemm {
    Int8Gemm { isa: "avx2", gemm: int8::gemm_i8_avx2, gemm_q4: int4::gemm_q4_avx2, gemm_q8: int8_block::gemm_q8_avx2 }
}

#[cfg(test)]
mod tests {
    use crate::portable::twin_tests::{assert_paths_ran, check_against_portable, check_blocks_paths_against_portable, check_int8_against_portable};

    fn has_avx2() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
    }

    #[test]
    fn every_path_matches_portable_on_odd_sizes() {
        let mut ran = Vec::new();
        for k in super::paths() {
            check_against_portable(&k);
            ran.push(k.isa);
        }
        let avx512 = has_avx2()
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512bf16");
        assert_paths_ran("SIMD", &ran, &[("avx512", avx512), ("avx512-bf16", avx512), ("avx2", has_avx2())]);
    }

    #[test]
    fn every_int8_path_matches_portable_exactly() {
        let mut ran = Vec::new();
        for path in super::int8_paths() {
            check_int8_against_portable(&path);
            check_blocks_paths_against_portable(&path);
            ran.push(path.isa);
        }
        let vnni = is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") && is_x86_feature_detected!("avx512vnni");
        let amx = vnni && std::arch::x86_64::__cpuid_count(7, 0).edx & (3 << 24) == 3 << 24;
        assert_paths_ran("int8", &ran, &[("avx512-amx", amx), ("avx512-vnni", vnni), ("avx2", has_avx2())]);
    }
}
