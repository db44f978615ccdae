//! The paged KV layout attention reads, and the unit of work of the attention kernels.
//!
//! Each layer keeps K and V for every page of the pool. Within a page, per kv head:
//! - keys are transposed, `[head_dim][page_size]`: the page's keys for one dimension sit next
//!   to each other, so a kernel computes the scores of a whole page one vector per dimension,
//!   with no horizontal sums;
//! - values are `[page_size][value_dim]`: a probability times one value row adds into the output.
//!
//! Latent pages (multi-head latent attention, DeepSeek-V2/V3) keep keys only: each token's value
//! is the first `value_dim` elements of its own key, so the cache stores each token's row once.
//!
//! Attention walks a sequence's keys in key blocks of whole pages (about [`KEY_BLOCK_KEYS`] keys,
//! counted from position 0): each block gives every query row a softmax partial of its own
//! ([`Partial`]), and the partials merge in key order. A query's bits then depend on its position
//! only, not on the rows or threads it shares a task with; a long context splits over threads by
//! blocks (flash-decoding) and a long prompt's scratch is a block wide (flash-attention's tiling).

/// One layer's K or V elements: float32, bfloat16 bit patterns (half the bytes, widened to f32
/// as they are read), or int8 with one f32 scale per token and kv head (a quarter of the bytes;
/// the scale multiplies a key's score and a value's probability, so the kernels widen the int8
/// elements and never dequantize a page).
#[derive(Clone, Copy)]
pub enum KvSlice<'a> {
    F32(&'a [f32]),
    Bf16(&'a [u16]),
    /// `scales[PagedKv::scale_offset(page, head) + slot]` is the scale of that token's row.
    Int8 {
        data: &'a [i8],
        scales: &'a [f32],
    },
}

impl KvSlice<'_> {
    pub(crate) fn len(&self) -> usize {
        match self {
            KvSlice::F32(x) => x.len(),
            KvSlice::Bf16(x) => x.len(),
            KvSlice::Int8 { data, .. } => data.len(),
        }
    }

    /// Element `i` as f32, before any scale.
    #[inline]
    pub fn get(&self, i: usize) -> f32 {
        match self {
            KvSlice::F32(x) => x[i],
            KvSlice::Bf16(x) => crate::packed::bf16_to_f32(x[i]),
            KvSlice::Int8 { data, .. } => data[i] as f32,
        }
    }

    /// The scale of the token row whose scale index is `i` (1 for float pages).
    #[inline]
    pub fn scale(&self, i: usize) -> f32 {
        match self {
            KvSlice::Int8 { scales, .. } => scales[i],
            _ => 1.0,
        }
    }
}

/// Quantizes one token's row of a kv head to int8 with a symmetric scale: writes the elements
/// through `store(index, value)` and returns the scale (`max |x| / 127`, 0 for an all-zero row).
pub fn quantize_kv_row(xs: &[f32], mut store: impl FnMut(usize, i8)) -> f32 {
    let amax = xs.iter().fold(0f32, |m, x| m.max(x.abs()));
    let scale = amax / 127.0;
    let inverse = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    for (i, &x) in xs.iter().enumerate() {
        store(i, (x * inverse).round().clamp(-127.0, 127.0) as i8);
    }
    scale
}

/// Keys per key block, at least: pages are whole within a block. Small enough that a block's
/// scores and values stay in L2 for a task's rows; large enough that merging is rare.
pub const KEY_BLOCK_KEYS: usize = 256;

/// One layer's K and V storage (both of one element type).
pub struct PagedKv<'a> {
    pub keys: KvSlice<'a>,
    /// `None`: latent pages, each token's value the first `value_dim` elements of its key (for
    /// int8 pages, scaled by the key's scale).
    pub values: Option<KvSlice<'a>>,
    pub page_size: usize,
    pub kv_heads: usize,
    /// Width of queries and keys.
    pub head_dim: usize,
    /// Width of values and of each query head's output (`head_dim` but for MLA).
    pub value_dim: usize,
}

/// Where kv head `head` of `page` starts in a layer's `keys` (`width` = `head_dim`) or in its
/// `values` (`width` = `value_dim`).
#[inline]
pub fn page_head_start(page: u32, head: usize, kv_heads: usize, page_size: usize, width: usize) -> usize {
    (page as usize * kv_heads + head) * page_size * width
}

