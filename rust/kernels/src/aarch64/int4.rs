//! W4A8 GEMMs on aarch64 (layout and epilogue in [`crate::int4`]). A chunk's quarter (16
//! bytes) holds 4 outputs x 4 inputs in its low nibbles and 4 x 4 more in its high ones.
//!
//! - `i8mm`: `SMMLA` multiplies 2 rows x 8 inputs of activations by 2 outputs x 8 inputs of
//!   weights into a 2 x 2 tile. Chunks 0 and 1's quarters zipped by 32-bit lanes hold each
//!   output pair's inputs 0..8 (low nibbles) and 16..24 (high), chunks 2 and 3's the rest: the
//!   packed layout stays the one x86_64 shares, for 4 `ZIP`s per quarter and block, which
//!   all the tile's rows share. Tiles of up to 8 rows in pairs (an odd count pairs its last row
//!   with itself) run quarter by quarter of the panel ([`tile_smmla`]); a single row takes the
//!   `dotprod` tile, as half of each `SMMLA` would be wasted on it.
//! - `dotprod`: `SDOT` by element multiplies a quarter's 4 x 4 by one group of 4 activations
//!   (a lane of the block's two activation registers): 8 per quarter and block. Tiles of up to
//!   4 rows by one panel.
//! - `neon`: widening multiplies with the group replicated to every output, pairwise adds.
//!
//! The quants (0..=15) are valid signed bytes, so every path multiplies signed by signed;
//! MXFP4's codes become their levels (0..=24, valid signed bytes too) by one `TBL` of the
//! nibbles, and its e8m0 scales f32 by widenings and a shift ([`e8m0_half`]). Each
//! block's sums go through the scheme's float steps: results match the portable twin bit for
//! bit. Long rows run in chunks of [`CHUNK_BLOCKS`] blocks, as on x86_64. f16 scales widen with
//! `FCVTL` (base ARMv8, but Rust's intrinsic wants the f16 type).

use super::int8::smmla;
use crate::int4::{BlockTile, Int4Offset, Int4Weights, QuantizedBlocks, E2M1_LEVELS, E8M0_SMALLEST_BITS, NIBBLE_BYTES};
use crate::packed::PANEL;
use crate::portable::gemm::for_each_tile_in_chunks;
use std::arch::aarch64::*;
use std::arch::asm;
use std::mem::MaybeUninit;
use std::ops::Range;

pub(super) type Tile<'a, W> = BlockTile<'a, W>;

/// Blocks of the inner dimension a tile runs before the next row tile takes the same weights
/// (see [`for_each_tile_in_chunks`]): 16 blocks of a panel are 4.5 KiB of 4-bit weights (9 KiB
/// of 8-bit ones), which stay in L1 while the row tiles, and the SMMLA tile's four quarter
/// passes, read them again. Also the size of the SMMLA tile's stack of paired activations.
/// (x86_64 runs rows of up to 32 blocks whole; it has no such stack to bound.)
pub(super) const CHUNK_BLOCKS: usize = 16;

impl<W> Tile<'_, W> {
    /// Tile row `r`'s outputs `4q..4q + 4` of the panel: where they start, and how many exist.
    #[inline(always)]
    fn quarter_columns(&self, r: usize, q: usize, n: usize) -> (*mut f32, usize) {
        let first = self.panel * PANEL + 4 * q;
        (self.out.wrapping_add((self.row + r) * self.ldo + first), n.saturating_sub(first).min(4))
    }

    /// The sums tile row `r`'s quarter `q` starts a chunk of blocks from: zero on the first
    /// chunk, else what the previous chunk stored (an f32 stored and reloaded is exact).
    #[inline(always)]
    pub unsafe fn load_quarter(&self, r: usize, q: usize, n: usize, first_chunk: bool) -> float32x4_t {
        let (src, valid) = self.quarter_columns(r, q, n);
        if first_chunk {
            return vdupq_n_f32(0.0);
        }
        if valid == 4 {
            return vld1q_f32(src);
        }
        let mut values = [0f32; 4];
        std::ptr::copy_nonoverlapping(src, values.as_mut_ptr(), valid);
        vld1q_f32(values.as_ptr())
    }

    /// Stores tile row `r`'s quarter `q`, its valid columns.
    #[inline(always)]
    pub unsafe fn store_quarter(&self, r: usize, q: usize, n: usize, sums: float32x4_t) {
        let (dst, valid) = self.quarter_columns(r, q, n);
        if valid == 4 {
            return vst1q_f32(dst, sums);
        }
        let mut values = [0f32; 4];
        vst1q_f32(values.as_mut_ptr(), sums);
        std::ptr::copy_nonoverlapping(values.as_ptr(), dst, valid);
    }

    /// Tile row `r`'s 16 sums to start a chunk from (see [`Self::load_quarter`]).
    #[inline(always)]
    pub unsafe fn load_panel(&self, r: usize, n: usize, first_chunk: bool) -> [float32x4_t; 4] {
        std::array::from_fn(|q| self.load_quarter(r, q, n, first_chunk))
    }

    /// Stores tile row `r`'s 16 sums, the panel's valid columns.
    #[inline(always)]
    pub unsafe fn store_panel(&self, r: usize, n: usize, sums: &[float32x4_t; 4]) {
        for (q, s) in sums.iter().enumerate() {
            self.store_quarter(r, q, n, *s);
        }
    }
}

