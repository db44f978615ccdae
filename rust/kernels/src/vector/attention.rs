//! Paged attention over [`F32Vector`], for decode and extend alike (see [`AttentionTask`]).
//!
//! 1. Scores: up to 8 query rows (4 on AVX2) at once multiply two registers of transposed keys
//!    one dimension at a time, so each key vector loaded serves every row of the group and block,
//!    and a decode's few rows still keep two FMA chains each in flight.
//! 2. Per row, over exactly its own keys (its window, up to its position): the soft cap, if
//!    any, and the softmax (with the head's sink logit, if any, in its denominator); every other key's probability is zero.
//! 3. Values: up to 4 rows by up to 4 registers of the head, summed key by key. Latent pages'
//!    values (the first `value_dim` elements of each transposed key) are first widened into
//!    value rows in scratch, a chunk of keys at a time, so the same tiles sum them: one copy per
//!    element serves the whole group (16 to 128 query heads in MLA decode).
//!
//! Int8 pages are widened in registers: a key's scale multiplies its score (it factors out of
//! the sum over dimensions) and a value's scale its probability, so no page is dequantized.
//!
//! Score columns count keys from the first one of the first page any row sees: pages wholly
//! before every row's window are never scored, read or prefetched, so a windowed layer costs its
//! window, not the context.
//!
//! Each row's arithmetic is the same whatever rows share its task, so a query gets the same bits
//! alone, in a decode batch or in a prefill chunk.

use super::elementwise::{softcap, softmax_with_sink};
use super::F32Vector;
use crate::packed::bf16_to_f32;
use crate::paged::{AttentionTask, KvSlice};
use std::cell::RefCell;
use std::ops::Range;

/// Query rows scored together (accumulators: one register each per key register) on ISAs with
/// 32 registers; AVX2's 16 take half.
const SCORE_ROWS: usize = 8;
/// Registers of the head a value pass accumulates.
const VALUE_REGS: usize = 4;
/// How far ahead of the page in use keys (or values) are prefetched: a sequence's pages lie
/// apart in the pool, and the hardware prefetchers stop at each one's end.
const PREFETCH_BYTES_AHEAD: usize = 8 << 10;

