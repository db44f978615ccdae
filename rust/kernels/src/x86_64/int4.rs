//! W4A8 GEMMs on x86_64 (layout and epilogue in [`crate::int4`]). The 4-bit quants are
//! unsigned (0..=15) and the activations signed, exactly the operand types of `vpdpbusd` and
//! `vpmaddubsw`: no offset trick is needed, the weights' offset is applied per block in floats.
//! MXFP4's codes become their levels (0..=24, unsigned too) by one `vpshufb` of the nibbles,
//! and its e8m0 scales f32 by a widening and a shift ([`e8m0_half_avx2`]).
//!
//! - AVX-512 VNNI: a chunk's low and high nibbles are two registers of 16 outputs x 4 inputs;
//!   each takes one `vpdpbusd` with the 4 activations broadcast, 8 per block, in two chains.
//!   Tiles of up to 8 rows by one panel; decode takes 1 row by up to 4 panels.
//! - AVX2 (+ FMA, F16C): the same chunks in halves of 8 outputs; `vpmaddubsw` products (at most
//!   2 x 15 x 127 per 16-bit lane, 8 groups summing to under 2^15) add in 16 bits, one
//!   `vpmaddwd` per block widens them (MXFP4's levels, up to 24, widen every 4 groups). Tiles of up to 4 rows by one panel, one half of its
//!   outputs at a time; decode 1 row by 2 panels, both halves.
//!
//! Each block's sums go through the scheme's float steps, so results match the portable twin
//! bit for bit. Tiles are compiled apart for each [`Int4Offset`], so no branch sits in the loops.

use crate::int4::{BlockTile, Int4Offset, Int4Weights, QuantizedBlocks, E2M1_LEVELS, E8M0_SMALLEST_BITS, NIBBLE_BYTES};
use crate::packed::PANEL;
use crate::portable::gemm::{for_each_tile_in_chunks, unroll};
use std::arch::x86_64::*;
use std::ops::Range;

pub(super) type Tile<'a, W> = BlockTile<'a, W>;

impl<W> Tile<'_, W> {
    /// Where tile row `r`'s outputs of panel `p` start.
    #[inline(always)]
    unsafe fn panel_out(&self, r: usize, p: usize) -> *mut f32 {
        self.out.add((self.row + r) * self.ldo + (self.panel + p) * PANEL)
    }

    /// Tile row `r`'s output columns of panel `p`, and how many of them are valid.
    #[inline(always)]
    unsafe fn columns(&self, r: usize, p: usize, n: usize) -> (*mut f32, usize) {
        (self.panel_out(r, p), (n - (self.panel + p) * PANEL).min(PANEL))
    }

    /// The sums tile row `r`, panel `p` starts from: zero on the first chunk of blocks, else
    /// what the previous chunk stored.
    #[inline(always)]
    pub unsafe fn load16(&self, r: usize, p: usize, n: usize, first_chunk: bool) -> __m512 {
        if first_chunk {
            return _mm512_setzero_ps();
        }
        let (dst, valid) = self.columns(r, p, n);
        _mm512_maskz_loadu_ps(((1u32 << valid) - 1) as u16, dst)
    }

    /// Stores 16 outputs of tile row `r`, panel `p` (the panel's valid columns).
    #[inline(always)]
    pub unsafe fn store16(&self, r: usize, p: usize, n: usize, values: __m512) {
        let (dst, valid) = self.columns(r, p, n);
        _mm512_mask_storeu_ps(dst, ((1u32 << valid) - 1) as u16, values);
    }

    /// The mask of the valid columns among outputs `8 * half..8 * half + 8` of panel `p`.
    #[inline(always)]
    pub unsafe fn half_mask(&self, p: usize, half: usize, n: usize) -> __m256i {
        let valid = (n - (self.panel + p) * PANEL).min(PANEL).saturating_sub(8 * half).min(8);
        _mm256_cmpgt_epi32(_mm256_set1_epi32(valid as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
    }

    /// As [`Self::load16`], the 8 outputs of half `half` (`mask` from [`Self::half_mask`]).
    #[inline(always)]
    pub unsafe fn load8(&self, r: usize, p: usize, half: usize, mask: __m256i, first_chunk: bool) -> __m256 {
        if first_chunk {
            return _mm256_setzero_ps();
        }
        _mm256_maskload_ps(self.panel_out(r, p).add(8 * half), mask)
    }

    /// Stores the 8 outputs of half `half` of tile row `r`, panel `p`.
    #[inline(always)]
    pub unsafe fn store8(&self, r: usize, p: usize, half: usize, mask: __m256i, values: __m256) {
        _mm256_maskstore_ps(self.panel_out(r, p).add(8 * half), mask, values);
    }
}

/// Blocks of the inner dimension a tile runs before the next row tile takes the same weights
/// (see [`for_each_tile_in_chunks`]): 16 blocks of a panel are 4.5 KiB of 4-bit weights. A
/// short panel (up to 32 blocks, 1024 inputs) runs whole: it fits beside its rows anyway.
pub(super) fn chunk_blocks(blocks: usize) -> usize {
    if blocks <= 32 {
        blocks
    } else {
        16
    }
}

/// How far ahead of a tile's reads its record's lines are requested: the hardware prefetcher
/// stops at every 4 KiB page, and with block weights a tile computes long enough per line that
/// its one stream per panel never gets ahead (16-sequence decode doubled its time per row
/// over prefill's).
pub(super) const PREFETCH_BYTES: usize = 2048;

/// Requests the lines `PREFETCH_BYTES` past the `bytes` from `rec`.
#[inline(always)]
pub(super) unsafe fn prefetch_ahead(rec: *const u8, bytes: usize) {
    for line in (0..bytes).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(rec.wrapping_add(PREFETCH_BYTES + line).cast());
    }
}