impl<'a> PagedKv<'a> {
    /// Where kv head `head` of `page` starts in `keys`.
    #[inline]
    pub fn key_offset(&self, page: u32, head: usize) -> usize {
        page_head_start(page, head, self.kv_heads, self.page_size, self.head_dim)
    }

    /// Where kv head `head` of `page` starts in `values`.
    #[inline]
    pub fn value_offset(&self, page: u32, head: usize) -> usize {
        page_head_start(page, head, self.kv_heads, self.page_size, self.value_dim)
    }

    /// The storage values are read from: the value pages, or the keys of latent pages.
    pub fn value_storage(&self) -> KvSlice<'a> {
        self.values.unwrap_or(self.keys)
    }

    /// Where the value of token `slot` of kv head `head` of `page` starts in
    /// [`Self::value_storage`], and the step between its elements (1 in value pages, `page_size`
    /// down a latent page's transposed keys).
    #[inline]
    pub fn value_row(&self, page: u32, head: usize, slot: usize) -> (usize, usize) {
        match self.values {
            Some(_) => (self.value_offset(page, head) + slot * self.value_dim, 1),
            None => (self.key_offset(page, head) + slot, self.page_size),
        }
    }

    /// Pages per key block.
    #[inline]
    pub fn pages_per_block(&self) -> usize {
        KEY_BLOCK_KEYS.div_ceil(self.page_size)
    }

    /// Where the per-token scales of kv head `head` of `page` start (int8 pages).
    #[inline]
    pub fn scale_offset(&self, page: u32, head: usize) -> usize {
        page_head_scale_start(page, head, self.kv_heads, self.page_size)
    }
}

/// Where the per-token scales of kv head `head` of `page` start in an int8 layer's scales.
#[inline]
pub fn page_head_scale_start(page: u32, head: usize, kv_heads: usize, page_size: usize) -> usize {
    (page as usize * kv_heads + head) * page_size
}

/// The queries of one kv head's group (the `group` query heads sharing it, GQA) at `tokens`
/// consecutive positions of one sequence, starting at `first_pos`. Query token `t` attends to
/// keys `first_key(t)..span(t)`: causal (or up to its `key_ends`), and with a `window` only the
/// last `window` of them up to its own; decode is `tokens == 1`. The K and V of those positions
/// are already in the pages.
pub struct AttentionTask<'a> {
    pub kv: &'a PagedKv<'a>,
    /// The sequence's page table. Pages wholly before the task's first key are never read, so
    /// their entries may be stale.
    pub pages: &'a [u32],
    pub kv_head: usize,
    pub group: usize,
    /// Token `t`, group head `g`: `q[t * q_stride + g * head_dim..][..head_dim]`.
    pub q: &'a [f32],
    pub q_stride: usize,
    pub tokens: usize,
    pub first_pos: usize,
    /// Applied to every score (usually 1/sqrt(head_dim)).
    pub scale: f32,
    /// Sliding-window attention (Mistral, Gemma 2 and 3's local layers): the query at position
    /// `p` sees keys `p + 1 - window..=p` only. `None`: every key up to `p`.
    pub window: Option<usize>,
    /// Logit soft-capping (Gemma 2): each scaled score `s` becomes `cap * tanh(s / cap)` before
    /// the softmax ([`crate::portable::softcap`]).
    pub softcap: Option<f32>,
    /// Attention sinks (gpt-oss): one learned logit per group head, in the softmax's
    /// denominator only (it takes probability mass but adds no value).
    pub sinks: Option<&'a [f32]>,
    /// Where the keys each query token sees end (exclusive), past its own position for a query
    /// that attends both ways within a block of tokens (Gemma 3's images): one per token, each
    /// after its own position and none before the previous token's. `None`: causal.
    pub key_ends: Option<&'a [usize]>,
}

