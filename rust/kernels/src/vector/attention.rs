//! Paged attention over [`F32Vector`], for decode and extend alike (see [`AttentionTask`]), a
//! key block at a time ([`crate::paged`]):
//!
//! 1. Scores of the block's keys: up to 8 query rows (4 on AVX2) at once multiply two registers
//!    of transposed keys one dimension at a time, so each key vector loaded serves every row of
//!    the group and block, and a decode's few rows still keep two FMA chains each in flight.
//! 2. Per row, over exactly its own keys in the block (its window, up to its position): the soft
//!    cap, if any, then the softmax, its max and sum kept in the row's [`Partial`]; every other
//!    key's probability is zero.
//! 3. Values: up to 4 rows by up to 4 registers of the head, summed key by key into the rows'
//!    partials. Latent pages' values (the first `value_dim` elements of each transposed key) are
//!    first widened into value rows in scratch, a chunk of keys at a time, so the same tiles sum
//!    them: one copy per element serves the whole group (16 to 128 query heads in MLA decode).
//! 4. The block's partials merge into each row's running one ([`Partial::merge`]); after the
//!    last block, [`Partial::finish`] writes it out (scaled down by a sink's share, if any).
//!
//! Int8 pages are widened in registers: a key's scale multiplies its score (it factors out of
//! the sum over dimensions) and a value's scale its exponential, so no page is dequantized.
//!
//! Score columns count keys from the first one of the block's first used page: pages wholly
//! before every row's window are never scored, read or prefetched, so a windowed layer costs its
//! window, not the context.
//!
//! Each row's arithmetic is the same whatever rows share its task, so a query gets the same bits
//! alone, in a decode batch or in a prefill chunk, and split over threads by blocks.

use super::elementwise::{exp_shifted, max_of, scale, softcap};
use super::F32Vector;
use crate::packed::bf16_to_f32;
use crate::paged::{AttentionTask, KvSlice, Partial};
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
    /// A key block's scores and exponentials, `[row][key]`, reused across calls on this thread.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// Each row's merged partial, then the block's, `[row][Partial]`.
    static PARTIALS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
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

/// What a call computes: the task's outputs, or the partials of some of its key blocks.
pub enum Job<'a> {
    /// Every key block, merged and normalized into rows of `out`.
    Whole { out: *mut f32, out_stride: usize },
    /// The partials of key blocks `blocks`, as [`crate::portable::attention::attention_partials`]
    /// lays them out.
    Partials { blocks: Range<usize>, partials: &'a mut [f32] },
}

#[inline(always)]
pub unsafe fn attention<V: F32Vector>(task: &AttentionTask, job: Job) {
    task.validate();
    let unscaled = std::ptr::null();
    match (task.kv.keys, task.kv.value_storage()) {
        (KvSlice::F32(k), KvSlice::F32(v)) => {
            let pages = Pages { keys: k.as_ptr(), values: v.as_ptr(), key_scales: unscaled, value_scales: unscaled };
            attention_over::<V, f32>(task, pages, job)
        }
        (KvSlice::Bf16(k), KvSlice::Bf16(v)) => {
            let pages = Pages { keys: k.as_ptr(), values: v.as_ptr(), key_scales: unscaled, value_scales: unscaled };
            attention_over::<V, u16>(task, pages, job)
        }
        (KvSlice::Int8 { data: k, scales: ks }, KvSlice::Int8 { data: v, scales: vs }) => {
            let pages = Pages { keys: k.as_ptr(), values: v.as_ptr(), key_scales: ks.as_ptr(), value_scales: vs.as_ptr() };
            attention_over::<V, i8>(task, pages, job)
        }
        _ => panic!("attention: keys and values are stored in different types"),
    }
}

