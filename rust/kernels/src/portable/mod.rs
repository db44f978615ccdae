//! Reference kernels in plain Rust: the fallback on every CPU and the twin each SIMD kernel is
//! tested against. Their doc comments are the contracts the SIMD twins keep.

pub mod attention;
pub mod gemm;
pub mod gemm_i8;
pub mod gemm_q4;
pub mod gemm_q8;

/// Independent partial sums, so the compiler can vectorize the dot product.
const LANES: usize = 8;

pub fn dot(x: &[f32], y: &[f32]) -> f32 {
    assert_eq!(x.len(), y.len());
    let mut acc = [0f32; LANES];
    let body = x.len() / LANES * LANES;
    for (xc, yc) in x[..body].chunks_exact(LANES).zip(y[..body].chunks_exact(LANES)) {
        for l in 0..LANES {
            acc[l] += xc[l] * yc[l];
        }
    }
    let mut sum = acc.iter().sum::<f32>();
    for i in body..x.len() {
        sum += x[i] * y[i];
    }
    sum
}

/// `y += a * x` (also a logit bias, with `a = 1`).
pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len());
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
}

/// The residual add and RMSNorm of a decoder layer in one pass: `x += delta` (when given), then
/// `out = x / rms(x) * weight`.
pub fn add_rmsnorm(x: &mut [f32], delta: Option<&[f32]>, weight: &[f32], eps: f32, out: &mut [f32]) {
    assert!(x.len() == weight.len() && out.len() == x.len());
    if let Some(d) = delta {
        assert_eq!(d.len(), x.len());
        x.iter_mut().zip(d).for_each(|(a, b)| *a += b);
    }
    let mean_sq = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let scale = 1.0 / (mean_sq + eps).sqrt();
    for ((o, v), w) in out.iter_mut().zip(x.iter()).zip(weight) {
        *o = v * scale * w;
    }
}

/// `out = silu(gate) * up`, with `silu(g) = g / (1 + e^-g)`.
pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(gate.len() == up.len() && out.len() == gate.len());
    for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (1.0 + (-g).exp()) * u;
    }
}

/// Softmax in place.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// How a rotary embedding pairs a head's elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Hugging Face's `rotate_half`: element `i` pairs with `i + d/2`.
    Neox,
    /// GPT-J and llama.cpp's "normal" mode: element `2i` pairs with `2i + 1`.
    GptJ,
}

impl RopeStyle {
    /// The element rotated with element `i` of a `d`-long head.
    pub fn partner(self, i: usize, d: usize) -> usize {
        match self {
            RopeStyle::Neox => (i + d / 2) % d,
            RopeStyle::GptJ => i ^ 1,
        }
    }
}

/// Rotates every head of `heads` (concatenated, each `cos.len()` long) in place:
/// `x[i] = x[i] * cos[i] + x[partner(i)] * sin[i]`. The tables hold one position's values per
/// element, the sine negated where the rotation subtracts (see [`rope_tables`]), so both styles
/// are the same elementwise product.
pub fn rope(heads: &mut [f32], cos: &[f32], sin: &[f32], style: RopeStyle) {
    let d = cos.len();
    assert!(sin.len() == d && d.is_multiple_of(2) && heads.len().is_multiple_of(d));
    let mut rotated = vec![0f32; d];
    for head in heads.chunks_exact_mut(d) {
        for (i, r) in rotated.iter_mut().enumerate() {
            *r = head[i] * cos[i] + head[style.partner(i, d)] * sin[i];
        }
        head.copy_from_slice(&rotated);
    }
}

/// One position's `cos` and signed `sin` tables for [`rope`], from its `d/2` rotation angles.
pub fn rope_tables(angles: &[f64], style: RopeStyle, cos: &mut [f32], sin: &mut [f32]) {
    let d = 2 * angles.len();
    assert!(cos.len() == d && sin.len() == d);
    for i in 0..d {
        let (pair, first) = match style {
            RopeStyle::Neox => (i % (d / 2), i < d / 2),
            RopeStyle::GptJ => (i / 2, i % 2 == 0),
        };
        cos[i] = angles[pair].cos() as f32;
        // The first of a pair gets `x0 cos - x1 sin`, the second `x1 cos + x0 sin`.
        sin[i] = if first { -angles[pair].sin() } else { angles[pair].sin() } as f32;
    }
}

/// Index of the largest value; the first one on ties. NaN is never picked over a number.
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, v) in x.iter().enumerate() {
        if *v > x[best] || x[best].is_nan() && !v.is_nan() {
            best = i;
        }
    }
    best
}

/// The `k` largest values with their indices, largest first, the lower index first on ties
/// (NaN ranks below every number). Clears `out` first.
pub fn top_k(x: &[f32], k: usize, out: &mut Vec<(f32, u32)>) {
    out.clear();
    out.extend(x.iter().enumerate().map(|(i, &v)| (v, i as u32)));
    let k = k.min(out.len());
    if k == 0 {
        out.clear();
        return;
    }
    if k < out.len() {
        out.select_nth_unstable_by(k - 1, rank);
        out.truncate(k);
    }
    out.sort_unstable_by(rank);
}

/// The order of [`top_k`]: larger value first, then lower index.
pub fn rank(a: &(f32, u32), b: &(f32, u32)) -> std::cmp::Ordering {
    let key = |v: f32| if v.is_nan() { f32::NEG_INFINITY } else { v };
    key(b.0).total_cmp(&key(a.0)).then(a.1.cmp(&b.1))
}

/// Sets every logit whose bit is clear in `allowed` (bit `i % 32` of word `i / 32`) to -inf:
/// the token mask of constrained decoding.
pub fn apply_token_mask(logits: &mut [f32], allowed: &[u32]) {
    assert!(allowed.len() * 32 >= logits.len(), "apply_token_mask: the mask covers {} tokens, the logits {}", allowed.len() * 32, logits.len());
    for (i, l) in logits.iter_mut().enumerate() {
        if allowed[i / 32] >> (i % 32) & 1 == 0 {
            *l = f32::NEG_INFINITY;
        }
    }
}

#[cfg(test)]
mod tests;

/// Checks a SIMD kernel table against this reference on odd sizes (used by each arch's tests).
#[cfg(test)]
pub(crate) mod twin_tests;