/// Four f16 as f32.
#[inline(always)]
unsafe fn widen(h: uint16x4_t) -> float32x4_t {
    let mut out: float32x4_t;
    asm!("fcvtl {out:v}.4s, {h:v}.4h", out = lateout(vreg) out, h = in(vreg) h, options(pure, nomem, nostack, preserves_flags));
    out
}

/// Four f16 at `p` as f32.
#[inline(always)]
pub(super) unsafe fn halves(p: *const u8) -> float32x4_t {
    widen(vreinterpret_u16_u8(vld1_u8(p)))
}

/// Two f16 at `p` (of outputs `o`, `o + 1`) as f32 in the lanes of an `SMMLA` tile: both, twice.
#[inline(always)]
pub(super) unsafe fn pair_halves(p: *const u8) -> float32x4_t {
    widen(vreinterpret_u16_u32(vdup_n_u32(p.cast::<u32>().read_unaligned())))
}

/// [`crate::int4::e8m0_half`] of e8m0 bytes, in the low 4 bytes of `e`.
#[inline(always)]
unsafe fn e8m0_half(e: uint8x8_t) -> float32x4_t {
    let bits = vshlq_n_u32::<23>(vmovl_u16(vget_low_u16(vmovl_u8(e))));
    vmulq_n_f32(vreinterpretq_f32_u32(vmaxq_u32(bits, vdupq_n_u32(E8M0_SMALLEST_BITS))), 0.5)
}

/// [`e8m0_half`] of the 4 e8m0 bytes at `p`.
#[inline(always)]
unsafe fn exponents(p: *const u8) -> float32x4_t {
    e8m0_half(vreinterpret_u8_u32(vdup_n_u32(p.cast::<u32>().read_unaligned())))
}

/// [`e8m0_half`] of the 2 e8m0 bytes at `p` (of outputs `o`, `o + 1`) in the lanes of an
/// `SMMLA` tile, as [`pair_halves`].
#[inline(always)]
unsafe fn pair_exponents(p: *const u8) -> float32x4_t {
    e8m0_half(vreinterpret_u8_u16(vdup_n_u16(p.cast::<u16>().read_unaligned())))
}

/// Quarter `q` of a record's first `CHUNKS` chunks, as stored.
#[inline(always)]
pub(super) unsafe fn chunk_quarters<const CHUNKS: usize>(rec: *const u8, q: usize) -> [uint8x16_t; CHUNKS] {
    std::array::from_fn(|c| vld1q_u8(rec.add(64 * c + 16 * q)))
}

/// Low nibbles, then high ones, as the levels the dot products take with the weights' offset
/// `OFFSET` ([`Int4Offset::id`]): MXFP4's codes looked up by `TBL`, other quants as they are.
#[inline(always)]
unsafe fn nibbles<const OFFSET: u8>(v: uint8x16_t) -> [int8x16_t; 2] {
    let levels = |quants: uint8x16_t| {
        if OFFSET == Int4Offset::Mxfp4.id() {
            vreinterpretq_s8_u8(vqtbl1q_u8(vld1q_u8(E2M1_LEVELS.as_ptr()), quants))
        } else {
            vreinterpretq_s8_u8(quants)
        }
    };
    [levels(vandq_u8(v, vdupq_n_u8(0x0f))), levels(vshrq_n_u8::<4>(v))]
}