#[inline(always)]
unsafe fn attention_over<V: F32Vector, E: KvElement>(task: &AttentionTask, kv: Pages<E>, job: Job) {
    let (rows, len) = (task.tokens * task.group, Partial::len(task.kv.value_dim));
    // Taken out of the thread-locals rather than used in a closure: a closure would not inherit
    // the caller's target features, and the intrinsics inlined into it would become calls.
    let mut probs = SCRATCH.take();
    match job {
        Job::Whole { out, out_stride } => {
            let mut partials = PARTIALS.take();
            partials.resize(2 * rows * len, 0.0);
            let (state, part) = partials.split_at_mut(rows * len);
            state.chunks_exact_mut(len).for_each(Partial::clear);
            for b in task.key_blocks() {
                block_partials::<V, E>(task, &kv, Block::new(task, b), &mut probs, part);
                for (state, part) in state.chunks_exact_mut(len).zip(part.chunks_exact(len)) {
                    Partial::merge(state, part);
                }
            }
            for (r, state) in state.chunks_exact(len).enumerate() {
                let o = out.add((r / task.group) * out_stride + (r % task.group) * task.kv.value_dim);
                Partial::finish(state, task.sink(r % task.group), std::slice::from_raw_parts_mut(o, task.kv.value_dim));
            }
            PARTIALS.set(partials);
        }
        Job::Partials { blocks, partials } => {
            let block_len = task.block_partials_len();
            assert!(partials.len() >= blocks.len() * block_len, "attention_partials: too few partials");
            for (i, b) in blocks.enumerate() {
                block_partials::<V, E>(task, &kv, Block::new(task, b), &mut probs, &mut partials[i * block_len..][..block_len]);
            }
        }
    }
    SCRATCH.set(probs);
}

/// The key block a pass reads: `pages` (indexes in the task's page table); score column 0 is the
/// first key of its first page. Prefetches look ahead up to `used_end`, the task's last page.
struct Block {
    pages: Range<usize>,
    used_end: usize,
}

impl Block {
    fn new(task: &AttentionTask, b: usize) -> Block {
        Block { pages: task.block_pages(b), used_end: task.used_pages().end }
    }

    /// The score columns of the keys of this block query tokens `first..=last` see, together
    /// (empty when they see none).
    #[inline(always)]
    fn columns(&self, task: &AttentionTask, first: usize, last: usize) -> Range<usize> {
        let (keys, origin) = (task.keys_within(&self.pages, first, last), self.pages.start * task.kv.page_size);
        keys.start - origin..keys.end - origin
    }

    /// The page `ahead` pages after page `p` of the sequence, if the task uses it.
    #[inline(always)]
    fn page_ahead(&self, task: &AttentionTask, p: usize, ahead: usize) -> Option<u32> {
        (p + ahead < self.used_end).then(|| task.pages[p + ahead])
    }
}

