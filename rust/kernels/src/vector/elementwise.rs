//! Row kernels over [`F32Vector`]: the vector body runs on whole registers and a scalar tail
//! finishes each row. Contracts are those of the portable twins in [`crate::portable`], to the
//! bit: sums keep their [`SUM_LANES`] partial sums, exponentials are [`portable::exp`].

use super::F32Vector;
use crate::portable::{self, RopeStyle, SUM_LANES};
use std::collections::BinaryHeap;

/// Registers of [`SUM_LANES`] partial sums: at most 4, as registers have 4 lanes or more.
const PARTIAL_REGISTERS: usize = 4;

/// Lanes `r * LANES..(r + 1) * LANES` of the partial sums are register `r`'s.
#[inline(always)]
unsafe fn partials<V: F32Vector>(registers: &[V; PARTIAL_REGISTERS]) -> [f32; SUM_LANES] {
    const { assert!(SUM_LANES.is_multiple_of(V::LANES) && SUM_LANES / V::LANES <= PARTIAL_REGISTERS) };
    let mut lanes = [0f32; SUM_LANES];
    for (r, register) in registers[..SUM_LANES / V::LANES].iter().enumerate() {
        register.store(lanes.as_mut_ptr().add(r * V::LANES));
    }
    lanes
}

/// [`portable::dot`]: [`SUM_LANES`] elements a step, the rest into their partial sums one by one.
#[inline(always)]
pub unsafe fn dot<V: F32Vector>(x: &[f32], y: &[f32]) -> f32 {
    assert_eq!(x.len(), y.len());
    let body = x.len() / SUM_LANES * SUM_LANES;
    let (xp, yp) = (x.as_ptr(), y.as_ptr());
    let mut acc = [V::zero(); PARTIAL_REGISTERS];
    for i in (0..body).step_by(SUM_LANES) {
        for (r, acc) in acc[..SUM_LANES / V::LANES].iter_mut().enumerate() {
            let at = i + r * V::LANES;
            *acc = V::load(xp.add(at)).mul_add(V::load(yp.add(at)), *acc);
        }
    }
    let mut lanes = partials(&acc);
    for (lane, i) in (body..x.len()).enumerate() {
        lanes[lane] = x[i].mul_add(y[i], lanes[lane]);
    }
    portable::add_partials(lanes)
}

#[inline(always)]
pub unsafe fn axpy<V: F32Vector>(a: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len());
    let body = x.len() / V::LANES * V::LANES;
    let (xp, yp, va) = (x.as_ptr(), y.as_mut_ptr(), V::splat(a));
    for i in (0..body).step_by(V::LANES) {
        va.mul_add(V::load(xp.add(i)), V::load(yp.add(i))).store(yp.add(i));
    }
    portable::axpy(a, &x[body..], &mut y[body..]);
}

#[inline(always)]
pub unsafe fn add_rmsnorm<V: F32Vector>(x: &mut [f32], delta: Option<&[f32]>, weight: &[f32], eps: f32, out: &mut [f32]) {
    let n = x.len();
    assert!(weight.len() == n && out.len() == n);
    let body = n / V::LANES * V::LANES;
    if let Some(d) = delta {
        assert_eq!(d.len(), n);
        let (xp, dp) = (x.as_mut_ptr(), d.as_ptr());
        for i in (0..body).step_by(V::LANES) {
            V::load(xp.add(i)).add(V::load(dp.add(i))).store(xp.add(i));
        }
        x[body..].iter_mut().zip(&d[body..]).for_each(|(a, b)| *a += b);
    }
    let scale = 1.0 / (dot::<V>(x, x) / n as f32 + eps).sqrt();
    let (xp, wp, op, vs) = (x.as_ptr(), weight.as_ptr(), out.as_mut_ptr(), V::splat(scale));
    for i in (0..body).step_by(V::LANES) {
        V::load(xp.add(i)).mul(vs).mul(V::load(wp.add(i))).store(op.add(i));
    }
    for i in body..n {
        out[i] = x[i] * scale * weight[i];
    }
}