/// The quarter `q` (outputs 4q..4q + 4) of a record for `SDOT`: groups 0..4 (the chunks' low
/// nibbles) then 4..8 (their high ones).
#[inline(always)]
unsafe fn quarter<const OFFSET: u8>(rec: *const u8, q: usize) -> [int8x16_t; 8] {
    let chunks = chunk_quarters::<4>(rec, q).map(|c| nibbles::<OFFSET>(c));
    std::array::from_fn(|g| chunks[g % 4][g / 4])
}

/// A quarter's weights as `SMMLA`'s second operand: per output pair (4q and 4q + 1, 4q + 2 and
/// 4q + 3), per 8 inputs (0..8, 8..16, 16..24, 24..32), the pair's 8 weights each.
pub(super) type PairedQuarter = [[int8x16_t; 4]; 2];

/// Two registers of 4 outputs x 4 inputs (`first`: inputs i..i + 4, `second`: the next 4) as
/// 2 output pairs x 8 inputs, by zipping their 32-bit lanes.
#[inline(always)]
pub(super) unsafe fn pair_outputs(first: uint8x16_t, second: uint8x16_t) -> [uint8x16_t; 2] {
    let (a, b) = (vreinterpretq_u32_u8(first), vreinterpretq_u32_u8(second));
    [vreinterpretq_u8_u32(vzip1q_u32(a, b)), vreinterpretq_u8_u32(vzip2q_u32(a, b))]
}

/// The quarter `q` of a record for `SMMLA`: zipped before the nibbles split, chunks 0 and 1
/// give inputs 0..8 and 16..24, chunks 2 and 3 inputs 8..16 and 24..32.
#[inline(always)]
unsafe fn paired_quarter<const OFFSET: u8>(rec: *const u8, q: usize) -> PairedQuarter {
    let [c0, c1, c2, c3] = chunk_quarters::<4>(rec, q);
    let (front, back) = (pair_outputs(c0, c1), pair_outputs(c2, c3));
    std::array::from_fn(|pair| {
        let ([first, third], [second, fourth]) = (nibbles::<OFFSET>(front[pair]), nibbles::<OFFSET>(back[pair]));
        [first, second, third, fourth]
    })
}

/// Scales and minimums of the outputs from `first` on, with the weights' offset `OFFSET`
/// ([`Int4Offset::id`]): f16 halves by `halves` ([`halves`] or [`pair_halves`]), e8m0 bytes by
/// `exponents` ([`exponents`] or [`pair_exponents`]), the fixed offsets' minimums `-offset d`.
#[inline(always)]
unsafe fn scale_min<const OFFSET: u8>(
    rec: *const u8,
    first: usize,
    halves: impl Fn(*const u8) -> float32x4_t,
    exponents: impl Fn(*const u8) -> float32x4_t,
) -> (float32x4_t, float32x4_t) {
    let scales = rec.add(NIBBLE_BYTES);
    if OFFSET == Int4Offset::Mxfp4.id() {
        let d = exponents(scales.add(first));
        (d, vmulq_n_f32(d, -12.0))
    } else if OFFSET == Int4Offset::Min.id() {
        (halves(scales.add(2 * first)), halves(scales.add(2 * PANEL + 2 * first)))
    } else {
        let d = halves(scales.add(2 * first));
        (d, vmulq_n_f32(d, -8.0))
    }
}

/// [`crate::int4::accumulate_block`] on 4 outputs, with `dx` and `tx` broadcast.
#[inline(always)]
unsafe fn accumulate_block(acc: float32x4_t, s: int32x4_t, (d, m): (float32x4_t, float32x4_t), dx: float32x4_t, tx: float32x4_t) -> float32x4_t {
    vfmaq_f32(vfmaq_f32(acc, vcvtq_f32_s32(s), vmulq_f32(d, dx)), m, tx)
}

