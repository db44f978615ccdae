//! Mamba-2's selective state space recurrence (SSD, state space duality), per head: a state `S`
//! of `[state_size][head_dim]` that every token decays by a scalar and writes its input into,
//!
//! ```text
//! S = exp(Δ_t A) S + Δ_t B_t ⊗ x_t;  y_t = Sᵀ C_t + D x_t
//! ```
//!
//! (Δ after its softplus, A < 0, by the caller). [`recurrent`] steps token by token (decode);
//! [`chunked`] computes runs of [`CHUNK`] tokens at once (prefill): within a chunk the outputs are
//! a masked, decayed `C Bᵀ` times the inputs plus the entering state's part, and the state passes
//! from chunk to chunk once. Plain Rust without fused multiply-adds and with the portable `exp`,
//! as [`crate::delta_rule`]: the same bits on every CPU; the two forms agree to rounding.

use crate::delta_rule::{chunk_edges, mul_add, transpose};
use crate::portable::exp;

/// Tokens per chunk of [`chunked`].
pub const CHUNK: usize = 64;

/// One head of one sequence over a run of tokens: rows of `head_dim` (x, out) and `state_size`
/// (B, C) elements and one step size `dt` per token; the head's decay rate `a` (< 0) and skip
/// weight `d`.
pub struct SsdRun<'a> {
    pub x: &'a [f32],
    pub dt: &'a [f32],
    pub b: &'a [f32],
    pub c: &'a [f32],
    pub a: f32,
    pub d: f32,
    pub head_dim: usize,
    pub state_size: usize,
}

impl SsdRun<'_> {
    fn tokens(&self) -> usize {
        self.dt.len()
    }

    /// Tokens `start..end` of the run.
    pub fn slice(&self, start: usize, end: usize) -> SsdRun<'_> {
        let (p, n) = (self.head_dim, self.state_size);
        SsdRun { x: &self.x[start * p..end * p], dt: &self.dt[start..end], b: &self.b[start * n..end * n], c: &self.c[start * n..end * n], ..*self }
    }
}

/// Steps `state` (`[state_size][head_dim]`) through the run token by token, writing each token's
/// output row to `out` (`tokens x head_dim`).
pub fn recurrent(run: &SsdRun, state: &mut [f32], out: &mut [f32]) {
    let (p, n) = (run.head_dim, run.state_size);
    for t in 0..run.tokens() {
        let (x, b, c, dt) = (&run.x[t * p..(t + 1) * p], &run.b[t * n..(t + 1) * n], &run.c[t * n..(t + 1) * n], run.dt[t]);
        let decay = exp(dt * run.a);
        let o = &mut out[t * p..(t + 1) * p];
        o.fill(0.0);
        for ((row, &bi), &ci) in state.chunks_exact_mut(p).zip(b).zip(c) {
            let write = dt * bi;
            for ((s, &xj), o) in row.iter_mut().zip(x).zip(o.iter_mut()) {
                *s = *s * decay + write * xj;
                *o += *s * ci;
            }
        }
        o.iter_mut().zip(x).for_each(|(o, &xj)| *o += run.d * xj);
    }
}

/// The same as [`recurrent`], a chunk of up to [`CHUNK`] tokens at a time. The run's first
/// token is at `position` of its sequence and chunks end at multiples of [`CHUNK`]: a sequence
/// computed in runs that split at such multiples gets the bits of one run.
pub fn chunked(run: &SsdRun, position: usize, state: &mut [f32], out: &mut [f32]) {
    let mut scratch = ChunkScratch::new(run.head_dim, run.state_size);
    for (start, end) in chunk_edges(run.tokens(), position) {
        chunk(&run.slice(start, end), state, &mut out[start * run.head_dim..end * run.head_dim], &mut scratch);
    }
}

/// Buffers one chunk's products live in, sized for a whole chunk.
struct ChunkScratch {
    decay_log: Vec<f32>,
    inputs: Vec<f32>,
    bt: Vec<f32>,
    square: Vec<f32>,
    scaled_c: Vec<f32>,
}

