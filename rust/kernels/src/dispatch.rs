//! Picks the best implementation of each kernel for this CPU, once.
//!
//! `RSGL_KERNELS=portable|avx2|neon` forces one path (to test every branch on one machine);
//! asking for a path the CPU lacks falls back to portable with a warning.

use std::sync::OnceLock;

/// `out[i * n + j] = x[i, :] · w[j, :]` for `i < m`, `j < n`, with `x` of shape `[m, k]` and
/// `w` of shape `[n, k]`. Every output element is reduced in the same order whatever `m` is,
/// so a sequence gets bit-identical results alone or in a batch.
pub type GemmBtFn = fn(x: &[f32], w: &[f32], k: usize, out: &mut [f32]);
/// `y += a * x`
pub type AxpyFn = fn(a: f32, x: &[f32], y: &mut [f32]);
/// `x · y`
pub type DotFn = fn(x: &[f32], y: &[f32]) -> f32;

/// The kernels chosen for this CPU.
#[derive(Clone, Copy)]
pub struct Kernels {
    /// Name of the chosen path ("portable", "avx2", "neon"), reported by the engine.
    pub isa: &'static str,
    pub gemm_bt: GemmBtFn,
    pub dot: DotFn,
    pub axpy: AxpyFn,
}

impl Kernels {
    pub fn portable() -> Kernels {
        Kernels {
            isa: "portable",
            gemm_bt: crate::portable::gemm_bt,
            dot: crate::portable::dot,
            axpy: crate::portable::axpy,
        }
    }

    /// The best path this CPU supports, or `None` when it only has the portable one.
    pub fn best_simd() -> Option<Kernels> {
        #[cfg(target_arch = "x86_64")]
        {
            crate::x86_64::kernels()
        }
        #[cfg(target_arch = "aarch64")]
        {
            crate::aarch64::kernels()
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            None
        }
    }

    /// Resolve a path by name: "auto", "portable" or a SIMD path name.
    pub fn by_name(name: &str) -> Option<Kernels> {
        match name {
            "auto" | "" => Some(Self::best_simd().unwrap_or_else(Self::portable)),
            "portable" => Some(Self::portable()),
            other => Self::best_simd().filter(|k| k.isa == other),
        }
    }
}

/// The process-wide kernel table (honours `RSGL_KERNELS`).
pub fn kernels() -> &'static Kernels {
    static CHOSEN: OnceLock<Kernels> = OnceLock::new();
    CHOSEN.get_or_init(|| {
        let wanted = std::env::var("RSGL_KERNELS").unwrap_or_default();
        Kernels::by_name(&wanted).unwrap_or_else(|| {
            eprintln!("rsgl: kernel path {wanted:?} is not available on this CPU; using portable");
            Kernels::portable()
        })
    })
}