impl AttentionTask<'_> {
    /// Group head `g`'s sink logit, if the task has sinks.
    pub fn sink(&self, g: usize) -> Option<f32> {
        self.sinks.map(|sinks| sinks[g])
    }

    /// Keys query token `t` sees end here (exclusive): its own position's is the last, unless
    /// `key_ends` says otherwise. Never less than an earlier token's.
    pub fn span(&self, t: usize) -> usize {
        self.key_ends.map_or(self.first_pos + t + 1, |ends| ends[t])
    }

    /// The first key query token `t` sees: 0, or the start of the window up to its own position.
    pub fn first_key(&self, t: usize) -> usize {
        self.window.map_or(0, |w| (self.first_pos + t + 1).saturating_sub(w))
    }

    /// The task's pages: indexes in `pages` from the one holding the first key any query sees
    /// to the one holding the last.
    pub fn used_pages(&self) -> std::ops::Range<usize> {
        let ps = self.kv.page_size;
        self.first_key(0) / ps..self.span(self.tokens - 1).div_ceil(ps)
    }

    /// The key blocks holding the task's used pages: block `b` is pages
    /// `b * pages_per_block..(b + 1) * pages_per_block` of the sequence.
    pub fn key_blocks(&self) -> std::ops::Range<usize> {
        let (used, per_block) = (self.used_pages(), self.kv.pages_per_block());
        used.start / per_block..used.end.div_ceil(per_block)
    }

    /// The used pages of key block `b` (indexes in `pages`).
    pub fn block_pages(&self, b: usize) -> std::ops::Range<usize> {
        let (used, per_block) = (self.used_pages(), self.kv.pages_per_block());
        used.start.max(b * per_block)..used.end.min((b + 1) * per_block)
    }

    /// The keys query tokens `first..=last` see, together, among those of the pages `pages`
    /// (positions; empty when they see none of them).
    pub fn keys_within(&self, pages: &std::ops::Range<usize>, first: usize, last: usize) -> std::ops::Range<usize> {
        let ps = self.kv.page_size;
        let start = self.first_key(first).max(pages.start * ps);
        start..self.span(last).min(pages.end * ps).max(start)
    }

    /// Bytes of the pages the task reads (its used pages' keys, values and int8 scales): what
    /// a decode's attention streams from memory.
    pub fn bytes_read(&self) -> usize {
        let kv = self.kv;
        let per_key = |slice: KvSlice, width: usize| match slice {
            KvSlice::F32(_) => 4 * width,
            KvSlice::Bf16(_) => 2 * width,
            KvSlice::Int8 { .. } => width + 4,
        };
        let keys = self.used_pages().len() * kv.page_size;
        keys * (per_key(kv.keys, kv.head_dim) + kv.values.map_or(0, |values| per_key(values, kv.value_dim)))
    }

    /// Floats of one key block's partials: one [`Partial`] per query row.
    pub fn block_partials_len(&self) -> usize {
        self.tokens * self.group * Partial::len(self.kv.value_dim)
    }

    /// Checks the task against its storage; kernels call it before reading.
    pub fn validate(&self) {
        let (kv, hd, vd) = (self.kv, self.kv.head_dim, self.kv.value_dim);
        assert!(vd > 0, "attention: values of no elements");
        assert!(kv.values.is_some() || vd <= hd, "attention: latent values ({vd}) wider than their keys ({hd})");
        assert!(self.kv_head < kv.kv_heads, "attention: kv head {} of {}", self.kv_head, kv.kv_heads);
        assert!(self.tokens > 0 && self.group > 0);
        assert!(self.window != Some(0), "attention: a window of no keys");
        if let Some(ends) = self.key_ends {
            assert!(ends.len() == self.tokens, "attention: {} key ends for {} tokens", ends.len(), self.tokens);
            let mut floor = self.first_pos;
            for (t, &end) in ends.iter().enumerate() {
                assert!(end > self.first_pos + t && end >= floor, "attention: query {t}'s keys end at {end}, before its own or an earlier query's");
                floor = end;
            }
        }
        assert!(self.softcap.is_none_or(|cap| cap > 0.0 && cap.is_finite()), "attention: a soft cap must be positive and finite");
        assert!(self.pages.len() * kv.page_size >= self.span(self.tokens - 1), "attention: the page table is too short");
        let last = (self.tokens - 1) * self.q_stride + self.group * hd;
        assert!(self.q.len() >= last, "attention: q is too short");
        assert!(self.sinks.is_none_or(|sinks| sinks.len() >= self.group), "attention: fewer sinks than group heads");
        // Offsets grow with the page number, so the highest page read ends last.
        let last = *self.pages[self.used_pages()].iter().max().expect("a task reads at least one page");
        let ps = kv.page_size;
        let key_end = kv.key_offset(last, self.kv_head) + ps * hd;
        let value_end = kv.values.map(|values| (values, kv.value_offset(last, self.kv_head) + ps * vd));
        let scales_end = kv.scale_offset(last, self.kv_head) + ps;
        for (slice, end) in std::iter::once((kv.keys, key_end)).chain(value_end) {
            assert!(slice.len() >= end, "attention: a page lies outside the storage");
            if let KvSlice::Int8 { scales, .. } = slice {
                assert!(scales.len() >= scales_end, "attention: a page's scales lie outside the storage");
            }
        }
    }
}