/// Every row's partial over the keys of `block` into `part` (`[row][Partial]`), its scores and
/// exponentials in `probs`.
#[inline(always)]
unsafe fn block_partials<V: F32Vector, E: KvElement>(task: &AttentionTask, kv: &Pages<E>, block: Block, probs: &mut Vec<f32>, part: &mut [f32]) {
    // Whole pages, and whole registers past the last page's end.
    let width = (block.pages.len() * task.kv.page_size).next_multiple_of(V::LANES);
    let (rows, len) = (task.tokens * task.group, Partial::len(task.kv.value_dim));
    probs.clear();
    probs.resize(rows * width, 0.0);
    scores::<V, E>(task, kv, &block, probs, width);
    for (r, (row, partial)) in probs.chunks_exact_mut(width).zip(part.chunks_exact_mut(len)).enumerate() {
        let keys = block.columns(task, r / task.group, r / task.group);
        Partial::clear(partial);
        if keys.is_empty() {
            row.fill(0.0);
            continue;
        }
        if let Some(cap) = task.softcap {
            softcap::<V>(&mut row[keys.clone()], cap);
        }
        let max = max_of::<V>(&row[keys.clone()]);
        let sum = exp_shifted::<V>(&mut row[keys.clone()], max);
        (partial[0], partial[1]) = (max, sum);
        scale::<V>(&mut row[keys.clone()], 1.0 / sum);
        row[..keys.start].fill(0.0);
        row[keys.end..].fill(0.0);
        if E::SCALED {
            scale_by_value_scales::<V, E>(task, kv, &block, row, keys);
        }
    }
    values::<V, E>(task, kv, &block, probs, width, OutRows { first: part.as_mut_ptr().add(2), stride: len });
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

/// Multiplies the exponentials of the keys in `columns` of `row` by their value rows' scales
/// (int8 pages).
#[inline(always)]
unsafe fn scale_by_value_scales<V: F32Vector, E>(task: &AttentionTask, pages: &Pages<E>, block: &Block, row: &mut [f32], columns: Range<usize>) {
    let ps = task.kv.page_size;
    for p in columns.start / ps..columns.end.div_ceil(ps) {
        let on_page = columns.start.max(p * ps)..columns.end.min((p + 1) * ps);
        let first_slot = task.kv.scale_offset(task.pages[block.pages.start + p], task.kv_head) + on_page.start - p * ps;
        let (probs, scales) = (&mut row[on_page], pages.value_scales.add(first_slot));
        let body = probs.len() / V::LANES * V::LANES;
        for i in (0..body).step_by(V::LANES) {
            V::load(probs.as_ptr().add(i)).mul(V::load(scales.add(i))).store(probs.as_mut_ptr().add(i));
        }
        for (i, prob) in probs.iter_mut().enumerate().skip(body) {
            *prob *= *scales.add(i);
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
enum ScorePass<E> {
    Pair([KeyRegister<E>; 2]),
    Single(KeyRegister<E>),
    Narrow(KeyRegister<E>, usize),
}

#[inline(always)]
unsafe fn scores<V: F32Vector, E: KvElement>(task: &AttentionTask, pages: &Pages<E>, block: &Block, probs: &mut [f32], width: usize) {
    let kv = task.kv;
    let ps = kv.page_size;
    let ahead = pages_ahead::<E>(task, kv.head_dim);
    let mut pending = None;
    for p in block.pages.clone() {
        let page = task.pages[p];
        if let Some(later) = block.page_ahead(task, p, ahead) {
            prefetch_page::<V, E>(task, later, pages.keys.add(kv.key_offset(later, task.kv_head)), ps * kv.head_dim, pages.key_scales);
        }
        let base = pages.keys.add(kv.key_offset(page, task.kv_head));
        let scales = if E::SCALED { pages.key_scales.add(kv.scale_offset(page, task.kv_head)) } else { std::ptr::null() };
        for slot in (0..ps).step_by(V::LANES) {
            let register =
                KeyRegister { keys: base.add(slot), scales: if E::SCALED { scales.add(slot) } else { scales }, column: (p - block.pages.start) * ps + slot };
            let lanes = V::LANES.min(ps - slot);
            if lanes < V::LANES {
                score_pass::<V, E>(task, ScorePass::Narrow(register, lanes), probs, width);
            } else if let Some(previous) = pending.take() {
                score_pass::<V, E>(task, ScorePass::Pair([previous, register]), probs, width);
            } else {
                pending = Some(register);
            }
        }
    }
    if let Some(last) = pending {
        score_pass::<V, E>(task, ScorePass::Single(last), probs, width);
    }
}

/// Scores every query row of the task against `pass`'s keys, a block of rows at a time.
#[inline(always)]
unsafe fn score_pass<V: F32Vector, E: KvElement>(task: &AttentionTask, pass: ScorePass<E>, probs: &mut [f32], width: usize) {
    let rows = task.tokens * task.group;
    let max_rows = if V::REGISTERS >= 32 { SCORE_ROWS } else { SCORE_ROWS / 2 };
    for first in (0..rows).step_by(max_rows) {
        let dst = probs.as_mut_ptr().add(first * width);
        macro_rules! rows {
            ($($r:literal)*) => {
                match max_rows.min(rows - first) {
                    $($r => match pass {
                        ScorePass::Pair(registers) => score_registers::<V, E, $r, 2>(task, first, registers, dst, width),
                        ScorePass::Single(register) => score_registers::<V, E, $r, 1>(task, first, [register], dst, width),
                        ScorePass::Narrow(register, lanes) => score_narrow_page::<V, E, $r>(task, first, register, lanes, dst, width),
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

/// Where the value pass writes the task's rows: row `r` at `first + r * stride`.
#[derive(Clone, Copy)]
struct OutRows {
    first: *mut f32,
    stride: usize,
}

impl OutRows {
    /// Rows `first..first + n` (up to 4; the rest repeat the last).
    #[inline(always)]
    unsafe fn tile(self, first: usize, n: usize) -> [*mut f32; 4] {
        std::array::from_fn(|r| self.first.add((first + r.min(n - 1)) * self.stride))
    }
}

#[inline(always)]
unsafe fn values<V: F32Vector, E: KvElement>(task: &AttentionTask, pages: &Pages<E>, block: &Block, probs: &[f32], width: usize, out: OutRows) {
    let (vd, ps, rows) = (task.kv.value_dim, task.kv.page_size, task.tokens * task.group);
    let body = vd / V::LANES * V::LANES;
    let all = block.columns(task, 0, task.tokens - 1);
    // Whole pages per chunk.
    let chunk_for = |bytes_per_key: usize| (VALUE_CHUNK_BYTES / bytes_per_key).max(1).next_multiple_of(ps);
    if task.kv.values.is_some() {
        let source = ValueSource::Pages { values: pages.values, scales: pages.value_scales };
        let chunk = chunk_for(vd * std::mem::size_of::<E>());
        for keys_start in (0..all.end).step_by(chunk) {
            value_chunk::<V, E>(task, block, source, probs, width, keys_start..keys_start + chunk, out);
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
            widen_latent_values::<V, E>(task, pages, block, columns.clone(), keys_start, body, &mut widened);
            let source = ValueSource::Widened { rows: widened.as_ptr(), first_page: block.pages.start + keys_start / ps };
            value_chunk::<V, f32>(task, block, source, probs, width, columns, out);
        }
        LATENT_ROWS.set(widened);
    }
    // Value dimensions past the last whole register.
    let max_rows = value_tile_rows::<V>();
    for first in (0..rows).step_by(max_rows) {
        let n = max_rows.min(rows - first);
        let (seen, dst) = (block.columns(task, first / task.group, (first + n - 1) / task.group), out.tile(first, n));
        for r in 0..n {
            for d in body..vd {
                let mut acc = 0f32;
                for j in seen.clone() {
                    acc = probs[(first + r) * width + j].mul_add(value_element(task, pages, block, j, d), acc);
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
    block: &Block,
    source: ValueSource<T>,
    probs: &[f32],
    width: usize,
    chunk: Range<usize>,
    out: OutRows,
) {
    let (rows, max_rows) = (task.tokens * task.group, value_tile_rows::<V>());
    let body = task.kv.value_dim / V::LANES * V::LANES;
    let mut first_pass = true;
    for first in (0..rows).step_by(max_rows) {
        let n = max_rows.min(rows - first);
        // Keys the tile's rows see, together; each row's exponentials are zero outside its own.
        let seen = block.columns(task, first / task.group, (first + n - 1) / task.group);
        let keys = seen.start.max(chunk.start)..seen.end.min(chunk.end);
        if keys.is_empty() {
            continue;
        }
        let tile = ValueRows { probs: &probs[first * width..], width, dst: out.tile(first, n), accumulate: keys.start > seen.start };
        for d in (0..body).step_by(VALUE_REGS * V::LANES) {
            // The chunk's first pass reads it from memory; the others find it in L1.
            let prefetch = first_pass && d == 0;
            let regs = VALUE_REGS.min((body - d) / V::LANES);
            macro_rules! block {
                ($(($r:literal, $v:literal))*) => {
                    match (n, regs) {
                        $(($r, $v) => value_block::<V, T, $r, $v>(task, block, source, &tile, keys.clone(), prefetch, d),)*
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
    block: &Block,
    columns: Range<usize>,
    first_column: usize,
    dims: usize,
    rows: &mut [f32],
) {
    let kv = task.kv;
    let (ps, vd) = (kv.page_size, kv.value_dim);
    let ahead = pages_ahead::<E>(task, vd);
    for p in columns.start / ps..columns.end.div_ceil(ps) {
        if let Some(later) = block.page_ahead(task, block.pages.start + p, ahead) {
            prefetch_page::<V, E>(task, later, pages.keys.add(kv.key_offset(later, task.kv_head)), ps * vd, pages.key_scales);
        }
        let keys = pages.keys.add(kv.key_offset(task.pages[block.pages.start + p], task.kv_head));
        // Key by key, so each row is written in order; the page's reads stay in L1.
        for column in columns.start.max(p * ps)..columns.end.min((p + 1) * ps) {
            let (key, row) = (keys.add(column - p * ps), &mut rows[(column - first_column) * vd..][..dims]);
            for (d, x) in row.iter_mut().enumerate() {
                *x = (*key.add(d * ps)).to_f32();
            }
        }
    }
}

/// Element `d` of the value of the key in score column `j` of `block`.
#[inline(always)]
unsafe fn value_element<E: KvElement>(task: &AttentionTask, pages: &Pages<E>, block: &Block, j: usize, d: usize) -> f32 {
    let ps = task.kv.page_size;
    let (start, step) = task.kv.value_row(task.pages[block.pages.start + j / ps], task.kv_head, j % ps);
    (*pages.values.add(start + d * step)).to_f32()
}

/// Where the value pass reads a used page's value rows, `[page_size][value_dim]`.
#[derive(Clone, Copy)]
enum ValueSource<T> {
    /// The task's value pages, and their scales (for prefetching).
    Pages { values: *const T, scales: *const f32 },
    /// Latent values widened into scratch ([`widen_latent_values`]): page `first_page`'s rows
    /// (an index in the page table) first, the next pages' after them.
    Widened { rows: *const T, first_page: usize },
}

impl<T> ValueSource<T> {
    /// The value rows of page `page_index` of the page table.
    #[inline(always)]
    unsafe fn page(self, task: &AttentionTask, page_index: usize) -> *const T {
        match self {
            ValueSource::Pages { values, .. } => values.add(task.kv.value_offset(task.pages[page_index], task.kv_head)),
            ValueSource::Widened { rows, first_page } => rows.add((page_index - first_page) * task.kv.page_size * task.kv.value_dim),
        }
    }
}

/// A tile of output rows of the value pass: row `r`'s exponentials at `probs[r * width..]`,
/// its output at `dst[r]`, which holds the sum over earlier keys when `accumulate`.
#[derive(Clone, Copy)]
struct ValueRows<'a> {
    probs: &'a [f32],
    width: usize,
    dst: [*mut f32; 4],
    accumulate: bool,
}

/// `R` output rows, registers `d..d + NV * LANES` of the head: `sum_j probs[r][j] * V[j]` over
/// the score columns `keys` of `block`, added to what the rows hold when `rows.accumulate` (the sum goes on
/// in key order either way, so chunking changes no bit). With `prefetch`, the value pages ahead
/// are prefetched.
// The accumulator tile is indexed in lockstep with the value registers and output rows.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn value_block<V: F32Vector, T: KvElement, const R: usize, const NV: usize>(
    task: &AttentionTask,
    block: &Block,
    source: ValueSource<T>,
    rows: &ValueRows,
    keys: std::ops::Range<usize>,
    prefetch: bool,
    d: usize,
) {
    let ValueRows { probs, width, dst, accumulate } = *rows;
    let (ps, vd, ahead) = (task.kv.page_size, task.kv.value_dim, pages_ahead::<T>(task, task.kv.value_dim));
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
        let in_table = block.pages.start + page_index;
        if let (true, ValueSource::Pages { values, scales }, Some(later)) = (prefetch, source, block.page_ahead(task, in_table, ahead)) {
            prefetch_page::<V, T>(task, later, values.add(task.kv.value_offset(later, task.kv_head)), ps * vd, scales);
        }
        let first = page_index * ps;
        let page_values = source.page(task, in_table).add(d);
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
