//! Reference kernels in plain Rust: the fallback on every CPU and the twin each SIMD kernel is
//! tested against.

pub mod gemm;

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

pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len());
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
}

pub fn rmsnorm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let mean_sq = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let scale = 1.0 / (mean_sq + eps).sqrt();
    for ((o, v), w) in out.iter_mut().zip(x).zip(weight) {
        *o = v * scale * w;
    }
}

/// `gate = silu(gate) * up`, in place.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// Softmax in place; returns nothing because callers only need the normalized weights.
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

/// Rotary embedding, neox layout (Hugging Face's rotate_half): element `i` of the first half
/// pairs with element `i + d/2`. `cos`/`sin` hold `d/2` values for this position.
pub fn rope_neox(head: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = head.len() / 2;
    let (a, b) = head.split_at_mut(half);
    for i in 0..half {
        let (x0, x1) = (a[i], b[i]);
        a[i] = x0 * cos[i] - x1 * sin[i];
        b[i] = x1 * cos[i] + x0 * sin[i];
    }
}

#[cfg(test)]
mod tests;

/// Checks a SIMD kernel table against this reference on odd sizes (used by each arch's tests).
#[cfg(test)]
pub(crate) mod twin_tests;
