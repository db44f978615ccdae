//! The gated delta rule, Gated DeltaNet's recurrence (Qwen3-Next, Qwen3.5): per value head, a
//! state `S` of `[key_dim][value_dim]` that every token decays and corrects towards its value,
//!
//! ```text
//! S = exp(g_t) S;  S += k_t ⊗ β_t (v_t - Sᵀ k_t);  o_t = Sᵀ q_t
//! ```
//!
//! (q and k L2-normalized, q scaled, by the caller). [`recurrent`] steps token by token (decode);
//! [`chunked`] computes runs of [`CHUNK`] tokens at once in the WY/UT form (prefill): within a
//! chunk the corrections are solved as one triangular system, and everything else is products of
//! small matrices. Both are plain Rust with no fused multiply-adds and the portable `exp`, so
//! they give the same bits on every CPU (their inner loops run along contiguous rows, which the
//! compiler vectorizes without reordering any sum); they agree with each other to rounding.

use crate::portable::exp;

/// Tokens per chunk of [`chunked`] (flash-linear-attention's and transformers' choice).
pub const CHUNK: usize = 64;

/// One value head of one sequence over a run of tokens: rows of `key_dim` (q, k) and
/// `value_dim` (v, out) elements, one decay log `g` (≤ 0) and one write strength `beta` per token.
pub struct DeltaRun<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub g: &'a [f32],
    pub beta: &'a [f32],
    pub key_dim: usize,
    pub value_dim: usize,
}

impl DeltaRun<'_> {
    fn tokens(&self) -> usize {
        self.g.len()
    }

    /// Tokens `start..end` of the run.
    pub fn slice(&self, start: usize, end: usize) -> DeltaRun<'_> {
        let (dk, dv) = (self.key_dim, self.value_dim);
        DeltaRun {
            q: &self.q[start * dk..end * dk],
            k: &self.k[start * dk..end * dk],
            v: &self.v[start * dv..end * dv],
            g: &self.g[start..end],
            beta: &self.beta[start..end],
            key_dim: dk,
            value_dim: dv,
        }
    }
}

/// Steps `state` (`[key_dim][value_dim]`) through the run token by token, writing each token's
/// output row to `out` (`tokens x value_dim`). Inlined into each kernel path's twin
/// (`Kernels::delta_rule_recurrent`), which the compiler vectorizes for that path's registers.
#[inline(always)]
pub fn recurrent(run: &DeltaRun, state: &mut [f32], out: &mut [f32]) {
    let (dk, dv) = (run.key_dim, run.value_dim);
    let mut correction = vec![0.0f32; dv];
    for t in 0..run.tokens() {
        let (q, k, v) = (&run.q[t * dk..(t + 1) * dk], &run.k[t * dk..(t + 1) * dk], &run.v[t * dv..(t + 1) * dv]);
        let decay = exp(run.g[t]);
        // Decay the state and read what it recalls for k, a block of columns at a time.
        for_column_blocks(dv, |start, width| {
            let mut recalled = [0.0f32; COLUMNS];
            for (row, &ki) in state.chunks_exact_mut(dv).zip(k) {
                for (s, c) in row[start..start + width].iter_mut().zip(&mut recalled) {
                    *s *= decay;
                    *c += *s * ki;
                }
            }
            correction[start..start + width].copy_from_slice(&recalled[..width]);
        });
        for (c, &vj) in correction.iter_mut().zip(v) {
            *c = (vj - *c) * run.beta[t];
        }
        // Write the correction and read the output.
        let o = &mut out[t * dv..(t + 1) * dv];
        for_column_blocks(dv, |start, width| {
            let (mut sums, correction) = ([0.0f32; COLUMNS], &correction[start..start + width]);
            for (row, (&ki, &qi)) in state.chunks_exact_mut(dv).zip(k.iter().zip(q)) {
                for ((s, &c), o) in row[start..start + width].iter_mut().zip(correction).zip(&mut sums) {
                    *s += ki * c;
                    *o += *s * qi;
                }
            }
            o[start..start + width].copy_from_slice(&sums[..width]);
        });
    }
}

/// Columns whose sums a pass keeps in registers (four AVX2 vectors): each sum still adds its
/// terms in the same order, so blocking changes no bits, only the loads and stores.
const COLUMNS: usize = 32;

/// Calls `f(start, width)` for the blocks of up to [`COLUMNS`] columns of `n`; whole blocks get
/// the constant width, which lets the compiler keep their sums in registers.
#[inline(always)]
fn for_column_blocks(n: usize, mut f: impl FnMut(usize, usize)) {
    let whole = n / COLUMNS * COLUMNS;
    for start in (0..whole).step_by(COLUMNS) {
        f(start, COLUMNS);
    }
    if whole < n {
        f(whole, n - whole);
    }
}