/// The activations' group `g` (inputs 4g..4g + 4) as one 32-bit lane.
#[inline(always)]
pub(super) unsafe fn group(x: *const i8, g: usize) -> i32 {
    (x.add(4 * g) as *const i32).read_unaligned()
}

/// A record's scales and minimums of the outputs from `first` on, with the weights' offset
/// `OFFSET` ([`Int4Offset::id`]): f16 halves widened by `halves`, e8m0 bytes by `exponents`,
/// the minimums of the fixed offsets `times(d, -offset)`.
#[inline(always)]
unsafe fn scale_min<V: Copy, const OFFSET: u8>(
    rec: *const u8,
    first: usize,
    halves: impl Fn(*const u8) -> V,
    exponents: impl Fn(*const u8) -> V,
    times: impl Fn(V, f32) -> V,
) -> (V, V) {
    let scales = rec.add(NIBBLE_BYTES);
    if OFFSET == Int4Offset::Mxfp4.id() {
        let d = exponents(scales.add(first));
        (d, times(d, -12.0))
    } else if OFFSET == Int4Offset::Min.id() {
        (halves(scales.add(2 * first)), halves(scales.add(2 * PANEL + 2 * first)))
    } else {
        let d = halves(scales.add(2 * first));
        (d, times(d, -8.0))
    }
}

/// [`crate::int4::e8m0_half`] of the 8 e8m0 bytes at `at`.
#[inline(always)]
unsafe fn e8m0_half_avx2(at: *const u8) -> __m256 {
    let bits = _mm256_slli_epi32::<23>(_mm256_cvtepu8_epi32(_mm_loadl_epi64(at as *const _)));
    _mm256_mul_ps(_mm256_castsi256_ps(_mm256_max_epi32(bits, _mm256_set1_epi32(E8M0_SMALLEST_BITS as i32))), _mm256_set1_ps(0.5))
}

/// [`crate::int4::e8m0_half`] of the 16 e8m0 bytes at `at`.
#[inline(always)]
unsafe fn e8m0_half_avx512(at: *const u8) -> __m512 {
    let bits = _mm512_slli_epi32::<23>(_mm512_cvtepu8_epi32(_mm_loadu_si128(at as *const _)));
    _mm512_mul_ps(_mm512_castsi512_ps(_mm512_max_epi32(bits, _mm512_set1_epi32(E8M0_SMALLEST_BITS as i32))), _mm512_set1_ps(0.5))
}