#[inline(always)]
pub unsafe fn silu_mul<V: F32Vector>(gate: &[f32], up: &[f32], out: &mut [f32]) {
    let n = gate.len();
    assert!(up.len() == n && out.len() == n);
    let body = n / V::LANES * V::LANES;
    let (gp, upp, op, one) = (gate.as_ptr(), up.as_ptr(), out.as_mut_ptr(), V::splat(1.0));
    for i in (0..body).step_by(V::LANES) {
        let g = V::load(gp.add(i));
        let e = V::zero().sub(g).exp();
        g.div(one.add(e)).mul(V::load(upp.add(i))).store(op.add(i));
    }
    portable::silu_mul(&gate[body..], &up[body..], &mut out[body..]);
}

#[inline(always)]
pub unsafe fn gelu_tanh_mul<V: F32Vector>(gate: &[f32], up: &[f32], out: &mut [f32]) {
    let n = gate.len();
    assert!(up.len() == n && out.len() == n);
    let body = n / V::LANES * V::LANES;
    let (gp, upp, op, one) = (gate.as_ptr(), up.as_ptr(), out.as_mut_ptr(), V::splat(1.0));
    let (linear, cubic, zero_below) = (V::splat(-portable::GELU_LINEAR), V::splat(-portable::GELU_CUBIC), V::splat(portable::GELU_ZERO_BELOW));
    for i in (0..body).step_by(V::LANES) {
        let g = V::load(gp.add(i));
        let e = g.mul(g).mul_add(cubic, linear).mul(g).exp();
        let gelu = V::zero().select_bits(g.div(one.add(e)), zero_below.gt_bits(g));
        gelu.mul(V::load(upp.add(i))).store(op.add(i));
    }
    portable::gelu_tanh_mul(&gate[body..], &up[body..], &mut out[body..]);
}

#[inline(always)]
pub unsafe fn clamped_swiglu_mul<V: F32Vector>(gate: &[f32], up: &[f32], out: &mut [f32]) {
    let n = gate.len();
    assert!(up.len() == n && out.len() == n);
    let body = n / V::LANES * V::LANES;
    let (gp, upp, op, one) = (gate.as_ptr(), up.as_ptr(), out.as_mut_ptr(), V::splat(1.0));
    let (limit, alpha) = (V::splat(portable::SWIGLU_LIMIT), V::splat(-portable::SWIGLU_ALPHA));
    for i in (0..body).step_by(V::LANES) {
        let g = V::load(gp.add(i)).max(V::splat(f32::NEG_INFINITY)).min(limit);
        let u = V::load(upp.add(i)).max(V::zero().sub(limit)).min(limit);
        let sigmoid_g = g.div(one.add(alpha.mul(g).exp()));
        u.add(one).mul(sigmoid_g).store(op.add(i));
    }
    portable::clamped_swiglu_mul(&gate[body..], &up[body..], &mut out[body..]);
}

/// [`portable::tanh`] lane by lane: both branches, then each lane takes its own.
#[inline(always)]
pub unsafe fn tanh<V: F32Vector>(y: V) -> V {
    let (zero, one) = (V::zero(), V::splat(1.0));
    let a = y.max(zero.sub(y));
    let t = one.sub(V::splat(2.0).div(one.add(a.add(a).exp())));
    let far = zero.sub(t).select_bits(t, zero.gt_bits(y));
    let s = y.mul(y);
    let mut p = V::splat(portable::TANH_POLYNOMIAL[0]);
    for c in &portable::TANH_POLYNOMIAL[1..] {
        p = p.mul_add(s, V::splat(*c));
    }
    let near = p.mul(s).mul_add(y, y);
    far.select_bits(near, a.gt_bits(V::splat(portable::TANH_POLYNOMIAL_BELOW)))
}

#[inline(always)]
pub unsafe fn softcap<V: F32Vector>(x: &mut [f32], cap: f32) {
    let body = x.len() / V::LANES * V::LANES;
    let (p, vc) = (x.as_mut_ptr(), V::splat(cap));
    for i in (0..body).step_by(V::LANES) {
        tanh::<V>(V::load(p.add(i)).div(vc)).mul(vc).store(p.add(i));
    }
    portable::softcap(&mut x[body..], cap);
}