/// The sums of a quarter's 4 outputs (`w`: groups 0..8 of 4 inputs) over each half block of
/// `x`: `SDOT` by element (`DOT`) in two chains, or widening multiplies.
#[inline(always)]
pub(super) unsafe fn half_sums<const DOT: bool>(x: *const i8, w: &[int8x16_t; 8]) -> [int32x4_t; 2] {
    if !DOT {
        return [widening_groups(x, &w[..4], 0), widening_groups(x, &w[4..], 4)];
    }
    let (low, high) = (vld1q_s8(x), vld1q_s8(x.add(16)));
    let mut first = sdot_lane!(vdupq_n_s32(0), w[0], low, 0);
    let mut second = sdot_lane!(vdupq_n_s32(0), w[4], high, 0);
    first = sdot_lane!(first, w[1], low, 1);
    second = sdot_lane!(second, w[5], high, 1);
    first = sdot_lane!(first, w[2], low, 2);
    second = sdot_lane!(second, w[6], high, 2);
    first = sdot_lane!(first, w[3], low, 3);
    second = sdot_lane!(second, w[7], high, 3);
    [first, second]
}

/// The sums of 4 outputs over `w.len()` groups of 4 inputs, activations from group `first`,
/// by widening multiplies: per group, its 4 activations under each of the 4 outputs; products
/// pairwise into (output, half) lanes, outputs 0-1 from the low half, 2-3 from the high one.
#[inline(always)]
unsafe fn widening_groups(x: *const i8, w: &[int8x16_t], first: usize) -> int32x4_t {
    let (mut front, mut back) = (vdupq_n_s32(0), vdupq_n_s32(0));
    for (g, wg) in w.iter().enumerate() {
        let xg = vreinterpretq_s8_s32(vdupq_n_s32((x.add(4 * (first + g)) as *const i32).read_unaligned()));
        front = vpadalq_s16(front, vmull_s8(vget_low_s8(*wg), vget_low_s8(xg)));
        back = vpadalq_s16(back, vmull_high_s8(*wg, xg));
    }
    vpaddq_s32(front, back)
}

