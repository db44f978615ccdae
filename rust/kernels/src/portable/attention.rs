//! Reference paged attention: one query row at a time, scores, softmax, weighted sum of values.

use crate::paged::AttentionTask;

/// Writes token `t`, group head `g` of `task` at `out[t * out_stride + g * head_dim..]`:
/// `softmax(scale * q · K[0..span]) · V[0..span]`, each score a sequential fused sum over the
/// head's dimensions and the values summed, fused, in key order.
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
                let page = task.pages[j / ps];
                let base = kv.offset(page, task.kv_head);
                let mut s = 0f32;
                for (d, qd) in q.iter().enumerate() {
                    s = qd.mul_add(kv.keys.get(base + d * ps + j % ps), s);
                }
                s * (kv.keys.scale(kv.scale_offset(page, task.kv_head) + j % ps) * task.scale)
            }));
            super::softmax(&mut scores);
            let o = std::slice::from_raw_parts_mut(out.add(t * out_stride + g * hd), hd);
            o.fill(0.0);
            for (j, p) in scores.iter().enumerate() {
                let page = task.pages[j / ps];
                let base = kv.offset(page, task.kv_head) + (j % ps) * hd;
                let p = p * kv.values.scale(kv.scale_offset(page, task.kv_head) + j % ps);
                for (d, od) in o.iter_mut().enumerate() {
                    *od = p.mul_add(kv.values.get(base + d), *od);
                }
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use crate::packed::f32_to_bf16;
    use crate::paged::{page_head_scale_start, quantize_kv_row, AttentionTask, KvSlice, PagedKv};
    use crate::portable::twin_tests::data;
    use crate::Kernels;

    /// The element types a fixture's pages come in.
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Stored {
        F32,
        Bf16,
        Int8,
    }
    const STORED: [Stored; 3] = [Stored::F32, Stored::Bf16, Stored::Int8];

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
        /// The same rows quantized to int8 per token and kv head, with their scales.
        keys_i8: Vec<i8>,
        values_i8: Vec<i8>,
        key_scales: Vec<f32>,
        value_scales: Vec<f32>,
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
            // Junk in unused slots and their scales here too.
            let (mut keys_i8, mut values_i8) = (vec![100i8; keys.len()], vec![-100i8; values.len()]);
            let (mut key_scales, mut value_scales) = (vec![1e3f32; pages * kv_heads * page_size], vec![1e3f32; pages * kv_heads * page_size]);
            for h in 0..kv_heads {
                for pos in 0..positions {
                    let (page, slot) = (table[pos / page_size], pos % page_size);
                    let (base, scale_at) = ((page as usize * kv_heads + h) * block, page_head_scale_start(page, h, kv_heads, page_size) + slot);
                    let row = (h * positions + pos) * head_dim..(h * positions + pos + 1) * head_dim;
                    key_scales[scale_at] = quantize_kv_row(&dense_k[row.clone()], |d, x| keys_i8[base + d * page_size + slot] = x);
                    value_scales[scale_at] = quantize_kv_row(&dense_v[row], |d, x| values_i8[base + slot * head_dim + d] = x);
                }
            }
            Fixture {
                page_size,
                kv_heads,
                head_dim,
                keys,
                values,
                keys_bf16,
                values_bf16,
                keys_i8,
                values_i8,
                key_scales,
                value_scales,
                table,
                dense_k,
                dense_v,
            }
        }

        fn kv(&self, stored: Stored) -> PagedKv<'_> {
            let (keys, values) = match stored {
                Stored::F32 => (KvSlice::F32(&self.keys), KvSlice::F32(&self.values)),
                Stored::Bf16 => (KvSlice::Bf16(&self.keys_bf16), KvSlice::Bf16(&self.values_bf16)),
                Stored::Int8 => {
                    (KvSlice::Int8 { data: &self.keys_i8, scales: &self.key_scales }, KvSlice::Int8 { data: &self.values_i8, scales: &self.value_scales })
                }
            };
            PagedKv { keys, values, page_size: self.page_size, kv_heads: self.kv_heads, head_dim: self.head_dim }
        }
    }

    /// Runs one task per kv head; q and out are `[tokens][kv_heads * group * head_dim]`.
    fn run(kern: &Kernels, f: &Fixture, stored: Stored, group: usize, q: &[f32], tokens: usize, first_pos: usize) -> Vec<f32> {
        let kv = f.kv(stored);
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

    /// Float32 pages give dense attention to rounding; int8 pages to within their quantization
    /// (a half step of 1/127 of each row's largest element, through softmax and the sum).
    #[test]
    fn portable_attention_matches_dense_causal_attention() {
        for (stored, tolerance) in [(Stored::F32, 1e-5), (Stored::Int8, 2e-2)] {
            dense_check(stored, tolerance);
        }
    }

    fn dense_check(stored: Stored, tolerance: f64) {
        let (kv_heads, group, hd, tokens) = (2, 3, 8, 11);
        let f = Fixture::new(4, kv_heads, hd, tokens);
        let stride = kv_heads * group * hd;
        let q = data(tokens * stride, 9.0);
        let got = run(&Kernels::portable(), &f, stored, group, &q, tokens, 0);
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
                    assert!((want - g).abs() < tolerance, "{stored:?} t={t} head={head} d={d}: {want} vs {g}");
                }
            }
        }
    }

    /// A SIMD attention against the portable one on odd shapes, with float32, bfloat16 and int8
    /// pages, and each query of an extend task against the same query alone (decode): all
    /// bit-identical.
    pub(crate) fn check_attention(simd: &Kernels) {
        let reference = Kernels::portable();
        for (page_size, hd, group) in [(16, 64, 3), (1, 16, 1), (5, 80, 2), (32, 128, 4), (16, 6, 3)] {
            let (kv_heads, first_pos, tokens) = (2, 13, 9);
            let f = Fixture::new(page_size, kv_heads, hd, first_pos + tokens);
            let stride = kv_heads * group * hd;
            let q = data(tokens * stride, 10.0);
            for stored in STORED {
                let want = run(&reference, &f, stored, group, &q, tokens, first_pos);
                let got = run(simd, &f, stored, group, &q, tokens, first_pos);
                for (i, (a, b)) in want.iter().zip(&got).enumerate() {
                    assert!(a.to_bits() == b.to_bits(), "{} attention ({stored:?}) page {page_size} hd {hd} group {group} at {i}: {a} vs {b}", simd.isa);
                }
                for t in 0..tokens {
                    let alone = run(simd, &f, stored, group, &q[t * stride..(t + 1) * stride], 1, first_pos + t);
                    assert_eq!(alone, got[t * stride..(t + 1) * stride], "{}: query {t} differs alone vs in its chunk ({stored:?})", simd.isa);
                }
            }
        }
    }
}