/// Quants (one per byte) as the levels the dot products take: MXFP4's codes looked up by
/// `vpshufb` (the table in each 128-bit lane), other quants as they are.
#[inline(always)]
unsafe fn levels_avx2<const OFFSET: u8>(quants: __m256i) -> __m256i {
    if OFFSET != Int4Offset::Mxfp4.id() {
        return quants;
    }
    _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128(E2M1_LEVELS.as_ptr() as *const _)), quants)
}

/// As [`levels_avx2`], 64 quants.
#[inline(always)]
pub(super) unsafe fn levels_avx512<const OFFSET: u8>(quants: __m512i) -> __m512i {
    if OFFSET != Int4Offset::Mxfp4.id() {
        return quants;
    }
    _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128(E2M1_LEVELS.as_ptr() as *const _)), quants)
}

/// A record's scales and minimums of its 16 outputs as AVX-512 vectors.
#[inline(always)]
pub(super) unsafe fn scale_min_avx512<const OFFSET: u8>(rec: *const u8) -> (__m512, __m512) {
    scale_min::<_, OFFSET>(
        rec,
        0,
        |at| _mm512_cvtph_ps(_mm256_loadu_si256(at as *const _)),
        |at| e8m0_half_avx512(at),
        |d, c| _mm512_mul_ps(d, _mm512_set1_ps(c)),
    )
}