thread_local! {
    /// Scores and probabilities, `[row][key]`, reused across calls on this thread.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// Latent values widened to rows, `[key][value_dim]`, one chunk of keys at a time.
    static LATENT_ROWS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// An element of the KV pages as stored: f32, a bfloat16 bit pattern, or int8 (scaled per
/// token).
trait KvElement: Copy {
    /// Whether the pages carry a scale per token and kv head.
    const SCALED: bool = false;
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

impl KvElement for i8 {
    const SCALED: bool = true;
    #[inline(always)]
    unsafe fn load<V: F32Vector>(p: *const i8) -> V {
        V::load_i8(p)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
}

/// Where a task's keys and values start, in their stored element type, and their per-token
/// scales (null unless `E::SCALED`). Latent pages' values and value scales are their keys'.
struct Pages<E> {
    keys: *const E,
    values: *const E,
    key_scales: *const f32,
    value_scales: *const f32,
}

#[inline(always)]
pub unsafe fn attention<V: F32Vector>(task: &AttentionTask, out: *mut f32, out_stride: usize) {
    task.validate();
    let unscaled = std::ptr::null();
    match (task.kv.keys, task.kv.value_storage()) {
        (KvSlice::F32(k), KvSlice::F32(v)) => {
            let pages = Pages { keys: k.as_ptr(), values: v.as_ptr(), key_scales: unscaled, value_scales: unscaled };
            attention_over::<V, f32>(task, pages, out, out_stride)
        }
        (KvSlice::Bf16(k), KvSlice::Bf16(v)) => {
            let pages = Pages { keys: k.as_ptr(), values: v.as_ptr(), key_scales: unscaled, value_scales: unscaled };
            attention_over::<V, u16>(task, pages, out, out_stride)
        }
        (KvSlice::Int8 { data: k, scales: ks }, KvSlice::Int8 { data: v, scales: vs }) => {
            let pages = Pages { keys: k.as_ptr(), values: v.as_ptr(), key_scales: ks.as_ptr(), value_scales: vs.as_ptr() };
            attention_over::<V, i8>(task, pages, out, out_stride)
        }
        _ => panic!("attention: keys and values are stored in different types"),
    }
}

#[inline(always)]
unsafe fn attention_over<V: F32Vector, E: KvElement>(task: &AttentionTask, kv: Pages<E>, out: *mut f32, out_stride: usize) {
    // Whole pages, and whole registers past the last page's end.
    let width = (task.used_pages().len() * task.kv.page_size).next_multiple_of(V::LANES);
    let rows = task.tokens * task.group;
    // Taken out of the thread-local rather than used in a closure: a closure would not inherit
    // the caller's target features, and the intrinsics inlined into it would become calls.
    let mut probs = SCRATCH.take();
    probs.clear();
    probs.resize(rows * width, 0.0);
    scores::<V, E>(task, &kv, &mut probs, width);
    for r in 0..rows {
        let row = &mut probs[r * width..(r + 1) * width];
        let t = r / task.group;
        let keys = key_columns(task, t, t);
        if let Some(cap) = task.softcap {
            softcap::<V>(&mut row[keys.clone()], cap);
        }
        softmax_with_sink::<V>(&mut row[keys.clone()], task.sink(r % task.group));
        row[..keys.start].fill(0.0);
        row[keys.end..].fill(0.0);
        if E::SCALED {
            scale_by_value_scales(task, &kv, row, keys);
        }
    }
    values::<V, E>(task, &kv, &probs, width, out, out_stride);
    SCRATCH.set(probs);
}

/// Prefetches `elements` elements from `start` (the part of the task's kv head of `page` a pass
/// reads) and that head's scales in `scales`.
#[inline(always)]
unsafe fn prefetch_page<V: F32Vector, E: KvElement>(task: &AttentionTask, page: u32, start: *const E, elements: usize, scales: *const f32) {
    for offset in (0..elements * std::mem::size_of::<E>()).step_by(64) {
        V::prefetch((start as *const u8).add(offset));
    }
    if E::SCALED {
        V::prefetch(scales.add(task.kv.scale_offset(page, task.kv_head)) as *const u8);
    }
}

/// The score columns of the keys query tokens `first..=last` see, together: column 0 is the
/// first key of the task's first used page.
#[inline(always)]
fn key_columns(task: &AttentionTask, first: usize, last: usize) -> Range<usize> {
    let origin = task.used_pages().start * task.kv.page_size;
    task.first_key(first) - origin..task.span(last) - origin
}

/// Multiplies the probabilities of the keys in `columns` of `row` by their value rows' scales
/// (int8 pages).
#[inline(always)]
unsafe fn scale_by_value_scales<E>(task: &AttentionTask, pages: &Pages<E>, row: &mut [f32], columns: Range<usize>) {
    let (ps, first_page) = (task.kv.page_size, task.used_pages().start);
    for p in columns.start / ps..columns.end.div_ceil(ps) {
        let scales = pages.value_scales.add(task.kv.scale_offset(task.pages[first_page + p], task.kv_head));
        let on_page = columns.start.max(p * ps)..columns.end.min((p + 1) * ps);
        for (slot, prob) in (on_page.start - p * ps..).zip(&mut row[on_page]) {
            *prob *= *scales.add(slot);
        }
    }
}

/// Query row `r` (token `r / group`, head `r % group`).
#[inline(always)]
unsafe fn query(task: &AttentionTask, r: usize) -> *const f32 {
    task.q.as_ptr().add((r / task.group) * task.q_stride + (r % task.group) * task.kv.head_dim)
}

/// Pages ahead of the one in use to prefetch ([`PREFETCH_BYTES_AHEAD`], at least one page) when
/// a pass reads `width` elements per token.
#[inline(always)]
fn pages_ahead<E>(task: &AttentionTask, width: usize) -> usize {
    (PREFETCH_BYTES_AHEAD / (task.kv.page_size * width * std::mem::size_of::<E>())).max(1)
}

/// A register of one page's keys: where its column of `[head_dim][page_size]` starts, its
/// scales (int8 pages), and its first key's index in a row of scores.
#[derive(Clone, Copy)]
struct KeyRegister<E> {
    keys: *const E,
    scales: *const f32,
    column: usize,
}

/// The keys one scoring pass takes: two whole registers, the last whole one, or the part of a
/// page narrower than a register (`lanes` keys).
#[derive(Clone, Copy)]
enum KeyBlock<E> {
    Pair([KeyRegister<E>; 2]),
    Single(KeyRegister<E>),
    Narrow(KeyRegister<E>, usize),
}

#[inline(always)]
unsafe fn scores<V: F32Vector, E: KvElement>(task: &AttentionTask, pages: &Pages<E>, probs: &mut [f32], width: usize) {
    let kv = task.kv;
    let ps = kv.page_size;
    let used = &task.pages[task.used_pages()];
    let ahead = pages_ahead::<E>(task, kv.head_dim);
    let mut pending = None;
    for (p, &page) in used.iter().enumerate() {
        if let Some(&later) = used.get(p + ahead) {
            prefetch_page::<V, E>(task, later, pages.keys.add(kv.key_offset(later, task.kv_head)), ps * kv.head_dim, pages.key_scales);
        }
        let base = pages.keys.add(kv.key_offset(page, task.kv_head));
        let scales = if E::SCALED { pages.key_scales.add(kv.scale_offset(page, task.kv_head)) } else { std::ptr::null() };
        for slot in (0..ps).step_by(V::LANES) {
            let register = KeyRegister { keys: base.add(slot), scales: if E::SCALED { scales.add(slot) } else { scales }, column: p * ps + slot };
            let lanes = V::LANES.min(ps - slot);
            if lanes < V::LANES {
                score_key_block::<V, E>(task, KeyBlock::Narrow(register, lanes), probs, width);
            } else if let Some(previous) = pending.take() {
                score_key_block::<V, E>(task, KeyBlock::Pair([previous, register]), probs, width);
            } else {
                pending = Some(register);
            }
        }
    }
    if let Some(last) = pending {
        score_key_block::<V, E>(task, KeyBlock::Single(last), probs, width);
    }
}

/// Scores every query row of the task against `block`, a block of rows at a time.
#[inline(always)]
unsafe fn score_key_block<V: F32Vector, E: KvElement>(task: &AttentionTask, block: KeyBlock<E>, probs: &mut [f32], width: usize) {
    let rows = task.tokens * task.group;
    let max_rows = if V::REGISTERS >= 32 { SCORE_ROWS } else { SCORE_ROWS / 2 };
    for first in (0..rows).step_by(max_rows) {
        let dst = probs.as_mut_ptr().add(first * width);
        macro_rules! rows {
            ($($r:literal)*) => {
                match max_rows.min(rows - first) {
                    $($r => match block {
                        KeyBlock::Pair(registers) => score_registers::<V, E, $r, 2>(task, first, registers, dst, width),
                        KeyBlock::Single(register) => score_registers::<V, E, $r, 1>(task, first, [register], dst, width),
                        KeyBlock::Narrow(register, lanes) => score_narrow_page::<V, E, $r>(task, first, register, lanes, dst, width),
                    },)*
                    _ => unreachable!(),
                }
            };
        }
        rows!(1 2 3 4 5 6 7 8);
    }
}

/// Scores of `R` query rows from `first` against `KR` whole registers of keys; row `r` of the
/// scores is written at `dst + r * width`.
#[inline(always)]
unsafe fn score_registers<V: F32Vector, E: KvElement, const R: usize, const KR: usize>(
    task: &AttentionTask,
    first: usize,
    registers: [KeyRegister<E>; KR],
    dst: *mut f32,
    width: usize,
) {
    let scale: [V; KR] = std::array::from_fn(|i| if E::SCALED { V::load(registers[i].scales).mul(V::splat(task.scale)) } else { V::splat(task.scale) });
    let acc = score_rows::<V, E, R, KR>(task, first, registers.map(|register| register.keys), task.kv.page_size, scale);
    for (r, acc) in acc.iter().enumerate() {
        for (register, acc) in registers.iter().zip(acc) {
            acc.store(dst.add(r * width + register.column));
        }
    }
}

/// [`score_registers`] for the part of a page narrower than a register (small page sizes): its
/// keys are copied into whole registers padded with zeros, so the common loop never branches
/// on it.
#[cold]
#[inline(never)]
unsafe fn score_narrow_page<V: F32Vector, E: KvElement, const R: usize>(
    task: &AttentionTask,
    first: usize,
    register: KeyRegister<E>,
    lanes: usize,
    dst: *mut f32,
    width: usize,
) {
    let (ps, hd) = (task.kv.page_size, task.kv.head_dim);
    let mut padded = vec![0f32; hd * V::LANES];
    for d in 0..hd {
        for i in 0..lanes {
            padded[d * V::LANES + i] = (*register.keys.add(d * ps + i)).to_f32();
        }
    }
    let mut row = vec![0f32; V::LANES];
    if E::SCALED {
        std::ptr::copy_nonoverlapping(register.scales, row.as_mut_ptr(), lanes);
    } else {
        row[..lanes].fill(1.0);
    }
    let scale = V::load(row.as_ptr()).mul(V::splat(task.scale));
    for (r, [acc]) in score_rows::<V, f32, R, 1>(task, first, [padded.as_ptr()], V::LANES, [scale]).iter().enumerate() {
        acc.store(row.as_mut_ptr());
        std::ptr::copy_nonoverlapping(row.as_ptr(), dst.add(r * width + register.column), lanes);
    }
}

/// The scores of `R` query rows from `first` against `KR` registers of keys at `k`, dimensions
/// `stride` apart, times `scale` (the task's, times each key's own for int8 pages). Each lane is
/// one key, so how many registers share a pass changes no bit of a score. The accumulators are
/// the loop's only state, so they stay in registers (a branch in this loop once kept one on the
/// stack, a store and a load per key dimension on the critical path).
// `acc[r]` and `q[r]` are register rows walked in lockstep; the unrolled index loop is the kernel.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn score_rows<V: F32Vector, E: KvElement, const R: usize, const KR: usize>(
    task: &AttentionTask,
    first: usize,
    k: [*const E; KR],
    stride: usize,
    scale: [V; KR],
) -> [[V; KR]; R] {
    let q: [*const f32; R] = std::array::from_fn(|r| query(task, first + r));
    let mut acc = [[V::zero(); KR]; R];
    for d in 0..task.kv.head_dim {
        let kd: [V; KR] = std::array::from_fn(|i| E::load::<V>(k[i].add(d * stride)));
        for r in 0..R {
            let qd = V::splat(*q[r].add(d));
            for i in 0..KR {
                acc[r][i] = qd.mul_add(kd[i], acc[r][i]);
            }
        }
    }
    for row in acc.iter_mut() {
        for (a, scale) in row.iter_mut().zip(scale) {
            *a = a.mul(scale);
        }
    }
    acc
}

/// Bytes of value rows one key chunk of the value pass spans: they stay in L1 while every block
/// of rows and registers of the head reads them, so each value is read from memory once.
const VALUE_CHUNK_BYTES: usize = 16 << 10;

/// Output rows a value tile takes: AVX2's 16 registers fit 2 rows of 4 accumulators plus the
/// value registers.
#[inline(always)]
fn value_tile_rows<V: F32Vector>() -> usize {
    if V::REGISTERS >= 32 {
        4
    } else {
        2
    }
}

/// Where rows `first..first + n` of the task go (up to 4; the rest repeat the last).
#[inline(always)]
unsafe fn output_rows(task: &AttentionTask, out: *mut f32, out_stride: usize, first: usize, n: usize) -> [*mut f32; 4] {
    std::array::from_fn(|r| {
        let row = first + r.min(n - 1);
        out.add((row / task.group) * out_stride + (row % task.group) * task.kv.value_dim)
    })
}

#[inline(always)]
unsafe fn values<V: F32Vector, E: KvElement>(task: &AttentionTask, pages: &Pages<E>, probs: &[f32], width: usize, out: *mut f32, out_stride: usize) {
    let (vd, ps, rows) = (task.kv.value_dim, task.kv.page_size, task.tokens * task.group);
    let body = vd / V::LANES * V::LANES;
    let all = key_columns(task, 0, task.tokens - 1);
    // Whole pages per chunk.
    let chunk_for = |bytes_per_key: usize| (VALUE_CHUNK_BYTES / bytes_per_key).max(1).next_multiple_of(ps);
    if task.kv.values.is_some() {
        let source = ValueSource::Pages { values: pages.values, scales: pages.value_scales };
        let chunk = chunk_for(vd * std::mem::size_of::<E>());
        for keys_start in (0..all.end).step_by(chunk) {
            value_chunk::<V, E>(task, source, probs, width, keys_start..keys_start + chunk, out, out_stride);
        }
    } else if body > 0 {
        let chunk = chunk_for(vd * std::mem::size_of::<f32>());
        let mut widened = LATENT_ROWS.take();
        widened.resize(chunk * vd, 0.0);
        for keys_start in (0..all.end).step_by(chunk) {
            let columns = all.start.max(keys_start)..all.end.min(keys_start + chunk);
            if columns.is_empty() {
                continue;
            }
            widen_latent_values::<V, E>(task, pages, columns.clone(), keys_start, body, &mut widened);
            let source = ValueSource::Widened { rows: widened.as_ptr(), first_page: keys_start / ps };
            value_chunk::<V, f32>(task, source, probs, width, columns, out, out_stride);
        }
        LATENT_ROWS.set(widened);
    }
    // Value dimensions past the last whole register.
    let used = &task.pages[task.used_pages()];
    let max_rows = value_tile_rows::<V>();
    for first in (0..rows).step_by(max_rows) {
        let n = max_rows.min(rows - first);
        let (seen, dst) = (key_columns(task, first / task.group, (first + n - 1) / task.group), output_rows(task, out, out_stride, first, n));
        for r in 0..n {
            for d in body..vd {
                let mut acc = 0f32;
                for j in seen.clone() {
                    acc = probs[(first + r) * width + j].mul_add(value_element(task, pages, used, j, d), acc);
                }
                *dst[r].add(d) = acc;
            }
        }
    }
}

/// The value pass over the keys in score columns `chunk`, every row of the task, the head's
/// whole registers.
#[inline(always)]
unsafe fn value_chunk<V: F32Vector, T: KvElement>(
    task: &AttentionTask,
    source: ValueSource<T>,
    probs: &[f32],
    width: usize,
    chunk: Range<usize>,
    out: *mut f32,
    out_stride: usize,
) {
    let (rows, max_rows) = (task.tokens * task.group, value_tile_rows::<V>());
    let body = task.kv.value_dim / V::LANES * V::LANES;
    let mut first_pass = true;
    for first in (0..rows).step_by(max_rows) {
        let n = max_rows.min(rows - first);
        // Keys the block's rows see, together; each row's probabilities are zero outside its own.
        let seen = key_columns(task, first / task.group, (first + n - 1) / task.group);
        let keys = seen.start.max(chunk.start)..seen.end.min(chunk.end);
        if keys.is_empty() {
            continue;
        }
        let block = ValueRows { probs: &probs[first * width..], width, dst: output_rows(task, out, out_stride, first, n), accumulate: keys.start > seen.start };
        for d in (0..body).step_by(VALUE_REGS * V::LANES) {
            // The chunk's first pass reads it from memory; the others find it in L1.
            let prefetch = first_pass && d == 0;
            let regs = VALUE_REGS.min((body - d) / V::LANES);
            macro_rules! block {
                ($(($r:literal, $v:literal))*) => {
                    match (n, regs) {
                        $(($r, $v) => value_block::<V, T, $r, $v>(task, source, &block, keys.clone(), prefetch, d),)*
                        _ => unreachable!(),
                    }
                };
            }
            block!((1, 1)(1, 2)(1, 3)(1, 4)(2, 1)(2, 2)(2, 3)(2, 4)(3, 1)(3, 2)(3, 3)(3, 4)(4, 1)(4, 2)(4, 3)(4, 4));
        }
        first_pass = false;
    }
}

/// Copies the first `dims` elements of the latent values of the keys in score columns `columns`
/// (the first rows of their transposed keys) into `rows` as f32 value rows, `value_dim` apart,
/// the first at column `first_column`. The copy is exact (bfloat16 and int8 widen losslessly;
/// int8 scales are already in the probabilities), so the sums match the portable twin's.
#[inline(always)]
unsafe fn widen_latent_values<V: F32Vector, E: KvElement>(
    task: &AttentionTask,
    pages: &Pages<E>,
    columns: Range<usize>,
    first_column: usize,
    dims: usize,
    rows: &mut [f32],
) {
    let kv = task.kv;
    let (ps, vd) = (kv.page_size, kv.value_dim);
    let used = &task.pages[task.used_pages()];
    let ahead = pages_ahead::<E>(task, vd);
    for p in columns.start / ps..columns.end.div_ceil(ps) {
        if let Some(&later) = used.get(p + ahead) {
            prefetch_page::<V, E>(task, later, pages.keys.add(kv.key_offset(later, task.kv_head)), ps * vd, pages.key_scales);
        }
        let keys = pages.keys.add(kv.key_offset(used[p], task.kv_head));
        // Key by key, so each row is written in order; the page's reads stay in L1.
        for column in columns.start.max(p * ps)..columns.end.min((p + 1) * ps) {
            let (key, row) = (keys.add(column - p * ps), &mut rows[(column - first_column) * vd..][..dims]);
            for (d, x) in row.iter_mut().enumerate() {
                *x = (*key.add(d * ps)).to_f32();
            }
        }
    }
}

/// Element `d` of the value of the key in score column `j`, `used` the task's used pages.
#[inline(always)]
unsafe fn value_element<E: KvElement>(task: &AttentionTask, pages: &Pages<E>, used: &[u32], j: usize, d: usize) -> f32 {
    let ps = task.kv.page_size;
    let (start, step) = task.kv.value_row(used[j / ps], task.kv_head, j % ps);
    (*pages.values.add(start + d * step)).to_f32()
}

/// Where the value pass reads a used page's value rows, `[page_size][value_dim]`.
#[derive(Clone, Copy)]
enum ValueSource<T> {
    /// The task's value pages, and their scales (for prefetching).
    Pages { values: *const T, scales: *const f32 },
    /// Latent values widened into scratch ([`widen_latent_values`]): used page `first_page`'s
    /// rows first, the next pages' after them.
    Widened { rows: *const T, first_page: usize },
}

impl<T> ValueSource<T> {
    /// The value rows of used page `page_index`.
    #[inline(always)]
    unsafe fn page(self, task: &AttentionTask, used: &[u32], page_index: usize) -> *const T {
        match self {
            ValueSource::Pages { values, .. } => values.add(task.kv.value_offset(used[page_index], task.kv_head)),
            ValueSource::Widened { rows, first_page } => rows.add((page_index - first_page) * task.kv.page_size * task.kv.value_dim),
        }
    }
}

/// A block of output rows of the value pass: row `r`'s probabilities at `probs[r * width..]`,
/// its output at `dst[r]`, which holds the sum over earlier keys when `accumulate`.
#[derive(Clone, Copy)]
struct ValueRows<'a> {
    probs: &'a [f32],
    width: usize,
    dst: [*mut f32; 4],
    accumulate: bool,
}

/// `R` output rows, registers `d..d + NV * LANES` of the head: `sum_j probs[r][j] * V[j]` over
/// the score columns `keys`, added to what the rows hold when `rows.accumulate` (the sum goes on
/// in key order either way, so chunking changes no bit). With `prefetch`, the value pages ahead
/// are prefetched.
// The accumulator tile is indexed in lockstep with the value registers and output rows.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn value_block<V: F32Vector, T: KvElement, const R: usize, const NV: usize>(
    task: &AttentionTask,
    source: ValueSource<T>,
    rows: &ValueRows,
    keys: std::ops::Range<usize>,
    prefetch: bool,
    d: usize,
) {
    let ValueRows { probs, width, dst, accumulate } = *rows;
    let (ps, vd, ahead) = (task.kv.page_size, task.kv.value_dim, pages_ahead::<T>(task, task.kv.value_dim));
    let used = &task.pages[task.used_pages()];
    let mut acc = [[V::zero(); NV]; R];
    if accumulate {
        for r in 0..R {
            for i in 0..NV {
                acc[r][i] = V::load(dst[r].add(d + i * V::LANES));
            }
        }
    }
    // Page by page, so a key's value row is a step from the last, not a page-table look-up.
    for page_index in keys.start / ps..keys.end.div_ceil(ps) {
        if let (true, ValueSource::Pages { values, scales }, Some(&later)) = (prefetch, source, used.get(page_index + ahead)) {
            prefetch_page::<V, T>(task, later, values.add(task.kv.value_offset(later, task.kv_head)), ps * vd, scales);
        }
        let first = page_index * ps;
        let page_values = source.page(task, used, page_index).add(d);
        for slot in keys.start.max(first) - first..ps.min(keys.end - first) {
            let v = page_values.add(slot * vd);
            let vj: [V; NV] = std::array::from_fn(|i| T::load::<V>(v.add(i * V::LANES)));
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