impl ChunkScratch {
    fn new(p: usize, n: usize) -> Self {
        ChunkScratch {
            decay_log: vec![0.0; CHUNK],
            inputs: vec![0.0; CHUNK * p],
            bt: vec![0.0; n * CHUNK],
            square: vec![0.0; CHUNK * CHUNK],
            scaled_c: vec![0.0; CHUNK * n],
        }
    }
}

/// One chunk of `c` tokens. With `G` the running sum of `Δ A` within the chunk and
/// `X = diag(Δ) x`, the outputs are `((C Bᵀ) ∘ exp(G_i - G_j))_lower X + diag(exp(G)) C S + D x`
/// and the state becomes `exp(G_last) S + (diag(exp(G_last - G)) B)ᵀ X`.
fn chunk(run: &SsdRun, state: &mut [f32], out: &mut [f32], s: &mut ChunkScratch) {
    let (p, n, c) = (run.head_dim, run.state_size, run.tokens());
    let gsum = &mut s.decay_log[..c];
    let mut total = 0.0f32;
    for (sum, &dt) in gsum.iter_mut().zip(run.dt) {
        total += dt * run.a;
        *sum = total;
    }
    let inputs = &mut s.inputs[..c * p];
    for ((row, x), &dt) in inputs.chunks_exact_mut(p).zip(run.x.chunks_exact(p)).zip(run.dt) {
        row.iter_mut().zip(x).for_each(|(r, &x)| *r = x * dt);
    }
    let bt = &mut s.bt[..n * c];
    transpose(run.b, c, n, bt);
    // The chunk's own part: C Bᵀ, decayed from each token to each later one.
    let square = &mut s.square[..c * c];
    square.fill(0.0);
    mul_add(run.c, bt, square, c, n, c, None);
    for i in 0..c {
        for j in 0..c {
            square[i * c + j] = if j <= i { square[i * c + j] * exp(gsum[i] - gsum[j]) } else { 0.0 };
        }
    }
    out.fill(0.0);
    mul_add(square, inputs, out, c, c, p, Some(c));
    // The entering state's part, decayed to each token.
    let scaled_c = &mut s.scaled_c[..c * n];
    for ((row, cr), &gs) in scaled_c.chunks_exact_mut(n).zip(run.c.chunks_exact(n)).zip(gsum.iter()) {
        let f = exp(gs);
        row.iter_mut().zip(cr).for_each(|(r, &x)| *r = x * f);
    }
    mul_add(scaled_c, state, out, c, n, p, None);
    for (o, x) in out.chunks_exact_mut(p).zip(run.x.chunks_exact(p)) {
        o.iter_mut().zip(x).for_each(|(o, &x)| *o += run.d * x);
    }
    // The state: decayed over the chunk, plus each token's write decayed from it to the end.
    let last = gsum[c - 1];
    let chunk_decay = exp(last);
    state.iter_mut().for_each(|x| *x *= chunk_decay);
    for row in bt.chunks_exact_mut(c) {
        row.iter_mut().zip(gsum.iter()).for_each(|(x, &g)| *x *= exp(last - g));
    }
    mul_add(bt, inputs, state, n, c, p, None);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic pseudo-random stream in [-1, 1).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// The recurrence written out as it is defined, in f64.
    fn reference(run: &SsdRun, state: &mut [f64]) -> Vec<f64> {
        let (p, n) = (run.head_dim, run.state_size);
        let mut out = vec![0.0; run.tokens() * p];
        for t in 0..run.tokens() {
            let dt = run.dt[t] as f64;
            let decay = (dt * run.a as f64).exp();
            for i in 0..n {
                for j in 0..p {
                    state[i * p + j] = state[i * p + j] * decay + dt * run.b[t * n + i] as f64 * run.x[t * p + j] as f64;
                }
            }
            for j in 0..p {
                out[t * p + j] = (0..n).map(|i| state[i * p + j] * run.c[t * n + i] as f64).sum::<f64>() + run.d as f64 * run.x[t * p + j] as f64;
            }
        }
        out
    }

    fn run_of<'a>(x: &'a [f32], dt: &'a [f32], b: &'a [f32], c: &'a [f32], head_dim: usize, state_size: usize) -> SsdRun<'a> {
        SsdRun { x, dt, b, c, a: -0.8, d: 0.6, head_dim, state_size }
    }

    /// A way to run the recurrence.
    type Form = dyn Fn(&SsdRun, &mut [f32], &mut [f32]);

    #[test]
    fn chunked_and_recurrent_follow_the_recurrence_over_odd_sizes_and_chunk_edges() {
        for (tokens, p, n) in [(1, 3, 5), (7, 5, 3), (CHUNK, 8, 8), (CHUNK + 1, 4, 7), (2 * CHUNK + 13, 9, 6)] {
            let (x, b, c) = (values(tokens * p, 1), values(tokens * n, 2), values(tokens * n, 3));
            let dt: Vec<f32> = values(tokens, 4).iter().map(|v| 0.3 * (v + 1.0)).collect();
            let run = run_of(&x, &dt, &b, &c, p, n);
            let start = values(n * p, 5);
            let mut exact: Vec<f64> = start.iter().map(|&v| v as f64).collect();
            let want = reference(&run, &mut exact);
            let chunked_from = |position: usize| move |run: &SsdRun, state: &mut [f32], out: &mut [f32]| chunked(run, position, state, out);
            let forms: [(&str, &Form); 3] = [("recurrent", &recurrent), ("chunked", &chunked_from(0)), ("chunked at 5", &chunked_from(5))];
            for (name, f) in forms {
                let (mut state, mut out) = (start.clone(), vec![0.0; tokens * p]);
                f(&run, &mut state, &mut out);
                let worst = |a: &[f32], b: &[f64]| a.iter().zip(b).map(|(&x, &y)| (x as f64 - y).abs()).fold(0.0, f64::max);
                assert!(worst(&out, &want) < 2e-4, "{name} {tokens}x{p}x{n}: outputs off by {}", worst(&out, &want));
                assert!(worst(&state, &exact) < 2e-4, "{name} {tokens}x{p}x{n}: state off by {}", worst(&state, &exact));
            }
        }
    }

    #[test]
    fn a_run_split_anywhere_continues_from_its_state() {
        let (tokens, p, n) = (CHUNK + 30, 6, 5);
        let (x, b, c) = (values(tokens * p, 6), values(tokens * n, 7), values(tokens * n, 8));
        let dt: Vec<f32> = values(tokens, 9).iter().map(|v| 0.1 * (v + 1.0)).collect();
        let run = run_of(&x, &dt, &b, &c, p, n);
        let (mut whole_state, mut whole) = (vec![0.0; n * p], vec![0.0; tokens * p]);
        chunked(&run, 0, &mut whole_state, &mut whole);
        let split = 41;
        let (mut state, mut out) = (vec![0.0; n * p], vec![0.0; tokens * p]);
        chunked(&run.slice(0, split), 0, &mut state, &mut out[..split * p]);
        recurrent(&run.slice(split, split + 1), &mut state, &mut out[split * p..(split + 1) * p]);
        chunked(&run.slice(split + 1, tokens), split + 1, &mut state, &mut out[(split + 1) * p..]);
        let worst = out.iter().zip(&whole).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert!(worst < 1e-5, "split run off by {worst}");
        // Split only at the chunk edge: the same bits.
        let (mut state, mut out) = (vec![0.0; n * p], vec![0.0; tokens * p]);
        chunked(&run.slice(0, CHUNK), 0, &mut state, &mut out[..CHUNK * p]);
        chunked(&run.slice(CHUNK, tokens), CHUNK, &mut state, &mut out[CHUNK * p..]);
        assert_eq!((out, state), (whole, whole_state));
    }
}
