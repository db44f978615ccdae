//! Reference paged attention: one query row at a time, scores, softmax, weighted sum of values.

use crate::paged::AttentionTask;

/// Writes token `t`, group head `g` of `task` at `out[t * out_stride + g * head_dim..]`:
/// `softmax(scale * q · K[0..span]) · V[0..span]`, each score a sequential sum over the head's
/// dimensions and the values summed in key order.
///
/// # Safety
/// `out` must be valid for those writes, and no other thread may touch those elements.
pub unsafe fn attention(task: &AttentionTask, out: *mut f32, out_stride: usize) {
    task.validate();
    let kv = task.kv;
    let (hd, ps) = (kv.head_dim, kv.page_size);
    let mut scores = Vec::new();
    for t in 0..task.tokens {
        for g in 0..task.group {
            let q = &task.q[t * task.q_stride + g * hd..][..hd];
            scores.clear();
            scores.extend((0..task.span(t)).map(|j| {
                let base = kv.offset(task.pages[j / ps], task.kv_head);
                let mut s = 0f32;
                for (d, qd) in q.iter().enumerate() {
                    s += qd * kv.keys.get(base + d * ps + j % ps);
                }
                s * task.scale
            }));
            super::softmax(&mut scores);
            let o = std::slice::from_raw_parts_mut(out.add(t * out_stride + g * hd), hd);
            o.fill(0.0);
            for (j, p) in scores.iter().enumerate() {
                let base = kv.offset(task.pages[j / ps], task.kv_head) + (j % ps) * hd;
                for (d, od) in o.iter_mut().enumerate() {
                    *od += p * kv.values.get(base + d);
                }
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use crate::packed::f32_to_bf16;
    use crate::paged::{AttentionTask, KvSlice, PagedKv};
    use crate::portable::twin_tests::data;
    use crate::Kernels;

    /// A pool of `pages` pages holding `keys` positions of one sequence under a scrambled page
    /// table, plus the same keys and values unpaged (`[kv_head][pos][dim]`).
    struct Fixture {
        page_size: usize,
        kv_heads: usize,
        head_dim: usize,
        keys: Vec<f32>,
        values: Vec<f32>,
        /// The same pages in bfloat16.
        keys_bf16: Vec<u16>,
        values_bf16: Vec<u16>,
        table: Vec<u32>,
        dense_k: Vec<f32>,
        dense_v: Vec<f32>,
    }

    impl Fixture {
        fn new(page_size: usize, kv_heads: usize, head_dim: usize, positions: usize) -> Fixture {
            let used = positions.div_ceil(page_size);
            let pages = used + 3;
            let table: Vec<u32> = (0..used).map(|i| ((i * 5 + 2) % pages) as u32).collect();
            let block = page_size * head_dim;
            // Unused slots hold large finite junk: a kernel must never weigh them in.
            let (mut keys, mut values) = (vec![1e3; pages * kv_heads * block], vec![-1e3; pages * kv_heads * block]);
            let (dense_k, dense_v) = (data(kv_heads * positions * head_dim, 7.0), data(kv_heads * positions * head_dim, 8.0));
            for h in 0..kv_heads {
                for pos in 0..positions {
                    let base = (table[pos / page_size] as usize * kv_heads + h) * block;
                    for d in 0..head_dim {
                        let dense = (h * positions + pos) * head_dim + d;
                        keys[base + d * page_size + pos % page_size] = dense_k[dense];
                        values[base + (pos % page_size) * head_dim + d] = dense_v[dense];
                    }
                }
            }
            let (keys_bf16, values_bf16) = (keys.iter().map(|&x| f32_to_bf16(x)).collect(), values.iter().map(|&x| f32_to_bf16(x)).collect());
            Fixture { page_size, kv_heads, head_dim, keys, values, keys_bf16, values_bf16, table, dense_k, dense_v }
        }

        fn kv(&self, bf16: bool) -> PagedKv<'_> {
            let (keys, values) =
                if bf16 { (KvSlice::Bf16(&self.keys_bf16), KvSlice::Bf16(&self.values_bf16)) } else { (KvSlice::F32(&self.keys), KvSlice::F32(&self.values)) };
            PagedKv { keys, values, page_size: self.page_size, kv_heads: self.kv_heads, head_dim: self.head_dim }
        }
    }

    /// Runs one task per kv head; q and out are `[tokens][kv_heads * group * head_dim]`.
    fn run(kern: &Kernels, f: &Fixture, bf16: bool, group: usize, q: &[f32], tokens: usize, first_pos: usize) -> Vec<f32> {
        let kv = f.kv(bf16);
        let stride = f.kv_heads * group * f.head_dim;
        let mut out = vec![f32::NAN; tokens * stride];
        for h in 0..f.kv_heads {
            let task = AttentionTask {
                kv: &kv,
                pages: &f.table,
                kv_head: h,
                group,
                q: &q[h * group * f.head_dim..],
                q_stride: stride,
                tokens,
                first_pos,
                scale: 1.0 / (f.head_dim as f32).sqrt(),
            };
            // SAFETY: `out` holds every row the task writes, and nothing else runs.
            unsafe { (kern.attention)(&task, out.as_mut_ptr().add(h * group * f.head_dim), stride) };
        }
        out
    }

    #[test]
    fn portable_attention_matches_dense_causal_attention() {
        let (kv_heads, group, hd, tokens) = (2, 3, 8, 11);
        let f = Fixture::new(4, kv_heads, hd, tokens);
        let stride = kv_heads * group * hd;
        let q = data(tokens * stride, 9.0);
        let got = run(&Kernels::portable(), &f, false, group, &q, tokens, 0);
        for t in 0..tokens {
            for head in 0..kv_heads * group {
                let h = head / group;
                let qv = &q[t * stride + head * hd..][..hd];
                let scores: Vec<f64> =
                    (0..=t).map(|j| (0..hd).map(|d| qv[d] as f64 * f.dense_k[(h * tokens + j) * hd + d] as f64).sum::<f64>() / (hd as f64).sqrt()).collect();
                let max = scores.iter().copied().fold(f64::MIN, f64::max);
                let total: f64 = scores.iter().map(|s| (s - max).exp()).sum();
                for d in 0..hd {
                    let want: f64 = (0..=t).map(|j| (scores[j] - max).exp() / total * f.dense_v[(h * tokens + j) * hd + d] as f64).sum();
                    let g = got[t * stride + head * hd + d] as f64;
                    assert!((want - g).abs() < 1e-5, "t={t} head={head} d={d}: {want} vs {g}");
                }
            }
        }
    }

    /// A SIMD attention against the portable one on odd shapes, with float32 and with bfloat16
    /// pages, and each query of an extend task against the same query alone (decode):
    /// bit-identical.
    pub(crate) fn check_attention(simd: &Kernels) {
        let reference = Kernels::portable();
        for (page_size, hd, group) in [(16, 64, 3), (1, 16, 1), (5, 80, 2), (32, 128, 4), (16, 6, 3)] {
            let (kv_heads, first_pos, tokens) = (2, 13, 9);
            let f = Fixture::new(page_size, kv_heads, hd, first_pos + tokens);
            let stride = kv_heads * group * hd;
            let q = data(tokens * stride, 10.0);
            for bf16 in [false, true] {
                let want = run(&reference, &f, bf16, group, &q, tokens, first_pos);
                let got = run(simd, &f, bf16, group, &q, tokens, first_pos);
                for (i, (a, b)) in want.iter().zip(&got).enumerate() {
                    assert!((a - b).abs() <= 1e-5, "{} attention (bf16 {bf16}) page {page_size} hd {hd} group {group} at {i}: {a} vs {b}", simd.isa);
                }
                for t in 0..tokens {
                    let alone = run(simd, &f, bf16, group, &q[t * stride..(t + 1) * stride], 1, first_pos + t);
                    assert_eq!(alone, got[t * stride..(t + 1) * stride], "{}: query {t} differs alone vs in its chunk (bf16 {bf16})", simd.isa);
                }
            }
        }
    }
}
