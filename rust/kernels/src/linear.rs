//! A dense layer over the compute pool: `out = x · Wᵀ (+ bias)` with `W` pre-packed.

use crate::dispatch::{GemmArgs, Kernels};
use crate::packed::{activations_to_bf16, PackedWeights, WeightDtype};
use crate::pool::{split, SendPtr, ThreadPool};

/// Panels handed to a thread come in pairs, the widest tile any kernel uses.
const PANEL_UNIT: usize = 2;

/// `x` is `[m, w.k]` and `out` `[m, w.n]`. `bf16_scratch` holds the bf16 copy of `x` for
/// kernels that want one (kept by the caller so decode steps do not allocate).
pub fn linear(kern: &Kernels, pool: &ThreadPool, x: &[f32], w: &PackedWeights, bias: Option<&[f32]>, out: &mut [f32], bf16_scratch: &mut Vec<u16>) {
    let m = x.len() / w.k;
    assert_eq!(x.len(), m * w.k, "linear: x must be [m, {}]", w.k);
    assert_eq!(out.len(), m * w.n, "linear: out must be [m, {}]", w.n);
    if m == 0 {
        return;
    }
    let x_bf16: &[u16] = if kern.bf16_activations && w.dtype == WeightDtype::BF16 {
        activations_to_bf16(x, w.k, bf16_scratch);
        bf16_scratch
    } else {
        &[]
    };
    let args = GemmArgs { m, x, x_bf16 };
    let panels = w.panels();
    let units = panels.div_ceil(PANEL_UNIT);
    let shares = pool.threads().min(units);
    let dst = SendPtr(out.as_mut_ptr());
    pool.run(&|share| {
        if share >= shares {
            return;
        }
        let units = split(units, shares, share);
        let range = units.start * PANEL_UNIT..(units.end * PANEL_UNIT).min(panels);
        let dst = dst;
        // SAFETY: `out` is [m, n]; each share writes only the columns of its own panels.
        unsafe { (kern.gemm)(&args, w, range, dst.0, w.n) };
    });
    if let Some(b) = bias {
        out.chunks_exact_mut(w.n).for_each(|row| row.iter_mut().zip(b).for_each(|(o, b)| *o += b));
    }
}