/// `R` rows by one panel over `blocks`, the sums of each quarter by `SDOT` (`DOT`) or widening
/// multiplies, through the float steps of the weights' offset `OFFSET`; stores the panel's
/// valid columns.
#[inline(always)]
unsafe fn tile<const R: usize, const DOT: bool, const OFFSET: u8>(t: &Tile<Int4Weights>, blocks: Range<usize>) {
    let mut acc: [[float32x4_t; 4]; R] = std::array::from_fn(|r| t.load_panel(r, t.w.n, blocks.start == 0));
    for b in blocks {
        let rec = t.w.record(t.panel, b);
        for q in 0..4 {
            let w = quarter::<OFFSET>(rec, q);
            let dm = scale_min::<OFFSET>(rec, 4 * q, |p| halves(p), |p| exponents(p));
            for (r, acc) in acc.iter_mut().enumerate() {
                let (x, dx, tx) = t.x.block_scales(t.row + r, b);
                let [first, second] = half_sums::<DOT>(x, &w);
                acc[q] = accumulate_block(acc[q], vaddq_s32(first, second), dm, vdupq_n_f32(*dx), vdupq_n_f32(*tx));
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        t.store_panel(r, t.w.n, acc);
    }
}

/// A row pair's block as the `SMMLA` tile reads it: the quants, per 8 inputs the first row's
/// then the second's (`SMMLA`'s first operand), and the rows' scales and scaled sums in the
/// lanes of a 2 x 2 tile (the first row's twice, then the second's).
pub(super) struct PairedBlock {
    pub quants: [int8x16_t; 4],
    pub dx: float32x4_t,
    pub tx: float32x4_t,
}

#[inline(always)]
unsafe fn paired_block(x: &QuantizedBlocks, rows: [usize; 2], b: usize) -> PairedBlock {
    let [(q0, dx0, tx0), (q1, dx1, tx1)] = rows.map(|r| x.block_scales(r, b));
    let load = |q: *const i8| [vld1q_s64(q.cast()), vld1q_s64(q.add(16).cast())];
    let (first, second) = (load(q0), load(q1));
    let quants = std::array::from_fn(|g| {
        let (a, b) = (first[g / 2], second[g / 2]);
        vreinterpretq_s8_s64(if g % 2 == 0 { vzip1q_s64(a, b) } else { vzip2q_s64(a, b) })
    });
    let lanes = |first: *const f32, second: *const f32| vcombine_f32(vld1_dup_f32(first), vld1_dup_f32(second));
    PairedBlock { quants, dx: lanes(dx0, dx1), tx: lanes(tx0, tx1) }
}

/// Rows 2p and 2p + 1 by a quarter's output pairs: the 2 x 2 tiles of sums over the 8-input
/// `groups` (lanes: first row's two outputs, then the second row's), one `SMMLA` per output
/// pair and group.
#[inline(always)]
pub(super) unsafe fn pair_sums(x: &PairedBlock, w: &PairedQuarter, groups: Range<usize>) -> [int32x4_t; 2] {
    let mut tiles = [vdupq_n_s32(0); 2];
    for (tile, pair) in tiles.iter_mut().zip(w) {
        for g in groups.clone() {
            *tile = smmla(*tile, x.quants[g], pair[g]);
        }
    }
    tiles
}

/// Two rows' 4 outputs as the quarter's two 2 x 2 tiles, or the tiles as the rows: the same
/// zips of 64-bit halves.
#[inline(always)]
unsafe fn swap_pairs(a: float32x4_t, b: float32x4_t) -> [float32x4_t; 2] {
    let (a, b) = (vreinterpretq_f64_f32(a), vreinterpretq_f64_f32(b));
    [vreinterpretq_f32_f64(vzip1q_f64(a, b)), vreinterpretq_f32_f64(vzip2q_f64(a, b))]
}

/// The `SMMLA` tile: `rows` rows (`2P - 1` or `2P`; an odd count pairs its last row with
/// itself and drops the copy) by the tile's panel over `blocks`, quarter by quarter of the
/// panel: only a quarter's sums (a register per row) stay live, so 8 rows fit beside a
/// quarter's operands. The sums stay in `SMMLA`'s 2 x 2 tiles while the blocks run (the
/// scales come in the same lanes), rows only when loaded and stored. The rows' activations
/// are paired once per tile onto the stack and read by every quarter. `weights(panel, b, q)`
/// reads block `b`'s quarter `q`; `accumulate(weights, pair, sums)` adds a row pair's block
/// to the pair's two tiles of sums.
#[inline(always)]
pub(super) unsafe fn tile_smmla<const P: usize, W, Q>(
    t: &Tile<W>,
    n: usize,
    rows: usize,
    blocks: Range<usize>,
    weights: impl Fn(usize, usize, usize) -> Q,
    accumulate: impl Fn(&Q, &PairedBlock, &mut [float32x4_t; 2]),
) {
    assert!(blocks.len() <= CHUNK_BLOCKS && rows.div_ceil(2) == P);
    let mut stack = MaybeUninit::<[[PairedBlock; CHUNK_BLOCKS]; P]>::uninit();
    let paired = stack.as_mut_ptr().cast::<PairedBlock>();
    for p in 0..P {
        let pair = [t.row + 2 * p, t.row + (2 * p + 1).min(rows - 1)];
        for (j, b) in blocks.clone().enumerate() {
            paired.add(p * CHUNK_BLOCKS + j).write(paired_block(t.x, pair, b));
        }
    }
    let first_chunk = blocks.start == 0;
    // Quarters past the panel's last output hold zeros: skipped.
    for q in 0..(n - t.panel * PANEL).min(PANEL).div_ceil(4) {
        let row = |r: usize| if r < rows { t.load_quarter(r, q, n, first_chunk) } else { vdupq_n_f32(0.0) };
        let mut sums: [[float32x4_t; 2]; P] = std::array::from_fn(|p| swap_pairs(row(2 * p), row(2 * p + 1)));
        for (j, b) in blocks.clone().enumerate() {
            let w = weights(t.panel, b, q);
            for (p, s) in sums.iter_mut().enumerate() {
                accumulate(&w, &*paired.add(p * CHUNK_BLOCKS + j), s);
            }
        }
        for (p, s) in sums.iter().enumerate() {
            for (i, s) in swap_pairs(s[0], s[1]).iter().enumerate().filter(|(i, _)| 2 * p + i < rows) {
                t.store_quarter(2 * p + i, q, n, *s);
            }
        }
    }
}

#[target_feature(enable = "dotprod,i8mm")]
unsafe fn gemm_i8mm<const OFFSET: u8>(x: &QuantizedBlocks, w: &Int4Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    let weights = |panel: usize, b: usize, q: usize| {
        let rec = w.record(panel, b);
        let dm: [_; 2] = std::array::from_fn(|pair| scale_min::<OFFSET>(rec, 4 * q + 2 * pair, |p| pair_halves(p), |p| pair_exponents(p)));
        (paired_quarter::<OFFSET>(rec, q), dm)
    };
    let accumulate = |(w, dm): &(PairedQuarter, [(float32x4_t, float32x4_t); 2]), x: &PairedBlock, sums: &mut [float32x4_t; 2]| {
        for ((sums, s), dm) in sums.iter_mut().zip(pair_sums(x, w, 0..4)).zip(dm) {
            *sums = accumulate_block(*sums, s, *dm, x.dx, x.tx);
        }
    };
    for_each_tile_in_chunks(x.m, panels, 8, 1, w.blocks(), CHUNK_BLOCKS, |row, rows, panel, _, blocks| {
        let t = Tile { x, w, row, panel, out, ldo };
        if rows == 1 {
            tile::<1, true, OFFSET>(&t, blocks)
        } else {
            by_rows!(rows.div_ceil(2), tile_smmla::<_, _>, (&t, w.n, rows, blocks, &weights, &accumulate), [1 2 3 4])
        }
    });
}

#[target_feature(enable = "dotprod")]
unsafe fn gemm_dotprod<const OFFSET: u8>(x: &QuantizedBlocks, w: &Int4Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    for_each_tile_in_chunks(
        x.m,
        panels,
        4,
        1,
        w.blocks(),
        CHUNK_BLOCKS,
        |row, rows, panel, _, blocks| by_rows!(rows, tile::<true, OFFSET>, (&Tile { x, w, row, panel, out, ldo }, blocks), [1 2 3 4]),
    );
}

#[target_feature(enable = "neon")]
unsafe fn gemm_neon<const OFFSET: u8>(x: &QuantizedBlocks, w: &Int4Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    for_each_tile_in_chunks(
        x.m,
        panels,
        2,
        1,
        w.blocks(),
        CHUNK_BLOCKS,
        |row, rows, panel, _, blocks| by_rows!(rows, tile::<false, OFFSET>, (&Tile { x, w, row, panel, out, ldo }, blocks), [1 2]),
    );
}

/// # Safety
/// As [`crate::portable::int4::gemm_q4`]; only handed out after detecting i8mm and dotprod.
pub unsafe fn gemm_q4_i8mm(x: &QuantizedBlocks, w: &Int4Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    match w.offset {
        Int4Offset::Eight => gemm_i8mm::<{ Int4Offset::Eight.id() }>(x, w, panels, out, ldo),
        Int4Offset::Min => gemm_i8mm::<{ Int4Offset::Min.id() }>(x, w, panels, out, ldo),
        Int4Offset::Mxfp4 => gemm_i8mm::<{ Int4Offset::Mxfp4.id() }>(x, w, panels, out, ldo),
    }
}

/// # Safety
/// As above, after detecting dotprod.
pub unsafe fn gemm_q4_dotprod(x: &QuantizedBlocks, w: &Int4Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    match w.offset {
        Int4Offset::Eight => gemm_dotprod::<{ Int4Offset::Eight.id() }>(x, w, panels, out, ldo),
        Int4Offset::Min => gemm_dotprod::<{ Int4Offset::Min.id() }>(x, w, panels, out, ldo),
        Int4Offset::Mxfp4 => gemm_dotprod::<{ Int4Offset::Mxfp4.id() }>(x, w, panels, out, ldo),
    }
}

/// # Safety
/// As above, after detecting neon.
pub unsafe fn gemm_q4_neon(x: &QuantizedBlocks, w: &Int4Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    match w.offset {
        Int4Offset::Eight => gemm_neon::<{ Int4Offset::Eight.id() }>(x, w, panels, out, ldo),
        Int4Offset::Min => gemm_neon::<{ Int4Offset::Min.id() }>(x, w, panels, out, ldo),
        Int4Offset::Mxfp4 => gemm_neon::<{ Int4Offset::Mxfp4.id() }>(x, w, panels, out, ldo),
    }
}