#[inline(always)]
pub(crate) unsafe fn max_of<V: F32Vector>(x: &[f32]) -> f32 {
    let body = x.len() / V::LANES * V::LANES;
    let mut acc = V::splat(f32::NEG_INFINITY);
    for i in (0..body).step_by(V::LANES) {
        acc = V::load(x.as_ptr().add(i)).max(acc);
    }
    x[body..].iter().fold(acc.max_lane(), |m, &v| if v > m { v } else { m })
}

/// [`portable::exp_shifted_sum`]'s twin.
#[inline(always)]
pub(crate) unsafe fn exp_shifted<V: F32Vector>(x: &mut [f32], max: f32) -> f32 {
    let body = x.len() / SUM_LANES * SUM_LANES;
    let (p, vm) = (x.as_mut_ptr(), V::splat(max));
    let mut acc = [V::zero(); PARTIAL_REGISTERS];
    for i in (0..body).step_by(SUM_LANES) {
        for (r, acc) in acc[..SUM_LANES / V::LANES].iter_mut().enumerate() {
            let at = p.add(i + r * V::LANES);
            let e = V::load(at).sub(vm).exp();
            e.store(at);
            *acc = acc.add(e);
        }
    }
    let mut lanes = partials(&acc);
    for (lane, v) in x[body..].iter_mut().enumerate() {
        *v = portable::exp(*v - max);
        lanes[lane] += *v;
    }
    portable::add_partials(lanes)
}

#[inline(always)]
pub(crate) unsafe fn scale<V: F32Vector>(x: &mut [f32], by: f32) {
    let body = x.len() / V::LANES * V::LANES;
    let (p, vs) = (x.as_mut_ptr(), V::splat(by));
    for i in (0..body).step_by(V::LANES) {
        V::load(p.add(i)).mul(vs).store(p.add(i));
    }
    x[body..].iter_mut().for_each(|v| *v *= by);
}

#[inline(always)]
pub unsafe fn softmax<V: F32Vector>(x: &mut [f32]) {
    softmax_with_sink::<V>(x, None);
}

/// [`portable::softmax_with_sink`]'s twin.
#[inline(always)]
pub unsafe fn softmax_with_sink<V: F32Vector>(x: &mut [f32], sink: Option<f32>) {
    let max = max_of::<V>(x);
    let max = sink.map_or(max, |s| max.max(s));
    let sum = exp_shifted::<V>(x, max);
    scale::<V>(x, 1.0 / sink.map_or(sum, |s| sum + portable::exp(s - max)));
}

#[inline(always)]
pub unsafe fn rope<V: F32Vector>(heads: &mut [f32], cos: &[f32], sin: &[f32], style: RopeStyle) {
    let d = cos.len();
    assert!(sin.len() == d && d.is_multiple_of(2) && heads.len().is_multiple_of(d));
    let (c, s, l) = (cos.as_ptr(), sin.as_ptr(), V::LANES);
    for head in heads.chunks_exact_mut(d) {
        let h = head.as_mut_ptr();
        let done = match style {
            RopeStyle::Neox => {
                let half = d / 2;
                let body = half / l * l;
                for i in (0..body).step_by(l) {
                    let (a, b) = (V::load(h.add(i)), V::load(h.add(half + i)));
                    b.mul_add(V::load(s.add(i)), a.mul(V::load(c.add(i)))).store(h.add(i));
                    a.mul_add(V::load(s.add(half + i)), b.mul(V::load(c.add(half + i)))).store(h.add(half + i));
                }
                body
            }
            RopeStyle::GptJ => {
                let body = d / l * l;
                for i in (0..body).step_by(l) {
                    let x = V::load(h.add(i));
                    x.swap_pairs().mul_add(V::load(s.add(i)), x.mul(V::load(c.add(i)))).store(h.add(i));
                }
                body
            }
        };
        // The pairs the vector body left (a neox half or a gpt-j head not a multiple of LANES).
        let rest: Vec<usize> = match style {
            RopeStyle::Neox => (done..d / 2).flat_map(|i| [i, i + d / 2]).collect(),
            RopeStyle::GptJ => (done..d).collect(),
        };
        let rotated: Vec<f32> = rest.iter().map(|&i| portable::rotate(head, i, cos, sin, style)).collect();
        rest.iter().zip(rotated).for_each(|(&i, v)| head[i] = v);
    }
}