/// The same as [`recurrent`], a chunk of up to [`CHUNK`] tokens at a time. The run's first
/// token is at `position` of its sequence and chunks end at multiples of [`CHUNK`]: a sequence
/// computed in runs that split at such multiples gets the bits of one run.
#[inline(always)]
pub fn chunked(run: &DeltaRun, position: usize, state: &mut [f32], out: &mut [f32]) {
    let mut scratch = ChunkScratch::new(run.key_dim, run.value_dim);
    for (start, end) in chunk_edges(run.tokens(), position) {
        chunk(&run.slice(start, end), state, &mut out[start * run.value_dim..end * run.value_dim], &mut scratch);
    }
}

/// The `(start, end)` token ranges of a run of `tokens` whose first is at `position`, cut where
/// positions reach a multiple of [`CHUNK`] (shared with the Mamba-2 scan, `crate::ssd`).
#[inline(always)]
pub(crate) fn chunk_edges(tokens: usize, position: usize) -> impl Iterator<Item = (usize, usize)> {
    let mut start = 0;
    std::iter::from_fn(move || {
        if start == tokens {
            return None;
        }
        let end = tokens.min(start + CHUNK - (position + start) % CHUNK);
        Some((std::mem::replace(&mut start, end), end))
    })
}

/// Buffers one chunk's products live in, sized for a whole chunk.
struct ChunkScratch {
    decay_log: Vec<f32>,
    kt: Vec<f32>,
    square: Vec<f32>,
    solve: Vec<f32>,
    scaled: Vec<f32>,
    u: Vec<f32>,
    w: Vec<f32>,
}

impl ChunkScratch {
    fn new(dk: usize, dv: usize) -> Self {
        let d = dk.max(dv);
        ChunkScratch {
            decay_log: vec![0.0; CHUNK],
            kt: vec![0.0; dk * CHUNK],
            square: vec![0.0; CHUNK * CHUNK],
            solve: vec![0.0; CHUNK * CHUNK],
            scaled: vec![0.0; CHUNK * d],
            u: vec![0.0; CHUNK * dv],
            w: vec![0.0; CHUNK * dk],
        }
    }
}

