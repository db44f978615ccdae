//! Reference kernels in plain Rust: the fallback on every CPU and the twin each SIMD kernel is
//! tested against. Their doc comments are the contracts the SIMD twins keep.

pub mod attention;
pub mod gemm;
pub mod int4;
pub mod int8;
pub mod int8_block;

/// Partial sums every sum over a row is split into, whatever the register width: element `i`
/// goes to partial `i % SUM_LANES`, and [`add_partials`] adds them in one fixed tree. With FMA
/// where the contract says fused, every SIMD path then gets the bits of these twins, so a greedy
/// sequence on 8-bit activations (where a last-bit difference can move a quant) is the same on
/// every ISA.
pub const SUM_LANES: usize = 16;

/// The partial sums' total: halves added lane by lane (`p[i] + p[i + 8]`, then `+ 4`, `+ 2`,
/// `+ 1`), as a SIMD path folds a register.
pub fn add_partials(mut partials: [f32; SUM_LANES]) -> f32 {
    let mut width = SUM_LANES / 2;
    while width > 0 {
        for i in 0..width {
            partials[i] += partials[i + width];
        }
        width /= 2;
    }
    partials[0]
}

/// `Σ x_i y_i`, fused per element into [`SUM_LANES`] partial sums.
pub fn dot(x: &[f32], y: &[f32]) -> f32 {
    assert_eq!(x.len(), y.len());
    let mut partials = [0f32; SUM_LANES];
    for (i, (a, b)) in x.iter().zip(y).enumerate() {
        partials[i % SUM_LANES] = a.mul_add(*b, partials[i % SUM_LANES]);
    }
    add_partials(partials)
}

/// `y += a * x`, fused (also a logit bias, with `a = 1`).
pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len());
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi = a.mul_add(*xi, *yi);
    }
}

/// The residual add and RMSNorm of a decoder layer in one pass: `x += delta` (when given), then
/// `out = x * (1 / sqrt(dot(x, x) / n + eps)) * weight`.
pub fn add_rmsnorm(x: &mut [f32], delta: Option<&[f32]>, weight: &[f32], eps: f32, out: &mut [f32]) {
    assert!(x.len() == weight.len() && out.len() == x.len());
    if let Some(d) = delta {
        assert_eq!(d.len(), x.len());
        x.iter_mut().zip(d).for_each(|(a, b)| *a += b);
    }
    let scale = 1.0 / (dot(x, x) / x.len() as f32 + eps).sqrt();
    for ((o, v), w) in out.iter_mut().zip(x.iter()).zip(weight) {
        *o = v * scale * w;
    }
}

/// Below this `e^x` is clamped (to about 2^-126).
pub(crate) const EXP_LOWEST: f32 = -87.336_54;
/// Above this `e^x` is clamped (to e^88).
pub(crate) const EXP_HIGHEST: f32 = 88.0;
/// ln 2 split in two, so `n * LN2_HIGH` is exact for the `n` that occur.
pub(crate) const LN2_HIGH: f32 = 0.693_359_4;
pub(crate) const LN2_LOW: f32 = -2.121_944_4e-4;
/// Cephes' polynomial for `e^r` on the reduced argument, highest power first.
pub(crate) const EXP_POLYNOMIAL: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5];

/// `e^x` within 2 ulp where it does not overflow, in f32 steps that
/// [`crate::vector::F32Vector::exp`] repeats lane by lane (the platform's libm differs from one
/// system to the next). Below about -87.3 it returns about 2^-126, above 88 e^88.
// Not `clamp`: a NaN becomes the lower bound, as with the SIMD `max`.
#[allow(clippy::manual_clamp)]
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let x = x.max(EXP_LOWEST).min(EXP_HIGHEST);
    let n = (x * std::f32::consts::LOG2_E).round_ties_even();
    let r = n.mul_add(-LN2_HIGH, x);
    let r = n.mul_add(-LN2_LOW, r);
    let p = EXP_POLYNOMIAL[1..].iter().fold(EXP_POLYNOMIAL[0], |p, &c| p.mul_add(r, c));
    p.mul_add(r * r, r + 1.0) * f32::from_bits(((n as i32 + 127) << 23) as u32)
}

