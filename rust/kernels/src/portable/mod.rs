//! Reference kernels in plain Rust: the fallback on every CPU and the twin each SIMD kernel is
//! tested against. Written with 8 independent partial sums so the compiler can vectorize them.

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

pub fn gemm_bt(x: &[f32], w: &[f32], k: usize, out: &mut [f32]) {
    let (m, n) = gemm_dims(x, w, k, out);
    for i in 0..m {
        let row = &x[i * k..(i + 1) * k];
        for j in 0..n {
            out[i * n + j] = dot(row, &w[j * k..(j + 1) * k]);
        }
    }
}

pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len());
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
}

/// The loop shared by the SIMD `gemm_bt`s: four rows of `x` at a time share each weight row
/// (weights are the bytes that cost), leftover rows go one by one. `dot4` and `dot1` must reduce
/// each row identically so results do not depend on `m`. Inlined into each caller so the SIMD
/// dot products compile with the caller's target features.
#[inline(always)]
pub fn gemm_bt_rows4(
    x: &[f32],
    w: &[f32],
    k: usize,
    out: &mut [f32],
    dot4: impl Fn([&[f32]; 4], &[f32]) -> [f32; 4],
    dot1: impl Fn(&[f32], &[f32]) -> f32,
) {
    let (m, n) = gemm_dims(x, w, k, out);
    let row = |i: usize| &x[i * k..(i + 1) * k];
    let mut i = 0;
    while i + 4 <= m {
        let xs = [row(i), row(i + 1), row(i + 2), row(i + 3)];
        for j in 0..n {
            let d = dot4(xs, &w[j * k..(j + 1) * k]);
            for (r, v) in d.into_iter().enumerate() {
                out[(i + r) * n + j] = v;
            }
        }
        i += 4;
    }
    for i in i..m {
        for j in 0..n {
            out[i * n + j] = dot1(row(i), &w[j * k..(j + 1) * k]);
        }
    }
}

/// Checks the shapes of a `gemm_bt` call and returns `(m, n)`.
pub fn gemm_dims(x: &[f32], w: &[f32], k: usize, out: &[f32]) -> (usize, usize) {
    assert!(k > 0 && x.len() % k == 0 && w.len() % k == 0, "gemm_bt: k must divide x and w");
    let (m, n) = (x.len() / k, w.len() / k);
    assert_eq!(out.len(), m * n, "gemm_bt: out must be [m, n]");
    (m, n)
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