/// One chunk of `c` tokens. With `G` the running sum of the decay logs within the chunk and
/// `D[i][j] = exp(G_i - G_j)` (j ≤ i), the corrections are `U - W S` where
/// `T = (I + diag(β) (K Kᵀ ∘ D)_strictly_lower)⁻¹`, `U = T diag(β) V` and
/// `W = T diag(β exp(G)) K`; the outputs are `diag(exp(G)) Q S + (Q Kᵀ ∘ D)_lower (U - W S)`,
/// and the state becomes `exp(G_last) S + (diag(exp(G_last - G)) K)ᵀ (U - W S)`.
#[inline(always)]
fn chunk(run: &DeltaRun, state: &mut [f32], out: &mut [f32], s: &mut ChunkScratch) {
    let (dk, dv, c) = (run.key_dim, run.value_dim, run.tokens());
    let gsum = &mut s.decay_log[..c];
    let mut total = 0.0f32;
    for (sum, &g) in gsum.iter_mut().zip(run.g) {
        total += g;
        *sum = total;
    }
    let kt = &mut s.kt[..dk * c];
    transpose(run.k, c, dk, kt);
    // T: the unit lower-triangular inverse, row by row (forward substitution).
    let square = &mut s.square[..c * c];
    square.fill(0.0);
    mul_add(run.k, kt, square, c, dk, c, None);
    let t = &mut s.solve[..c * c];
    t.fill(0.0);
    for i in 0..c {
        // l[m] = β_i (k_i·k_m) exp(G_i - G_m) for m < i; T[i][j] = -Σ_{m=j}^{i-1} l[m] T[m][j].
        let (done, row) = t.split_at_mut(i * c);
        let row = &mut row[..c];
        for m in 0..i {
            let l = run.beta[i] * square[i * c + m] * exp(gsum[i] - gsum[m]);
            for (r, &tm) in row[..=m].iter_mut().zip(&done[m * c..m * c + m + 1]) {
                *r -= l * tm;
            }
        }
        row[i] = 1.0;
    }
    // U = T diag(β) V; W = T diag(β exp(G)) K.
    let scaled_v = &mut s.scaled[..c * dv];
    for ((row, v), &b) in scaled_v.chunks_exact_mut(dv).zip(run.v.chunks_exact(dv)).zip(run.beta) {
        row.iter_mut().zip(v).for_each(|(r, &x)| *r = x * b);
    }
    let u = &mut s.u[..c * dv];
    u.fill(0.0);
    mul_add(t, scaled_v, u, c, c, dv, Some(c));
    let scaled_k = &mut s.scaled[..c * dk];
    for (((row, k), &b), &gs) in scaled_k.chunks_exact_mut(dk).zip(run.k.chunks_exact(dk)).zip(run.beta).zip(gsum.iter()) {
        let f = b * exp(gs);
        row.iter_mut().zip(k).for_each(|(r, &x)| *r = x * f);
    }
    let w = &mut s.w[..c * dk];
    w.fill(0.0);
    mul_add(t, scaled_k, w, c, c, dk, Some(c));
    // The corrections U - W S, in place of U.
    let ws = &mut s.scaled[..c * dv];
    ws.fill(0.0);
    mul_add(w, state, ws, c, dk, dv, None);
    u.iter_mut().zip(ws.iter()).for_each(|(u, &x)| *u -= x);
    // Outputs: the state's part, then the chunk's own (Q Kᵀ ∘ D, lower with the diagonal).
    let scaled_q = &mut s.scaled[..c * dk];
    for ((row, q), &gs) in scaled_q.chunks_exact_mut(dk).zip(run.q.chunks_exact(dk)).zip(gsum.iter()) {
        let f = exp(gs);
        row.iter_mut().zip(q).for_each(|(r, &x)| *r = x * f);
    }
    out.fill(0.0);
    mul_add(scaled_q, state, out, c, dk, dv, None);
    square.fill(0.0);
    mul_add(run.q, kt, square, c, dk, c, None);
    for i in 0..c {
        for j in 0..c {
            square[i * c + j] = if j <= i { square[i * c + j] * exp(gsum[i] - gsum[j]) } else { 0.0 };
        }
    }
    mul_add(square, u, out, c, c, dv, Some(c));
    // The state: decayed over the chunk, plus each token's correction decayed from it to the end.
    let last = gsum[c - 1];
    let chunk_decay = exp(last);
    state.iter_mut().for_each(|x| *x *= chunk_decay);
    let to_end = &mut s.scaled[..c];
    to_end.iter_mut().zip(gsum.iter()).for_each(|(f, &g)| *f = exp(last - g));
    for row in kt.chunks_exact_mut(c) {
        row.iter_mut().zip(to_end.iter()).for_each(|(x, &f)| *x *= f);
    }
    mul_add(kt, u, state, dk, c, dv, None);
}

/// `out[m][n] += a[m][k] b[k][n]`, each sum in order of `k`; with `lower = Some(_)`, `a` is lower
/// triangular (row `i` reads `k ≤ i` only).
#[inline(always)]
pub(crate) fn mul_add(a: &[f32], b: &[f32], out: &mut [f32], m: usize, k: usize, n: usize, lower: Option<usize>) {
    for i in 0..m {
        let inner = if lower.is_some() { i + 1 } else { k };
        let a_row = &a[i * k..i * k + inner];
        let o = &mut out[i * n..(i + 1) * n];
        for_column_blocks(n, |start, width| {
            let mut sums = [0.0f32; COLUMNS];
            sums[..width].copy_from_slice(&o[start..start + width]);
            for (p, &x) in a_row.iter().enumerate() {
                for (s, &y) in sums.iter_mut().zip(&b[p * n + start..p * n + start + width]) {
                    *s += x * y;
                }
            }
            o[start..start + width].copy_from_slice(&sums[..width]);
        });
    }
}