/// A query row's softmax over some of its keys, stored as `[max, sum, out...]`: `max` the
/// largest scaled score (-inf when the row saw none of the keys), `sum` the sum of
/// `exp(score - max)`, `out` (`value_dim` wide) the values weighted by those exponentials over
/// `sum` (normalized within the keys, so a context of one block gives exactly a plain softmax's
/// output).
pub struct Partial;

impl Partial {
    /// Floats of one row's partial.
    pub const fn len(value_dim: usize) -> usize {
        value_dim + 2
    }

    /// Sets `state` to the partial of no keys.
    pub fn clear(state: &mut [f32]) {
        state[0] = f32::NEG_INFINITY;
        state[1] = 0.0;
    }

    /// Merges the later keys' partial `part` into `state` (the earlier keys'): each output
    /// weighted by its share of the two sums, rescaled to the larger max. The first merge copies.
    /// Every path merges with this one function, in key order, so the split and the
    /// single-thread results agree bit for bit.
    #[inline(always)]
    pub fn merge(state: &mut [f32], part: &[f32]) {
        let (m, mp) = (state[0], part[0]);
        if mp == f32::NEG_INFINITY {
            return;
        }
        if m == f32::NEG_INFINITY {
            state.copy_from_slice(part);
            return;
        }
        let max = m.max(mp);
        let (a, b) = (state[1] * crate::portable::exp(m - max), part[1] * crate::portable::exp(mp - max));
        let total = a + b;
        let (wa, wb) = (a / total, b / total);
        state[0] = max;
        state[1] = total;
        for (s, p) in state[2..].iter_mut().zip(&part[2..]) {
            *s = p.mul_add(wb, *s * wa);
        }
    }

    /// Writes a row's output from its merged `state`: the state's own, or with a sink logit,
    /// scaled by the keys' share of the sum the sink joins.
    #[inline(always)]
    pub fn finish(state: &[f32], sink: Option<f32>, out: &mut [f32]) {
        let (m, sum, values) = (state[0], state[1], &state[2..]);
        let Some(s) = sink else {
            out.copy_from_slice(&values[..out.len()]);
            return;
        };
        let max = m.max(s);
        let keys = sum * crate::portable::exp(m - max);
        let factor = keys / (keys + crate::portable::exp(s - max));
        for (o, v) in out.iter_mut().zip(values) {
            *o = v * factor;
        }
    }
}

/// Merges the partials of key blocks `blocks` of `task` (`partials[(b - blocks.start) *
/// block_partials_len()..]`, as [`crate::Kernels::attention_partials`] writes them), in block
/// order, and writes each row's output as the kernels' `attention` does. `blocks` must be all
/// of [`AttentionTask::key_blocks`].
///
/// Inlined into each path's entry ([`crate::Kernels::merge_partials`]), so the merge's
/// multiply-adds are the CPU's own instructions, not calls.
///
/// # Safety
/// As `attention`: `out` valid for the task's rows, no other thread touching them.
#[inline(always)]
pub unsafe fn merge_partials(task: &AttentionTask, partials: &[f32], out: *mut f32, out_stride: usize) {
    let (vd, rows) = (task.kv.value_dim, task.tokens * task.group);
    let (len, block_len) = (Partial::len(vd), task.block_partials_len());
    let blocks = task.key_blocks().len();
    assert!(partials.len() >= blocks * block_len, "merge_partials: too few partials");
    let mut state = vec![0f32; len];
    for r in 0..rows {
        Partial::clear(&mut state);
        for b in 0..blocks {
            Partial::merge(&mut state, &partials[b * block_len + r * len..][..len]);
        }
        let o = std::slice::from_raw_parts_mut(out.add((r / task.group) * out_stride + (r % task.group) * vd), vd);
        Partial::finish(&state, task.sink(r % task.group), o);
    }
}
