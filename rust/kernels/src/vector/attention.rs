//! Paged attention over [`F32Vector`], for decode and extend alike (see [`AttentionTask`]).
//!
//! 1. Scores: for each page, up to 8 query rows at once multiply the page's transposed keys one
//!    dimension at a time, so each key vector loaded serves every row of the group and block.
//! 2. A softmax per row over its own span; the probabilities of keys past the span are zero.
//! 3. Values: up to 4 rows by up to 4 registers of the head, summed key by key.
//!
//! Each row's arithmetic is the same whatever rows share its task, so a query gets the same bits
//! alone, in a decode batch or in a prefill chunk.

use super::elementwise::softmax;
use super::F32Vector;
use crate::packed::bf16_to_f32;
use crate::paged::{AttentionTask, KvSlice};
use std::cell::RefCell;

/// Query rows scored together (accumulators: one register each per page vector).
const SCORE_ROWS: usize = 8;
/// Registers of the head a value pass accumulates.
const VALUE_REGS: usize = 4;

thread_local! {
    /// Scores and probabilities, `[row][key]`, reused across calls on this thread.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// An element of the KV pages as stored: f32, or a bfloat16 bit pattern.
trait KvElement: Copy {
    unsafe fn load<V: F32Vector>(p: *const Self) -> V;
    fn to_f32(self) -> f32;
}

impl KvElement for f32 {
    #[inline(always)]
    unsafe fn load<V: F32Vector>(p: *const f32) -> V {
        V::load(p)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

impl KvElement for u16 {
    #[inline(always)]
    unsafe fn load<V: F32Vector>(p: *const u16) -> V {
        V::load_bf16(p)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16_to_f32(self)
    }
}

/// Where a task's keys and values start, in their stored element type.
struct Pages<E> {
    keys: *const E,
    values: *const E,
}

#[inline(always)]
pub unsafe fn attention<V: F32Vector>(task: &AttentionTask, out: *mut f32, out_stride: usize) {
    task.validate();
    match (task.kv.keys, task.kv.values) {
        (KvSlice::F32(k), KvSlice::F32(v)) => attention_over::<V, f32>(task, Pages { keys: k.as_ptr(), values: v.as_ptr() }, out, out_stride),
        (KvSlice::Bf16(k), KvSlice::Bf16(v)) => attention_over::<V, u16>(task, Pages { keys: k.as_ptr(), values: v.as_ptr() }, out, out_stride),
        _ => panic!("attention: keys and values are stored in different types"),
    }
}

#[inline(always)]
unsafe fn attention_over<V: F32Vector, E: KvElement>(task: &AttentionTask, kv: Pages<E>, out: *mut f32, out_stride: usize) {
    let keys = task.span(task.tokens - 1);
    let ps = task.kv.page_size;
    // Whole pages, and whole registers past the last page's end.
    let width = (keys.div_ceil(ps) * ps).next_multiple_of(V::LANES);
    let rows = task.tokens * task.group;
    // Taken out of the thread-local rather than used in a closure: a closure would not inherit
    // the caller's target features, and the intrinsics inlined into it would become calls.
    let mut probs = SCRATCH.take();
    probs.clear();
    probs.resize(rows * width, 0.0);
    scores::<V, E>(task, &kv, &mut probs, width);
    for r in 0..rows {
        let row = &mut probs[r * width..(r + 1) * width];
        let span = task.span(r / task.group);
        softmax::<V>(&mut row[..span]);
        row[span..].fill(0.0);
    }
    values::<V, E>(task, &kv, &probs, width, out, out_stride);
    SCRATCH.set(probs);
}

/// Query row `r` (token `r / group`, head `r % group`).
#[inline(always)]
unsafe fn query(task: &AttentionTask, r: usize) -> *const f32 {
    task.q.as_ptr().add((r / task.group) * task.q_stride + (r % task.group) * task.kv.head_dim)
}

#[inline(always)]
unsafe fn scores<V: F32Vector, E: KvElement>(task: &AttentionTask, pages: &Pages<E>, probs: &mut [f32], width: usize) {
    let kv = task.kv;
    let (ps, rows) = (kv.page_size, task.tokens * task.group);
    let keys = task.span(task.tokens - 1);
    for (p, &page) in task.pages[..keys.div_ceil(ps)].iter().enumerate() {
        let base = pages.keys.add(kv.offset(page, task.kv_head));
        for slot in (0..ps).step_by(V::LANES) {
            let lanes = V::LANES.min(ps - slot);
            for first in (0..rows).step_by(SCORE_ROWS) {
                let n = SCORE_ROWS.min(rows - first);
                let dst = probs.as_mut_ptr().add(first * width + p * ps + slot);
                macro_rules! block {
                    ($($r:literal)*) => {
                        match n {
                            $($r => score_block::<V, E, $r>(task, first, base.add(slot), lanes, dst, width),)*
                            _ => unreachable!(),
                        }
                    };
                }
                block!(1 2 3 4 5 6 7 8);
            }
        }
    }
}

/// Scores of `R` query rows from `first` against the keys at `k` (one page's keys from a slot,
/// `[head_dim][page_size]`), `lanes` of them valid; written at `dst`, rows `width` apart.
#[inline(always)]
unsafe fn score_block<V: F32Vector, E: KvElement, const R: usize>(task: &AttentionTask, first: usize, k: *const E, lanes: usize, dst: *mut f32, width: usize) {
    if lanes == V::LANES {
        let acc = score_rows::<V, E, R>(task, first, k, task.kv.page_size);
        for (r, acc) in acc.iter().enumerate() {
            acc.store(dst.add(r * width));
        }
    } else {
        score_narrow_page::<V, E, R>(task, first, k, lanes, dst, width);
    }
}

/// [`score_block`] for a page narrower than a register (small page sizes): the keys are
/// copied into whole registers padded with zeros, so the common loop never branches on it.
#[cold]
#[inline(never)]
unsafe fn score_narrow_page<V: F32Vector, E: KvElement, const R: usize>(
    task: &AttentionTask,
    first: usize,
    k: *const E,
    lanes: usize,
    dst: *mut f32,
    width: usize,
) {
    let (ps, hd) = (task.kv.page_size, task.kv.head_dim);
    let mut padded = vec![0f32; hd * V::LANES];
    for d in 0..hd {
        for i in 0..lanes {
            padded[d * V::LANES + i] = (*k.add(d * ps + i)).to_f32();
        }
    }
    let mut row = vec![0f32; V::LANES];
    for (r, acc) in score_rows::<V, f32, R>(task, first, padded.as_ptr(), V::LANES).iter().enumerate() {
        acc.store(row.as_mut_ptr());
        std::ptr::copy_nonoverlapping(row.as_ptr(), dst.add(r * width), lanes);
    }
}

/// The scaled scores of `R` query rows from `first` against one register of keys at `k`,
/// dimensions `stride` apart. The rows' accumulators are the loop's only state, so they stay
/// in registers (a branch in this loop once kept one on the stack, a store and a load per key
/// dimension on the critical path).
// `acc[r]` and `q[r]` are register rows walked in lockstep; the unrolled index loop is the kernel.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn score_rows<V: F32Vector, E: KvElement, const R: usize>(task: &AttentionTask, first: usize, k: *const E, stride: usize) -> [V; R] {
    let q: [*const f32; R] = std::array::from_fn(|r| query(task, first + r));
    let mut acc = [V::zero(); R];
    for d in 0..task.kv.head_dim {
        let kd = E::load::<V>(k.add(d * stride));
        for r in 0..R {
            acc[r] = V::splat(*q[r].add(d)).mul_add(kd, acc[r]);
        }
    }
    let scale = V::splat(task.scale);
    for a in acc.iter_mut() {
        *a = a.mul(scale);
    }
    acc
}

#[inline(always)]
unsafe fn values<V: F32Vector, E: KvElement>(task: &AttentionTask, pages: &Pages<E>, probs: &[f32], width: usize, out: *mut f32, out_stride: usize) {
    let (hd, rows) = (task.kv.head_dim, task.tokens * task.group);
    let body = hd / V::LANES * V::LANES;
    // AVX2's 16 registers fit 2 rows of 4 accumulators plus the value registers.
    let max_rows = if V::REGISTERS >= 32 { 4 } else { 2 };
    for first in (0..rows).step_by(max_rows) {
        let n = max_rows.min(rows - first);
        // Keys the block's last row sees; earlier rows have zero probabilities past their span.
        let span = task.span((first + n - 1) / task.group);
        let dst: [*mut f32; 4] = std::array::from_fn(|r| {
            let row = first + r.min(n - 1);
            out.add((row / task.group) * out_stride + (row % task.group) * hd)
        });
        for d in (0..body).step_by(VALUE_REGS * V::LANES) {
            let regs = VALUE_REGS.min((body - d) / V::LANES);
            macro_rules! block {
                ($(($r:literal, $v:literal))*) => {
                    match (n, regs) {
                        $(($r, $v) => value_block::<V, E, $r, $v>(task, pages, &probs[first * width..], width, span, d, &dst),)*
                        _ => unreachable!(),
                    }
                };
            }
            block!((1, 1)(1, 2)(1, 3)(1, 4)(2, 1)(2, 2)(2, 3)(2, 4)(3, 1)(3, 2)(3, 3)(3, 4)(4, 1)(4, 2)(4, 3)(4, 4));
        }
        // Head dimensions past the last whole register.
        for r in 0..n {
            for d in body..hd {
                let mut acc = 0f32;
                for j in 0..span {
                    acc = probs[(first + r) * width + j].mul_add((*value(task, pages, j).add(d)).to_f32(), acc);
                }
                *dst[r].add(d) = acc;
            }
        }
    }
}

/// Value row of key `j`.
#[inline(always)]
unsafe fn value<E>(task: &AttentionTask, pages: &Pages<E>, j: usize) -> *const E {
    let kv = task.kv;
    let ps = kv.page_size;
    pages.values.add(kv.offset(task.pages[j / ps], task.kv_head) + (j % ps) * kv.head_dim)
}

/// `R` output rows, registers `d..d + NV * LANES` of the head: `sum_j probs[r][j] * V[j]`.
// The accumulator tile is indexed in lockstep with the value registers and output rows.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn value_block<V: F32Vector, E: KvElement, const R: usize, const NV: usize>(
    task: &AttentionTask,
    pages: &Pages<E>,
    probs: &[f32],
    width: usize,
    span: usize,
    d: usize,
    dst: &[*mut f32; 4],
) {
    let (ps, hd) = (task.kv.page_size, task.kv.head_dim);
    let mut acc = [[V::zero(); NV]; R];
    // Page by page, so a key's value row is a step from the last, not a page-table look-up.
    for (page_index, &page) in task.pages[..span.div_ceil(ps)].iter().enumerate() {
        let first = page_index * ps;
        let page_values = pages.values.add(task.kv.offset(page, task.kv_head) + d);
        for slot in 0..ps.min(span - first) {
            let v = page_values.add(slot * hd);
            let vj: [V; NV] = std::array::from_fn(|i| E::load::<V>(v.add(i * V::LANES)));
            for r in 0..R {
                let p = V::splat(*probs.get_unchecked(r * width + first + slot));
                for i in 0..NV {
                    acc[r][i] = p.mul_add(vj[i], acc[r][i]);
                }
            }
        }
    }
    for r in 0..R {
        for i in 0..NV {
            acc[r][i].store(dst[r].add(d + i * V::LANES));
        }
    }
}