#[inline(always)]
pub(crate) fn transpose(a: &[f32], rows: usize, cols: usize, out: &mut [f32]) {
    for i in 0..rows {
        for j in 0..cols {
            out[j * rows + i] = a[i * cols + j];
        }
    }
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

    fn normalized(mut rows: Vec<f32>, dim: usize, scale: f32) -> Vec<f32> {
        for row in rows.chunks_exact_mut(dim) {
            let norm = row.iter().map(|x| x * x).sum::<f32>().sqrt();
            row.iter_mut().for_each(|x| *x *= scale / norm);
        }
        rows
    }

    /// The rule written out as it is defined, in f64: state decay, read, correction, output.
    fn reference(run: &DeltaRun, state: &mut [f64]) -> Vec<f64> {
        let (dk, dv) = (run.key_dim, run.value_dim);
        let mut out = vec![0.0; run.tokens() * dv];
        for t in 0..run.tokens() {
            state.iter_mut().for_each(|s| *s *= (run.g[t] as f64).exp());
            for j in 0..dv {
                let recalled: f64 = (0..dk).map(|i| state[i * dv + j] * run.k[t * dk + i] as f64).sum();
                let delta = (run.v[t * dv + j] as f64 - recalled) * run.beta[t] as f64;
                (0..dk).for_each(|i| state[i * dv + j] += run.k[t * dk + i] as f64 * delta);
                out[t * dv + j] = (0..dk).map(|i| state[i * dv + j] * run.q[t * dk + i] as f64).sum();
            }
        }
        out
    }

    fn chunked_from_0(run: &DeltaRun, state: &mut [f32], out: &mut [f32]) {
        chunked(run, 0, state, out);
    }

    #[test]
    fn chunked_and_recurrent_follow_the_rule_over_odd_sizes_and_chunk_edges() {
        for (tokens, dk, dv) in [(1, 3, 5), (7, 5, 3), (CHUNK, 8, 8), (CHUNK + 1, 4, 7), (2 * CHUNK + 13, 9, 6)] {
            let q = normalized(values(tokens * dk, 1), dk, 1.0 / (dk as f32).sqrt());
            let k = normalized(values(tokens * dk, 2), dk, 1.0);
            let v = values(tokens * dv, 3);
            let g: Vec<f32> = values(tokens, 4).iter().map(|x| -0.5 * (x + 1.0)).collect();
            let beta: Vec<f32> = values(tokens, 5).iter().map(|x| 0.5 * (x + 1.0)).collect();
            let run = DeltaRun { q: &q, k: &k, v: &v, g: &g, beta: &beta, key_dim: dk, value_dim: dv };
            let start = values(dk * dv, 6);
            let mut exact: Vec<f64> = start.iter().map(|&x| x as f64).collect();
            let want = reference(&run, &mut exact);
            let chunked_from_5 = |run: &DeltaRun, state: &mut [f32], out: &mut [f32]| chunked(run, 5, state, out);
            for (name, f) in [("recurrent", recurrent as fn(&DeltaRun, &mut [f32], &mut [f32])), ("chunked", chunked_from_0), ("chunked at 5", chunked_from_5)]
            {
                let (mut state, mut out) = (start.clone(), vec![0.0; tokens * dv]);
                f(&run, &mut state, &mut out);
                let worst = |a: &[f32], b: &[f64]| a.iter().zip(b).map(|(&x, &y)| (x as f64 - y).abs()).fold(0.0, f64::max);
                assert!(worst(&out, &want) < 2e-4, "{name} {tokens}x{dk}x{dv}: outputs off by {}", worst(&out, &want));
                assert!(worst(&state, &exact) < 2e-4, "{name} {tokens}x{dk}x{dv}: state off by {}", worst(&state, &exact));
            }
        }
    }

    #[test]
    fn a_run_split_at_a_chunk_edge_gives_the_bits_of_one_run_and_anywhere_else_close() {
        let (tokens, dk, dv) = (2 * CHUNK + 30, 6, 5);
        let q = normalized(values(tokens * dk, 7), dk, 0.4);
        let k = normalized(values(tokens * dk, 8), dk, 1.0);
        let v = values(tokens * dv, 9);
        let g: Vec<f32> = values(tokens, 10).iter().map(|x| -0.1 * (x + 1.0)).collect();
        let beta = vec![0.7; tokens];
        let run = DeltaRun { q: &q, k: &k, v: &v, g: &g, beta: &beta, key_dim: dk, value_dim: dv };
        let (mut whole_state, mut whole) = (vec![0.0; dk * dv], vec![0.0; tokens * dv]);
        chunked(&run, 0, &mut whole_state, &mut whole);
        // Runs of 41, 1 (recurrent), 22 and the rest: the last starts at a chunk edge.
        let (mut state, mut out) = (vec![0.0; dk * dv], vec![0.0; tokens * dv]);
        for (start, end) in [(0, 41), (41, 42), (42, CHUNK), (CHUNK, tokens)] {
            let part = &mut out[start * dv..end * dv];
            match end - start {
                1 => recurrent(&run.slice(start, end), &mut state, part),
                _ => chunked(&run.slice(start, end), start, &mut state, part),
            }
        }
        let worst = out.iter().zip(&whole).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert!(worst < 1e-5, "split run off by {worst}");
        // Split only at the chunk edge: the same bits.
        let (mut state, mut out) = (vec![0.0; dk * dv], vec![0.0; tokens * dv]);
        chunked(&run.slice(0, CHUNK), 0, &mut state, &mut out[..CHUNK * dv]);
        chunked(&run.slice(CHUNK, tokens), CHUNK, &mut state, &mut out[CHUNK * dv..]);
        assert_eq!((out, state), (whole, whole_state));
    }
}
