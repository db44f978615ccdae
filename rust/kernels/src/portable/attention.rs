//! Reference paged attention: one query row at a time, key block by key block, each block's
//! scores, softmax partial and weighted sum of values, merged in key order.

use crate::paged::{AttentionTask, Partial};
use std::ops::Range;

/// Writes token `t`, group head `g` of `task` at `out[t * out_stride + g * value_dim..]`:
/// `softmax(softcap(scale * q · K[keys])) · V[keys]` over its keys `first_key(t)..span(t)` (the
/// head's sink logit, if any, joining the softmax's denominator). Per key block
/// ([`crate::paged`]): each score a sequential fused sum over the head's dimensions (soft capped
/// with [`super::softcap`] when the task says so), the softmax over the block's keys the row sees
/// (its max and [`super::exp_shifted_sum`]'s sum kept in the row's [`Partial`]), and the values
/// times those probabilities summed, fused, in key order (a latent page's values read from its
/// keys); then the blocks' partials merged in order ([`Partial::merge`], [`Partial::finish`]).
///
/// # Safety
/// `out` must be valid for those writes, and no other thread may touch those elements.
pub unsafe fn attention(task: &AttentionTask, out: *mut f32, out_stride: usize) {
    task.validate();
    let vd = task.kv.value_dim;
    let (mut state, mut part) = (vec![0f32; Partial::len(vd)], vec![0f32; Partial::len(vd)]);
    for t in 0..task.tokens {
        for g in 0..task.group {
            Partial::clear(&mut state);
            for b in task.key_blocks() {
                row_partial(task, &task.block_pages(b), t, g, &mut part);
                Partial::merge(&mut state, &part);
            }
            let o = std::slice::from_raw_parts_mut(out.add(t * out_stride + g * vd), vd);
            Partial::finish(&state, task.sink(g), o);
        }
    }
}

/// Writes the partials of key blocks `blocks` (a part of [`AttentionTask::key_blocks`]) of every
/// query row of `task`: block `b`'s at `partials[(b - blocks.start) * block_partials_len()..]`,
/// row `r` (token `r / group`, head `r % group`) at `r * Partial::len(value_dim)` within it.
/// [`crate::paged::merge_partials`] over all blocks' partials gives [`attention`]'s bits.
pub fn attention_partials(task: &AttentionTask, blocks: Range<usize>, partials: &mut [f32]) {
    task.validate();
    let (len, block_len) = (Partial::len(task.kv.value_dim), task.block_partials_len());
    assert!(partials.len() >= blocks.len() * block_len, "attention_partials: too few partials");
    for (i, b) in blocks.enumerate() {
        let pages = task.block_pages(b);
        for r in 0..task.tokens * task.group {
            row_partial(task, &pages, r / task.group, r % task.group, &mut partials[i * block_len + r * len..][..len]);
        }
    }
}

/// [`crate::paged::merge_partials`], compiled for the portable path.
///
/// # Safety
/// As [`attention`].
pub unsafe fn merge_partials(task: &AttentionTask, partials: &[f32], out: *mut f32, out_stride: usize) {
    crate::paged::merge_partials(task, partials, out, out_stride)
}