#[inline(always)]
pub unsafe fn argmax<V: F32Vector>(x: &[f32]) -> usize {
    let max = max_of::<V>(x);
    let body = x.len() / V::LANES * V::LANES;
    let vm = V::splat(max);
    for i in (0..body).step_by(V::LANES) {
        let hits = V::load(x.as_ptr().add(i)).eq_bits(vm);
        if hits != 0 {
            return i + hits.trailing_zeros() as usize;
        }
    }
    // The maximum is in the tail, or every value is NaN (index 0, as the portable twin).
    (body..x.len()).find(|&i| x[i] == max).unwrap_or(0)
}

/// A candidate of [`top_k`], ordered so the heap's top is the worst kept one.
struct Worst((f32, u32));

impl PartialEq for Worst {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o).is_eq()
    }
}
impl Eq for Worst {}
impl PartialOrd for Worst {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Worst {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        portable::rank(&self.0, &o.0)
    }
}

/// Keeps the best `k` in a heap; once it is full, a register of values is only looked at lane by
/// lane when one of them beats the worst kept value, which after a few thousand values is rare.
#[inline(always)]
pub unsafe fn top_k<V: F32Vector>(x: &[f32], k: usize, out: &mut Vec<(f32, u32)>) {
    out.clear();
    let k = k.min(x.len());
    if k == 0 {
        return;
    }
    let mut heap: BinaryHeap<Worst> = x[..k].iter().enumerate().map(|(i, &v)| Worst((v, i as u32))).collect();
    // Ranks as the portable twin: NaN below every number. A later equal value ranks lower (its
    // index is higher), so only strictly greater values can enter.
    let key = |v: f32| if v.is_nan() { f32::NEG_INFINITY } else { v };
    let mut worst = key(heap.peek().expect("k > 0").0 .0);
    let mut offer = |i: usize, worst: &mut f32| {
        if x[i] > *worst {
            heap.pop();
            heap.push(Worst((x[i], i as u32)));
            *worst = key(heap.peek().expect("k > 0").0 .0);
        }
    };
    let first_vector = k.next_multiple_of(V::LANES).min(x.len());
    (k..first_vector).for_each(|i| offer(i, &mut worst));
    let body = first_vector + (x.len() - first_vector) / V::LANES * V::LANES;
    for i in (first_vector..body).step_by(V::LANES) {
        let mut above = V::load(x.as_ptr().add(i)).gt_bits(V::splat(worst));
        while above != 0 {
            offer(i + above.trailing_zeros() as usize, &mut worst);
            above &= above - 1;
        }
    }
    (body..x.len()).for_each(|i| offer(i, &mut worst));
    out.extend(heap.into_iter().map(|w| w.0));
    out.sort_unstable_by(portable::rank);
}

#[inline(always)]
pub unsafe fn apply_token_mask<V: F32Vector>(logits: &mut [f32], allowed: &[u32]) {
    assert!(allowed.len() * 32 >= logits.len(), "apply_token_mask: the mask covers {} tokens, the logits {}", allowed.len() * 32, logits.len());
    let whole_words = logits.len() / 32;
    let (p, banned, lane_mask) = (logits.as_mut_ptr(), V::splat(f32::NEG_INFINITY), (1u64 << V::LANES) as u32 - 1);
    for (w, &bits) in allowed[..whole_words].iter().enumerate() {
        if bits == u32::MAX {
            continue; // every token of the word allowed: the common case, nothing to write
        }
        for lane0 in (0..32).step_by(V::LANES) {
            let at = p.add(w * 32 + lane0);
            V::load(at).select_bits(banned, (bits >> lane0) & lane_mask).store(at);
        }
    }
    portable::apply_token_mask(&mut logits[whole_words * 32..], &allowed[whole_words..]);
}