/// Cephes' polynomial for `ln(1 + r)` on the reduced argument, highest power first.
const LN_POLYNOMIAL: [f32; 9] =
    [7.037_683_6e-2, -1.151_461e-1, 1.167_699_9e-1, -1.242_014_1e-1, 1.424_932_3e-1, -1.666_805_8e-1, 2.000_071_4e-1, -2.499_999_4e-1, 3.333_333e-1];

/// `ln(x)` for positive normal `x`, within 2 ulp, in f32 steps of its own (as [`exp`], not the
/// platform's libm): `x = m 2^e` with `m` in [sqrt(1/2), sqrt(2)), then Cephes' polynomial in
/// `m - 1`. Scalar only: it serves per-token gates, not rows.
pub fn ln(x: f32) -> f32 {
    let bits = x.to_bits();
    let mut e = ((bits >> 23) & 0xff) as i32 - 126;
    let mut m = f32::from_bits((bits & 0x007f_ffff) | 0x3f00_0000); // in [0.5, 1)
    if m < std::f32::consts::FRAC_1_SQRT_2 {
        e -= 1;
        m += m;
    }
    let r = m - 1.0;
    let z = r * r;
    let p = LN_POLYNOMIAL[1..].iter().fold(LN_POLYNOMIAL[0], |p, &c| p.mul_add(r, c));
    let e = e as f32;
    let y = p * r * z + e * LN2_LOW - 0.5 * z;
    (r + y) + e * LN2_HIGH
}

/// `out = silu(gate) * up`, with `silu(g) = g / (1 + exp(-g))`.
pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(gate.len() == up.len() && out.len() == gate.len());
    for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (1.0 + exp(-g)) * u;
    }
}

/// `2 sqrt(2/pi)` and `2 sqrt(2/pi) * 0.044715`: [`gelu_tanh_mul`]'s sigmoid argument is
/// `g * (GELU_LINEAR + GELU_CUBIC * g^2)`.
pub(crate) const GELU_LINEAR: f32 = 1.595_769_2;
pub(crate) const GELU_CUBIC: f32 = 7.135_481_4e-2;
/// Gates below this give [`gelu_tanh_mul`] 0: the exact value underflows f32 there, and the
/// clamped [`exp`] would otherwise leave a gate of -inf at -inf.
pub(crate) const GELU_ZERO_BELOW: f32 = -20.0;

/// `out = gelu_tanh(gate) * up`, PyTorch's `gelu(approximate="tanh")`:
/// `0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))`, computed as the equal
/// `g / (1 + exp(-2 sqrt(2/pi) (g + 0.044715 g^3)))` (no `1 + tanh` to cancel for negative
/// gates), 0 below `GELU_ZERO_BELOW` (-20).
pub fn gelu_tanh_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(gate.len() == up.len() && out.len() == gate.len());
    for ((o, &g), u) in out.iter_mut().zip(gate).zip(up) {
        let x = (g * g).mul_add(-GELU_CUBIC, -GELU_LINEAR) * g;
        *o = if g < GELU_ZERO_BELOW { 0.0 } else { g / (1.0 + exp(x)) } * u;
    }
}

/// Up to this `|y|` [`tanh`] is a polynomial: `1 - 2 / (1 + e^2|y|)` would cancel there.
pub(crate) const TANH_POLYNOMIAL_BELOW: f32 = 0.625;
/// Cephes' polynomial for `(tanh(y) - y) / y^3` in `y^2`, highest power first.
pub(crate) const TANH_POLYNOMIAL: [f32; 5] = [-5.704_988_7e-3, 2.063_908_8e-2, -5.373_971_5e-2, 0.133_314_42, -0.333_332_8];