/// Token `t`, group head `g`'s partial over the keys it sees on `pages` (indexes in the page
/// table).
fn row_partial(task: &AttentionTask, pages: &Range<usize>, t: usize, g: usize, part: &mut [f32]) {
    let kv = task.kv;
    let (hd, ps) = (kv.head_dim, kv.page_size);
    let keys = task.keys_within(pages, t, t);
    Partial::clear(part);
    if keys.is_empty() {
        return;
    }
    let q = &task.q[t * task.q_stride + g * hd..][..hd];
    let mut scores: Vec<f32> = keys
        .clone()
        .map(|j| {
            let page = task.pages[j / ps];
            let base = kv.key_offset(page, task.kv_head);
            let mut s = 0f32;
            for (d, qd) in q.iter().enumerate() {
                s = qd.mul_add(kv.keys.get(base + d * ps + j % ps), s);
            }
            s * (kv.keys.scale(kv.scale_offset(page, task.kv_head) + j % ps) * task.scale)
        })
        .collect();
    if let Some(cap) = task.softcap {
        super::softcap(&mut scores, cap);
    }
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum = super::exp_shifted_sum(&mut scores, max);
    (part[0], part[1]) = (max, sum);
    let inv = 1.0 / sum;
    scores.iter_mut().for_each(|p| *p *= inv);
    let values = kv.value_storage();
    let o = &mut part[2..];
    o.fill(0.0);
    for (j, p) in keys.zip(&scores) {
        let page = task.pages[j / ps];
        let (start, step) = kv.value_row(page, task.kv_head, j % ps);
        let p = p * values.scale(kv.scale_offset(page, task.kv_head) + j % ps);
        for (d, od) in o.iter_mut().enumerate() {
            *od = p.mul_add(values.get(start + d * step), *od);
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

    /// Where a fixture's values come from.
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Values {
        /// Value pages of their own, rows this wide.
        Own(usize),
        /// Latent pages: each value is the first this many elements of its key. The fixture's
        /// value pages then hold copies of them (int8 ones with the key's scale), to compare.
        Latent(usize),
    }

    impl Values {
        fn dim(self) -> usize {
            match self {
                Values::Own(dim) | Values::Latent(dim) => dim,
            }
        }
    }

    /// A pool of `pages` pages holding `keys` positions of one sequence under a scrambled page
    /// table, plus the same keys and values unpaged (`[kv_head][pos][dim]`).
    struct Fixture {
        page_size: usize,
        kv_heads: usize,
        head_dim: usize,
        values_from: Values,
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
        fn new(page_size: usize, kv_heads: usize, head_dim: usize, values_from: Values, positions: usize) -> Fixture {
            let used = positions.div_ceil(page_size);
            let pages = used + 3;
            let table: Vec<u32> = (0..used).map(|i| ((i * 5 + 2) % pages) as u32).collect();
            let vd = values_from.dim();
            let (key_block, value_block) = (page_size * head_dim, page_size * vd);
            // Unused slots hold large finite junk: a kernel must never weigh them in.
            let (mut keys, mut values) = (vec![1e3; pages * kv_heads * key_block], vec![-1e3; pages * kv_heads * value_block]);
            let dense_k = data(kv_heads * positions * head_dim, 7.0);
            let dense_v = match values_from {
                Values::Own(_) => data(kv_heads * positions * vd, 8.0),
                Values::Latent(_) => dense_k.chunks(head_dim).flat_map(|key| &key[..vd]).copied().collect(),
            };
            // Where token `pos`'s key and value rows of kv head `h` start, and its scale.
            let at = |h: usize, pos: usize| {
                let (page, slot) = (table[pos / page_size], pos % page_size);
                let page_head = page as usize * kv_heads + h;
                (page_head * key_block + slot, page_head * value_block + slot * vd, page_head_scale_start(page, h, kv_heads, page_size) + slot)
            };
            for h in 0..kv_heads {
                for pos in 0..positions {
                    let (key, value, _) = at(h, pos);
                    for d in 0..head_dim {
                        keys[key + d * page_size] = dense_k[(h * positions + pos) * head_dim + d];
                    }
                    values[value..value + vd].copy_from_slice(&dense_v[(h * positions + pos) * vd..][..vd]);
                }
            }
            let (keys_bf16, values_bf16) = (keys.iter().map(|&x| f32_to_bf16(x)).collect(), values.iter().map(|&x| f32_to_bf16(x)).collect());
            // Junk in unused slots and their scales here too.
            let (mut keys_i8, mut values_i8) = (vec![100i8; keys.len()], vec![-100i8; values.len()]);
            let (mut key_scales, mut value_scales) = (vec![1e3f32; pages * kv_heads * page_size], vec![1e3f32; pages * kv_heads * page_size]);
            for h in 0..kv_heads {
                for pos in 0..positions {
                    let (key, value, scale_at) = at(h, pos);
                    key_scales[scale_at] = quantize_kv_row(&dense_k[(h * positions + pos) * head_dim..][..head_dim], |d, x| keys_i8[key + d * page_size] = x);
                    value_scales[scale_at] = match values_from {
                        Values::Own(_) => quantize_kv_row(&dense_v[(h * positions + pos) * vd..][..vd], |d, x| values_i8[value + d] = x),
                        Values::Latent(_) => {
                            (0..vd).for_each(|d| values_i8[value + d] = keys_i8[key + d * page_size]);
                            key_scales[scale_at]
                        }
                    };
                }
            }
            Fixture {
                page_size,
                kv_heads,
                head_dim,
                values_from,
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

        /// Sets the K and V of every position before `pos` to NaN, in every element type (the
        /// int8 rows' scales).
        fn poison_before(&mut self, pos: usize) {
            let (ps, hd, vd, kv_heads) = (self.page_size, self.head_dim, self.values_from.dim(), self.kv_heads);
            for h in 0..kv_heads {
                for p in 0..pos {
                    let (page, slot) = (self.table[p / ps], p % ps);
                    let page_head = page as usize * kv_heads + h;
                    for key in (0..hd).map(|d| page_head * ps * hd + d * ps + slot) {
                        (self.keys[key], self.keys_bf16[key]) = (f32::NAN, f32_to_bf16(f32::NAN));
                    }
                    for value in (0..vd).map(|d| page_head * ps * vd + slot * vd + d) {
                        (self.values[value], self.values_bf16[value]) = (f32::NAN, f32_to_bf16(f32::NAN));
                    }
                    let scale_at = page_head_scale_start(page, h, kv_heads, ps) + slot;
                    self.key_scales[scale_at] = f32::NAN;
                    self.value_scales[scale_at] = f32::NAN;
                }
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
            let values = matches!(self.values_from, Values::Own(_)).then_some(values);
            PagedKv { keys, values, page_size: self.page_size, kv_heads: self.kv_heads, head_dim: self.head_dim, value_dim: self.values_from.dim() }
        }
    }

    /// The queries of a test task: `tokens` from `first_pos`, with a sliding window, a soft
    /// cap, attention sinks ([`sinks`]) and a block of positions `start..end` whose queries see
    /// all of it (`key_ends`).
    #[derive(Clone, Copy, Debug)]
    struct Queries {
        tokens: usize,
        first_pos: usize,
        window: Option<usize>,
        softcap: Option<f32>,
        sinks: bool,
        block: Option<(usize, usize)>,
    }

    /// The sink logits of a test's `heads` q heads: around the scores' size, so they matter.
    fn sinks(heads: usize) -> Vec<f32> {
        data(heads, 2.0)
    }

    impl Queries {
        /// Token `t` of these queries alone, as a decode step runs it.
        fn alone(self, t: usize) -> Queries {
            Queries { tokens: 1, first_pos: self.first_pos + t, ..self }
        }

        /// Where the keys query token `t` sees end: its block's end, or after its own position.
        fn key_end(self, t: usize) -> usize {
            let pos = self.first_pos + t;
            self.block.filter(|&(start, end)| (start..end).contains(&pos)).map_or(pos + 1, |(_, end)| end)
        }

        /// The task's `key_ends`, with a block.
        fn key_ends(self) -> Option<Vec<usize>> {
            self.block.map(|_| (0..self.tokens).map(|t| self.key_end(t)).collect())
        }

        /// The positions whose keys the queries may see.
        fn positions(self) -> usize {
            self.key_end(self.tokens - 1)
        }
    }

    /// Blocks of positions attended both ways that the tests cover for queries `tokens` from
    /// `first_pos`: none, one within the queries, and one they end inside of.
    fn blocks(first_pos: usize, tokens: usize) -> [Option<(usize, usize)>; 3] {
        [None, Some((first_pos + 1, first_pos + tokens.min(5))), Some((first_pos + tokens / 2, first_pos + tokens + 3))]
    }

    /// Windows, soft caps and sinks the tests cover: windows of 1 key, smaller than a page, not a
    /// multiple of the page size, and larger than the context.
    const VARIANTS: [(Option<usize>, Option<f32>, bool); 10] = [
        (None, None, false),
        (Some(1), None, false),
        (Some(3), Some(0.8), false),
        (Some(7), None, false),
        (Some(20), Some(2.0), false),
        (Some(1000), None, false),
        (None, Some(0.5), false),
        (None, None, true),
        (Some(1), None, true),
        (Some(7), Some(0.8), true),
    ];

    /// Runs one task per kv head; q is `[tokens][kv_heads * group * head_dim]`, out
    /// `[tokens][kv_heads * group * value_dim]`.
    fn run(kern: &Kernels, f: &Fixture, stored: Stored, group: usize, q: &[f32], at: Queries) -> Vec<f32> {
        run_with_table(kern, f, &f.table, stored, group, q, at)
    }

    /// Kv head `h`'s task over `f`'s pages (`kv`) under `table`, q `[tokens][kv_heads * group * head_dim]`.
    #[allow(clippy::too_many_arguments)]
    fn fixture_task<'a>(
        f: &Fixture,
        kv: &'a PagedKv<'a>,
        table: &'a [u32],
        group: usize,
        q: &'a [f32],
        at: Queries,
        sinks: &'a [f32],
        key_ends: Option<&'a [usize]>,
        h: usize,
    ) -> AttentionTask<'a> {
        AttentionTask {
            kv,
            pages: table,
            kv_head: h,
            group,
            q: &q[h * group * f.head_dim..],
            q_stride: f.kv_heads * group * f.head_dim,
            tokens: at.tokens,
            first_pos: at.first_pos,
            scale: 1.0 / (f.head_dim as f32).sqrt(),
            window: at.window,
            softcap: at.softcap,
            sinks: at.sinks.then(|| &sinks[h * group..(h + 1) * group]),
            key_ends,
        }
    }

    /// [`run`] with the page table `table`.
    fn run_with_table(kern: &Kernels, f: &Fixture, table: &[u32], stored: Stored, group: usize, q: &[f32], at: Queries) -> Vec<f32> {
        let kv = f.kv(stored);
        let out_stride = f.kv_heads * group * kv.value_dim;
        let mut out = vec![f32::NAN; at.tokens * out_stride];
        let (sinks, key_ends) = (sinks(f.kv_heads * group), at.key_ends());
        for h in 0..f.kv_heads {
            let task = fixture_task(f, &kv, table, group, q, at, &sinks, key_ends.as_deref(), h);
            // SAFETY: `out` holds every row the task writes, and nothing else runs.
            unsafe { (kern.attention)(&task, out.as_mut_ptr().add(h * group * kv.value_dim), out_stride) };
        }
        out
    }

    /// Float32 pages give dense attention to rounding; int8 pages to within their quantization
    /// (a half step of 1/127 of each row's largest element, through softmax and the sum). Each
    /// query sees the last `window` keys up to its own (and in a block, the rest of the
    /// block), its scores soft capped; values are as wide as keys or narrower, in pages of their
    /// own or latent. Long contexts span several key blocks, so their partials' merge is checked
    /// too.
    #[test]
    fn portable_attention_matches_dense_causal_attention() {
        for values_from in [Values::Own(8), Values::Own(5), Values::Latent(5), Values::Latent(8)] {
            for (stored, tolerance) in [(Stored::F32, 1e-5), (Stored::Int8, 2e-2)] {
                for (window, softcap, with_sinks) in VARIANTS {
                    for (block, long_block) in blocks(0, 11).into_iter().zip(blocks(700, 3)) {
                        let queries = Queries { tokens: 11, first_pos: 0, window, softcap, sinks: with_sinks, block };
                        dense_check(values_from, stored, tolerance, 4, queries);
                        dense_check(values_from, stored, tolerance, 7, Queries { tokens: 3, first_pos: 700, block: long_block, ..queries });
                    }
                }
            }
        }
    }

    fn dense_check(values_from: Values, stored: Stored, tolerance: f64, page_size: usize, at: Queries) {
        let Queries { tokens, first_pos, window, softcap, sinks: with_sinks, .. } = at;
        let (kv_heads, group, hd, vd, positions) = (2, 3, 8, values_from.dim(), at.positions());
        let f = Fixture::new(page_size, kv_heads, hd, values_from, positions);
        let (stride, out_stride) = (kv_heads * group * hd, kv_heads * group * vd);
        let q = data(tokens * stride, 9.0);
        let got = run(&Kernels::portable(), &f, stored, group, &q, at);
        let sinks = sinks(kv_heads * group);
        for t in 0..tokens {
            let pos = first_pos + t;
            let keys = (pos + 1).saturating_sub(window.unwrap_or(usize::MAX))..at.key_end(t);
            for head in 0..kv_heads * group {
                let h = head / group;
                let qv = &q[t * stride + head * hd..][..hd];
                let scores: Vec<f64> = keys
                    .clone()
                    .map(|j| {
                        let s = (0..hd).map(|d| qv[d] as f64 * f.dense_k[(h * positions + j) * hd + d] as f64).sum::<f64>() / (hd as f64).sqrt();
                        softcap.map_or(s, |cap| cap as f64 * (s / cap as f64).tanh())
                    })
                    .collect();
                let sink = with_sinks.then(|| sinks[head] as f64);
                let max = scores.iter().copied().chain(sink).fold(f64::MIN, f64::max);
                let total: f64 = scores.iter().copied().chain(sink).map(|s| (s - max).exp()).sum();
                for d in 0..vd {
                    let want: f64 = keys.clone().zip(&scores).map(|(j, s)| (s - max).exp() / total * f.dense_v[(h * positions + j) * vd + d] as f64).sum();
                    let g = got[t * out_stride + head * vd + d] as f64;
                    assert!((want - g).abs() < tolerance, "{values_from:?} {stored:?} page {page_size} {at:?} t={t} head={head} d={d}: {want} vs {g}");
                }
            }
        }
    }

    /// A SIMD attention against the portable one on odd shapes, windows and soft caps, with
    /// float32, bfloat16 and int8 pages, values as wide as keys or narrower, in pages of their own
    /// or latent, groups wider than a score tile, blocks of queries that see past their own
    /// positions, and each query of an extend task against the same query alone (decode): all
    /// bit-identical.
    pub(crate) fn check_attention(simd: &Kernels) {
        let reference = Kernels::portable();
        let shapes = [
            (16, 64, Values::Own(64), 3),
            (1, 16, Values::Own(16), 1),
            (5, 80, Values::Own(80), 2),
            (32, 128, Values::Own(128), 4),
            (16, 6, Values::Own(6), 3),
            (7, 24, Values::Own(20), 3),
            (5, 19, Values::Own(7), 2),
            (3, 40, Values::Latent(36), 20),
            // Latent values wide enough for several chunks of widened rows.
            (5, 130, Values::Latent(128), 16),
            (9, 24, Values::Latent(24), 16),
            (1, 19, Values::Latent(7), 2),
        ];
        // (first position, tokens): a context in one key block, and one over several whose
        // queries straddle a block's end.
        for ((page_size, hd, values_from, group), (first_pos, tokens)) in shapes.into_iter().map(|shape| (shape, (37, 9))).chain(LONG_SHAPES) {
            let kv_heads = 2;
            let f = Fixture::new(page_size, kv_heads, hd, values_from, first_pos + tokens + 3);
            let (stride, out_stride) = (kv_heads * group * hd, kv_heads * group * values_from.dim());
            let q = data(tokens * stride, 10.0);
            let variants = VARIANTS.into_iter().flat_map(|variant| blocks(first_pos, tokens).map(|block| (variant, block)));
            for stored in STORED {
                for ((window, softcap, sinks), block) in variants.clone() {
                    let at = Queries { tokens, first_pos, window, softcap, sinks, block };
                    let want = run(&reference, &f, stored, group, &q, at);
                    let got = run(simd, &f, stored, group, &q, at);
                    for (i, (a, b)) in want.iter().zip(&got).enumerate() {
                        assert!(
                            a.to_bits() == b.to_bits(),
                            "{} attention ({stored:?}) page {page_size} hd {hd} {values_from:?} group {group} {at:?} at {i}: {a} vs {b}",
                            simd.isa
                        );
                    }
                    for t in 0..tokens {
                        let alone = run(simd, &f, stored, group, &q[t * stride..(t + 1) * stride], at.alone(t));
                        let in_chunk = &got[t * out_stride..(t + 1) * out_stride];
                        assert_eq!(alone, in_chunk, "{}: query {t} differs alone vs in its chunk ({stored:?}, {values_from:?}, {at:?})", simd.isa);
                    }
                }
            }
        }
    }

    /// A test task's page size, head_dim, values and group.
    type Shape = (usize, usize, Values, usize);

    /// Shapes over several key blocks, with (first position, tokens).
    const LONG_SHAPES: [(Shape, (usize, usize)); 3] =
        [((16, 64, Values::Own(64), 3), (510, 5)), ((7, 24, Values::Own(20), 2), (770, 3)), ((5, 40, Values::Latent(36), 16), (520, 2))];

    /// Each key block's partials, computed by any path for any split of the blocks into runs and
    /// merged in order, give the path's own `attention` bit for bit: how one long context splits
    /// over threads (flash-decoding) changes nothing.
    #[test]
    fn partials_split_anyhow_merge_to_the_same_bits() {
        for kern in std::iter::once(Kernels::portable()).chain(Kernels::simd_paths()) {
            for ((page_size, hd, values_from, group), (first_pos, tokens)) in LONG_SHAPES {
                let (kv_heads, f) = (2, Fixture::new(page_size, 2, hd, values_from, first_pos + tokens + 3));
                let q = data(tokens * kv_heads * group * hd, 13.0);
                for stored in STORED {
                    for ((window, softcap, sinks), block) in VARIANTS.into_iter().flat_map(|variant| blocks(first_pos, tokens).map(|block| (variant, block))) {
                        let at = Queries { tokens, first_pos, window, softcap, sinks, block };
                        let whole = run(&kern, &f, stored, group, &q, at);
                        let split = run_split(&kern, &f, stored, group, &q, at);
                        assert!(whole.iter().zip(&split).all(|(a, b)| a.to_bits() == b.to_bits()), "{} {stored:?} {values_from:?} {at:?}", kern.isa);
                    }
                }
            }
        }
    }

    /// [`run`] through `attention_partials` over runs of 1, 2, 3, ... key blocks, then
    /// `merge_partials`.
    fn run_split(kern: &Kernels, f: &Fixture, stored: Stored, group: usize, q: &[f32], at: Queries) -> Vec<f32> {
        let kv = f.kv(stored);
        let out_stride = f.kv_heads * group * kv.value_dim;
        let mut out = vec![f32::NAN; at.tokens * out_stride];
        let (sinks, key_ends) = (sinks(f.kv_heads * group), at.key_ends());
        for h in 0..f.kv_heads {
            let task = fixture_task(f, &kv, &f.table, group, q, at, &sinks, key_ends.as_deref(), h);
            let (blocks, block_len) = (task.key_blocks(), task.block_partials_len());
            let mut partials = vec![f32::NAN; blocks.len() * block_len];
            let (mut start, mut run_len) = (blocks.start, 1);
            while start < blocks.end {
                let end = (start + run_len).min(blocks.end);
                let at = (start - blocks.start) * block_len;
                (kern.attention_partials)(&task, start..end, &mut partials[at..at + (end - start) * block_len]);
                (start, run_len) = (end, run_len + 1);
            }
            // SAFETY: `out` holds every row the task writes, and nothing else runs.
            unsafe { (kern.merge_partials)(&task, &partials, out.as_mut_ptr().add(h * group * kv.value_dim), out_stride) };
        }
        out
    }

    /// A latent task gives the bits of the same task over value pages holding copies of each
    /// key's first `value_dim` elements (int8 ones with the key's scale), on every path.
    #[test]
    fn latent_values_are_the_keys_first_elements() {
        let (page_size, kv_heads, hd, group, first_pos, tokens) = (5, 2, 40, 16, 30, 4);
        let q = data(tokens * kv_heads * group * hd, 12.0);
        for vd in [33, hd] {
            let mut f = Fixture::new(page_size, kv_heads, hd, Values::Latent(vd), first_pos + tokens);
            for kern in std::iter::once(Kernels::portable()).chain(Kernels::simd_paths()) {
                for stored in STORED {
                    for (window, softcap, sinks) in VARIANTS {
                        let at = Queries { tokens, first_pos, window, softcap, sinks, block: None };
                        f.values_from = Values::Latent(vd);
                        let latent = run(&kern, &f, stored, group, &q, at);
                        f.values_from = Values::Own(vd);
                        let copies = run(&kern, &f, stored, group, &q, at);
                        assert!(latent.iter().zip(&copies).all(|(a, b)| a.to_bits() == b.to_bits()), "{} {stored:?} value_dim {vd} {at:?}", kern.isa);
                    }
                }
            }
        }
    }

    /// Keys before every query's window never weigh in, whatever their slots hold (NaN here),
    /// and pages wholly before it are not even read: their page-table entries may be stale.
    #[test]
    fn a_window_ignores_what_lies_before_it() {
        let (page_size, kv_heads, hd, group, tokens, first_pos) = (4, 2, 16, 2, 3, 29);
        let at = Queries { tokens, first_pos, window: Some(9), softcap: Some(1.5), sinks: true, block: Some((first_pos + 1, first_pos + tokens + 2)) };
        let first_key = first_pos + 1 - 9;
        let q = data(tokens * kv_heads * group * hd, 11.0);
        for values_from in [Values::Own(hd), Values::Latent(hd - 3)] {
            let clean = Fixture::new(page_size, kv_heads, hd, values_from, at.positions());
            let mut poisoned = Fixture::new(page_size, kv_heads, hd, values_from, at.positions());
            poisoned.poison_before(first_key);
            let mut stale = clean.table.clone();
            stale[..first_key / page_size].fill(u32::MAX);
            for kern in std::iter::once(Kernels::portable()).chain(Kernels::simd_paths()) {
                for stored in STORED {
                    let (what, want) = (format!("{} {stored:?} {values_from:?}", kern.isa), run(&kern, &clean, stored, group, &q, at));
                    assert!(want.iter().all(|x| x.is_finite()), "{what}");
                    assert_eq!(run(&kern, &poisoned, stored, group, &q, at), want, "{what}: NaN before the window leaked in");
                    assert_eq!(run_with_table(&kern, &clean, &stale, stored, group, &q, at), want, "{what}: a stale page was read");
                }
            }
        }
    }
}