/// `R` rows by `NP` panels, the weights' offset `OFFSET` ([`Int4Offset::id`]).
#[inline(always)]
unsafe fn tile_vnni<const R: usize, const NP: usize, const OFFSET: u8>(t: &Tile<Int4Weights>, blocks: Range<usize>) {
    let nibble = _mm512_set1_epi8(0x0f);
    let mut acc: [[__m512; NP]; R] = std::array::from_fn(|r| std::array::from_fn(|p| t.load16(r, p, t.w.n, blocks.start == 0)));
    for b in blocks {
        for p in 0..NP {
            let rec = t.w.record(t.panel + p, b);
            prefetch_ahead(rec, t.w.record_bytes());
            // Groups 0..4 in the low nibbles of the chunks, 4..8 in the high ones.
            let mut w = [_mm512_setzero_si512(); 8];
            for c in 0..4 {
                let v = _mm512_loadu_si512(rec.add(64 * c) as *const _);
                w[c] = levels_avx512::<OFFSET>(_mm512_and_si512(v, nibble));
                w[c + 4] = levels_avx512::<OFFSET>(_mm512_and_si512(_mm512_srli_epi16::<4>(v), nibble));
            }
            let (d, m) = scale_min_avx512::<OFFSET>(rec);
            for (r, acc) in acc.iter_mut().enumerate() {
                let (x, dx, tx) = t.x.block_scales(t.row + r, b);
                let (mut low, mut high) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                for g in 0..4 {
                    low = _mm512_dpbusd_epi32(low, w[g], _mm512_set1_epi32(group(x, g)));
                    high = _mm512_dpbusd_epi32(high, w[g + 4], _mm512_set1_epi32(group(x, g + 4)));
                }
                let s = _mm512_cvtepi32_ps(_mm512_add_epi32(low, high));
                let sum = _mm512_fmadd_ps(s, _mm512_mul_ps(d, _mm512_set1_ps(*dx)), acc[p]);
                acc[p] = _mm512_fmadd_ps(m, _mm512_set1_ps(*tx), sum);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (p, a) in acc.iter().enumerate() {
            t.store16(r, p, t.w.n, *a);
        }
    }
}

/// How the AVX2 block GEMMs run a tile of `R` rows: decode (one row) runs `both` halves of its
/// panels per block, so its weight streams advance together; a batch tile runs `one` half (8
/// outputs) of its panels at a time, so 4 rows keep their sums, a chunk's quant registers and
/// the broadcast activations in the 16 registers (holding a record's 8 nibble registers for
/// both halves spilled them every block).
#[inline(always)]
pub(super) fn by_halves_avx2<const R: usize>(blocks: Range<usize>, both: impl FnOnce(Range<usize>), one: impl Fn(Range<usize>, usize)) {
    if R == 1 {
        both(blocks);
    } else {
        for half in 0..2 {
            one(blocks.clone(), half);
        }
    }
}

// The closures are inlined as the tiles are: into the caller's AVX2 code.
#[inline(always)]
unsafe fn tile_avx2<const R: usize, const NP: usize, const OFFSET: u8>(t: &Tile<Int4Weights>, blocks: Range<usize>) {
    by_halves_avx2::<R>(
        blocks,
        #[inline(always)]
        |blocks| halves_avx2::<R, NP, 2, OFFSET>(t, blocks, 0),
        #[inline(always)]
        |blocks, half| halves_avx2::<R, NP, 1, OFFSET>(t, blocks, half),
    );
}

/// `R` rows by halves `first_half..first_half + H` of `NP` panels.
// Panels and halves index the accumulator tile, the records and the masks in lockstep.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn halves_avx2<const R: usize, const NP: usize, const H: usize, const OFFSET: u8>(t: &Tile<Int4Weights>, blocks: Range<usize>, first_half: usize) {
    let (nibble, ones) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi16(1));
    // 16-bit sums hold 8 groups of quants up to 15, 4 of MXFP4's levels up to 24.
    let widen_after = if OFFSET == Int4Offset::Mxfp4.id() { 2 } else { 4 };
    let masks: [[__m256i; H]; NP] = std::array::from_fn(|p| std::array::from_fn(|h| t.half_mask(p, first_half + h, t.w.n)));
    let mut acc: [[[__m256; H]; NP]; R] =
        std::array::from_fn(|r| std::array::from_fn(|p| std::array::from_fn(|h| t.load8(r, p, first_half + h, masks[p][h], blocks.start == 0))));
    for b in blocks {
        let x: [*const i8; R] = std::array::from_fn(|r| t.x.block_scales(t.row + r, b).0);
        for p in 0..NP {
            let rec = t.w.record(t.panel + p, b);
            if first_half == 0 {
                prefetch_ahead(rec, t.w.record_bytes());
            }
            for h in 0..H {
                let half = first_half + h;
                let (mut sums, mut wide) = ([_mm256_setzero_si256(); R], [_mm256_setzero_si256(); R]);
                // Chunk c's low nibbles are inputs 4c..4c + 4 (group c), its high ones group c + 4.
                for c in 0..4 {
                    let v = _mm256_loadu_si256(rec.add(64 * c + 32 * half) as *const _);
                    let low = levels_avx2::<OFFSET>(_mm256_and_si256(v, nibble));
                    let high = levels_avx2::<OFFSET>(_mm256_and_si256(_mm256_srli_epi16::<4>(v), nibble));
                    unroll!(R, |r| {
                        let low = _mm256_maddubs_epi16(low, _mm256_set1_epi32(group(x[r], c)));
                        let high = _mm256_maddubs_epi16(high, _mm256_set1_epi32(group(x[r], c + 4)));
                        sums[r] = _mm256_add_epi16(sums[r], _mm256_add_epi16(low, high));
                    });
                    if (c + 1) % widen_after == 0 {
                        unroll!(R, |r| {
                            wide[r] = _mm256_add_epi32(wide[r], _mm256_madd_epi16(sums[r], ones));
                            sums[r] = _mm256_setzero_si256();
                        });
                    }
                }
                let (d, m) = scale_min::<_, OFFSET>(
                    rec,
                    8 * half,
                    |at| _mm256_cvtph_ps(_mm_loadu_si128(at as *const _)),
                    |at| e8m0_half_avx2(at),
                    |d, c| _mm256_mul_ps(d, _mm256_set1_ps(c)),
                );
                unroll!(R, |r| {
                    let (_, dx, tx) = t.x.block_scales(t.row + r, b);
                    let s = _mm256_cvtepi32_ps(wide[r]);
                    let sum = _mm256_fmadd_ps(s, _mm256_mul_ps(d, _mm256_set1_ps(*dx)), acc[r][p][h]);
                    acc[r][p][h] = _mm256_fmadd_ps(m, _mm256_set1_ps(*tx), sum);
                });
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (p, halves) in acc.iter().enumerate() {
            for (h, values) in halves.iter().enumerate() {
                t.store8(r, p, first_half + h, masks[p][h], *values);
            }
        }
    }
}

/// The tile closure of [`for_each_tile_in_chunks`] calling `tile::<R, NP, OFFSET>` for the
/// run-time shape and the weights' [`Int4Offset`] (`OFFSET` its [`Int4Offset::id`]), then any
/// generics given after the tile's name (`tile::<BITS>` calls `tile::<R, NP, OFFSET, BITS>`).
/// Shared with the 8-bit block GEMMs, whose tiles take `OFFSET` and ignore it.
macro_rules! block_tiles {
    ($tile:ident $(::<$($g:tt),*>)?, $t:expr, $offset:expr) => {
        |row, rows, panel, np, blocks| {
            let t = &Tile { row, panel, ..*$t };
            match $offset {
                Int4Offset::Eight => block_tiles!(@shape $tile, ($($(, $g)*)?), t, rows, np, { Int4Offset::Eight.id() }, blocks),
                Int4Offset::Min => block_tiles!(@shape $tile, ($($(, $g)*)?), t, rows, np, { Int4Offset::Min.id() }, blocks),
                Int4Offset::Mxfp4 => block_tiles!(@shape $tile, ($($(, $g)*)?), t, rows, np, { Int4Offset::Mxfp4.id() }, blocks),
            }
        }
    };
    (@shape $tile:ident, ($($g:tt)*), $t:expr, $rows:expr, $np:expr, $min:tt, $blocks:expr) => {
        match ($rows, $np) {
            (1, 1) => $tile::<1, 1, $min $($g)*>($t, $blocks),
            (1, 2) => $tile::<1, 2, $min $($g)*>($t, $blocks),
            (1, 3) => $tile::<1, 3, $min $($g)*>($t, $blocks),
            (1, 4) => $tile::<1, 4, $min $($g)*>($t, $blocks),
            (2, _) => $tile::<2, 1, $min $($g)*>($t, $blocks),
            (3, _) => $tile::<3, 1, $min $($g)*>($t, $blocks),
            (4, _) => $tile::<4, 1, $min $($g)*>($t, $blocks),
            (5, _) => $tile::<5, 1, $min $($g)*>($t, $blocks),
            (6, _) => $tile::<6, 1, $min $($g)*>($t, $blocks),
            (7, _) => $tile::<7, 1, $min $($g)*>($t, $blocks),
            (8, _) => $tile::<8, 1, $min $($g)*>($t, $blocks),
            (rows, panels) => unreachable!("no block tile of {rows} rows by {panels} panels"),
        }
    };
}
pub(super) use block_tiles;

/// Tile shapes of the VNNI block GEMMs: decode takes 1 row by 4 panels (more weight streams
/// in flight), batches 8 rows by one panel.
pub(super) fn vnni_tiles(m: usize) -> (usize, usize) {
    if m == 1 {
        (1, 4)
    } else {
        (8, 1)
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn gemm_vnni(x: &QuantizedBlocks, w: &Int4Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    let (max_rows, panels_per_tile) = vnni_tiles(x.m);
    let tile = block_tiles!(tile_vnni, &Tile { x, w, row: 0, panel: 0, out, ldo }, w.offset);
    for_each_tile_in_chunks(x.m, panels, max_rows, panels_per_tile, w.blocks(), chunk_blocks(w.blocks()), tile);
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gemm_avx2(x: &QuantizedBlocks, w: &Int4Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    let panels_per_tile = if x.m == 1 { 2 } else { 1 };
    let tile = block_tiles!(tile_avx2, &Tile { x, w, row: 0, panel: 0, out, ldo }, w.offset);
    for_each_tile_in_chunks(x.m, panels, 4, panels_per_tile, w.blocks(), chunk_blocks(w.blocks()), tile);
}

/// # Safety
/// As [`crate::portable::int4::gemm_q4`]; only handed out after detecting VNNI.
pub unsafe fn gemm_q4_vnni(x: &QuantizedBlocks, w: &Int4Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    gemm_vnni(x, w, panels, out, ldo)
}

/// # Safety
/// As above, after detecting avx2, fma and f16c.
pub unsafe fn gemm_q4_avx2(x: &QuantizedBlocks, w: &Int4Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    gemm_avx2(x, w, panels, out, ldo)
}