/// `tanh(y)` as Cephes' `tanhf` (within 2 ulp): `y + y^3 P(y^2)` up to |y| = 0.625,
/// `±(1 - 2 / (1 + exp(2|y|)))` past it with [`exp`] (so ±1 from |y| = 44 on, ±inf included),
/// in f32 steps that `vector::elementwise::tanh` repeats lane by lane. NaN stays NaN.
pub fn tanh(y: f32) -> f32 {
    let a = y.abs();
    if a > TANH_POLYNOMIAL_BELOW {
        let t = 1.0 - 2.0 / (1.0 + exp(a + a));
        if y < 0.0 {
            -t
        } else {
            t
        }
    } else {
        let s = y * y;
        let p = TANH_POLYNOMIAL[1..].iter().fold(TANH_POLYNOMIAL[0], |p, &c| p.mul_add(s, c));
        (p * s).mul_add(y, y)
    }
}

/// Soft-capping in place, `x = cap * tanh(x / cap)`: Gemma 2 bounds its attention scores and
/// its final logits to `(-cap, cap)` this way, smoothly.
pub fn softcap(x: &mut [f32], cap: f32) {
    x.iter_mut().for_each(|v| *v = cap * tanh(*v / cap));
}

/// Softmax in place: `exp(x - max)`, summed into [`SUM_LANES`] partial sums, times `1 / sum`.
pub fn softmax(x: &mut [f32]) {
    softmax_with_sink(x, None);
}

/// [`softmax`] with an optional extra logit (an attention sink, gpt-oss) that joins the max and
/// the denominator but has no output of its own: its exponential is added after the partial sums.
pub fn softmax_with_sink(x: &mut [f32], sink: Option<f32>) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let max = sink.map_or(max, |s| max.max(s));
    let sum = exp_shifted_sum(x, max);
    let inv = 1.0 / sink.map_or(sum, |s| sum + exp(s - max));
    x.iter_mut().for_each(|v| *v *= inv);
}

/// `x = exp(x - max)` in place; returns their sum, in [`SUM_LANES`] partial sums.
pub fn exp_shifted_sum(x: &mut [f32], max: f32) -> f32 {
    let mut partials = [0f32; SUM_LANES];
    for (i, v) in x.iter_mut().enumerate() {
        *v = exp(*v - max);
        partials[i % SUM_LANES] += *v;
    }
    add_partials(partials)
}

/// gpt-oss's clamped SwiGLU's limit and sigmoid scale.
pub(crate) const SWIGLU_LIMIT: f32 = 7.0;
pub(crate) const SWIGLU_ALPHA: f32 = 1.702;

/// gpt-oss's SwiGLU: `out = (clamp(up, -7, 7) + 1) * g * sigmoid(1.702 * g)` with
/// `g = min(gate, 7)`. A NaN gate counts as -inf and a NaN up as -7: `max` comes first, as the
/// vector twins' `max` takes the number on every ISA (their `min` does not).
#[allow(clippy::manual_clamp)] // `clamp` keeps a NaN, which the vector twins cannot match
pub fn clamped_swiglu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(gate.len() == up.len() && out.len() == gate.len());
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        let g = g.max(f32::NEG_INFINITY).min(SWIGLU_LIMIT);
        let u = u.max(-SWIGLU_LIMIT).min(SWIGLU_LIMIT);
        *o = (u + 1.0) * (g / (1.0 + exp(-SWIGLU_ALPHA * g)));
    }
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
/// `x[i] = fma(x[partner(i)], sin[i], x[i] * cos[i])`. The tables hold one position's values per
/// element, the sine negated where the rotation subtracts (see [`rope_tables`]), so both styles
/// are the same elementwise product.
pub fn rope(heads: &mut [f32], cos: &[f32], sin: &[f32], style: RopeStyle) {
    let d = cos.len();
    assert!(sin.len() == d && d.is_multiple_of(2) && heads.len().is_multiple_of(d));
    let mut rotated = vec![0f32; d];
    for head in heads.chunks_exact_mut(d) {
        for (i, r) in rotated.iter_mut().enumerate() {
            *r = rotate(head, i, cos, sin, style);
        }
        head.copy_from_slice(&rotated);
    }
}

/// Element `i` of `head` rotated, as [`rope`] says.
#[inline(always)]
pub fn rotate(head: &[f32], i: usize, cos: &[f32], sin: &[f32], style: RopeStyle) -> f32 {
    head[style.partner(i, cos.len())].mul_add(sin[i], head[i] * cos[i])
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
