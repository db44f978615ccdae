//! GEMMs on int8 activations with Intel AMX (AMX-INT8): the 4-bit blocks of [`crate::int4`],
//! the 8-bit ones of [`crate::int8_block`] and W8A8 ([`crate::int8`], in `w8a8` below), for
//! batches from [`MIN_ROWS_Q4`], [`MIN_ROWS_Q8`] and [`MIN_ROWS_W8A8`] rows (smaller ones stay
//! on the VNNI tiles).
//!
//! Each block keeps its own integer sums (its scales come after them), so a block (or, with
//! the 8-bit weights' scale per half, a half block) is one `tdpbsud`/`tdpbssd` of up to 16
//! activation rows by 32 (16) inputs by one panel's 16 outputs:
//! - A: the rows' quantized activations of the block, loaded straight from them (row stride `k`);
//! - B: the panel's weights of the block in VNNI order (row `g`: 16 outputs x inputs
//!   `4g..4g + 4`), which is how both records store them: 4-bit chunks are unpacked to bytes
//!   (low nibbles: groups 0..4, high: 4..8), 8-bit quants lose their offset (signed, for
//!   `tdpbssd`). Unpacked once per chunk of blocks into a scratch that every row tile reuses;
//! - C: 16 x 16 int32 sums, stored to a scratch, from which the AVX-512 epilogue takes each
//!   row's sums through the scheme's float steps, exactly as the VNNI tiles do: results match
//!   the portable twin bit for bit.
//!
//! A tile is up to 16 rows by one panel over a chunk of 8 dot products (what
//! [`for_each_tile_in_chunks`] hands out; its row tiles have at most two heights, each with its
//! own set of A, B and two C tiles, so the configuration is loaded once per call). The
//! configuration is loaded on each call's thread and released at its end.
//!
//! Costs, on an Emerald Rapids Xeon (2 vCPUs of a shared VM): a dot product and the store of
//! its sums take about 30 cycles whatever the rows, unpacking a 4-bit block about 20, and the
//! epilogue remains per row (a conversion, a multiply and two FMAs per block). The VNNI tiles
//! spend about 9 cycles per row and 4-bit block, 15 per 8-bit block: AMX matches them on 4-bit
//! weights from 16 rows and gains 10-15% from 32; on 8-bit weights it gains from 8 rows, 1.5-2x
//! from 16.

use super::int4::{gemm_q4_vnni, levels_avx512, prefetch_ahead, scale_min_avx512, Tile};
use super::int8::gemm_i8_vnni;
use super::int8_block::{gemm_q8_vnni, quants_avx512};
use crate::int4::{Int4Offset, Int4Weights, QuantizedBlocks, QBLOCK};
use crate::int8::{Int8Weights, QuantizedRows};
use crate::int8_block::{by_quant_bits, quant_bytes, record_bytes, Int8BlockWeights};
use crate::packed::PANEL;
use crate::portable::gemm::{for_each_tile_in_chunks, unroll};
use std::arch::asm;
use std::arch::x86_64::*;
use std::mem::MaybeUninit;
use std::ops::Range;
use std::sync::OnceLock;

/// Whether this CPU has AMX-TILE and AMX-INT8 (and the AVX-512 VNNI of the epilogue and of
/// single rows) and Linux lets this process use the tile registers (asked once).
pub fn detected() -> bool {
    static USABLE: OnceLock<bool> = OnceLock::new();
    *USABLE.get_or_init(|| {
        let leaf7 = __cpuid_count(7, 0);
        let (tile, int8) = (leaf7.edx & (1 << 24) != 0, leaf7.edx & (1 << 25) != 0);
        tile && int8 && super::int8::vnni_detected() && request_tile_data()
    })
}

/// Asks Linux for the tile registers' state (`arch_prctl(ARCH_REQ_XCOMP_PERM,
/// XFEATURE_XTILEDATA)`): without it the first tile instruction faults.
fn request_tile_data() -> bool {
    const ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    let status: i64;
    // SAFETY: the system call only changes which state the kernel saves for this process.
    unsafe {
        asm!("syscall", inlateout("rax") ARCH_PRCTL => status, in("rdi") ARCH_REQ_XCOMP_PERM, in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    status == 0
}

/// Rows of an A and a C tile.
const ROWS: usize = 16;
/// Dot products (blocks times their scales) per chunk of blocks.
const CHUNK_DOTS: usize = 8;
/// Bytes of a B tile's scratch: 8 rows of 64 bytes.
const B_BYTES: usize = 512;

/// A block-quantized weight matrix as the AMX tiles take it.
trait AmxBlocks {
    /// Dot products per block: one per scale.
    const DOTS: usize;
    /// `tdpbssd` (signed weights), else `tdpbsud`.
    const SIGNED: bool;
    fn n(&self) -> usize;
    fn blocks(&self) -> usize;
    /// Writes block `b` of panel `p` as a B tile's 8 rows of 64 bytes to `weights` and its
    /// epilogue's two vectors of 16 coefficients to `coefs`.
    unsafe fn unpack(&self, p: usize, b: usize, weights: *mut u8, coefs: *mut f32);
    /// The epilogue of one block of one row: `sums` its dot products' 16 sums (the next one
    /// `stride` i32 on), `dx` and `tx` the activations' scale and scaled sum.
    unsafe fn step(acc: __m512, sums: *const i32, stride: usize, coefs: *const f32, dx: *const f32, tx: *const f32) -> __m512;
}

impl AmxBlocks for Int4Weights {
    const DOTS: usize = 1;
    const SIGNED: bool = false;

    fn n(&self) -> usize {
        self.n
    }

    fn blocks(&self) -> usize {
        Int4Weights::blocks(self)
    }

    #[inline(always)]
    unsafe fn unpack(&self, p: usize, b: usize, weights: *mut u8, coefs: *mut f32) {
        let rec = self.record(p, b);
        prefetch_ahead(rec, self.record_bytes());
        const MXFP4: u8 = Int4Offset::Mxfp4.id();
        let nibble = _mm512_set1_epi8(0x0f);
        let levels = |quants: __m512i| if self.offset == Int4Offset::Mxfp4 { levels_avx512::<MXFP4>(quants) } else { quants };
        for c in 0..4 {
            let v = _mm512_loadu_si512(rec.add(64 * c) as *const _);
            _mm512_store_si512(weights.add(64 * c) as *mut _, levels(_mm512_and_si512(v, nibble)));
            _mm512_store_si512(weights.add(64 * (c + 4)) as *mut _, levels(_mm512_and_si512(_mm512_srli_epi16::<4>(v), nibble)));
        }
        let (d, m) = match self.offset {
            Int4Offset::Eight => scale_min_avx512::<{ Int4Offset::Eight.id() }>(rec),
            Int4Offset::Min => scale_min_avx512::<{ Int4Offset::Min.id() }>(rec),
            Int4Offset::Mxfp4 => scale_min_avx512::<MXFP4>(rec),
        };
        _mm512_store_ps(coefs, d);
        _mm512_store_ps(coefs.add(PANEL), m);
    }

    #[inline(always)]
    unsafe fn step(acc: __m512, sums: *const i32, _: usize, coefs: *const f32, dx: *const f32, tx: *const f32) -> __m512 {
        let s = _mm512_cvtepi32_ps(_mm512_load_si512(sums as *const _));
        let sum = _mm512_fmadd_ps(s, _mm512_mul_ps(_mm512_load_ps(coefs), _mm512_set1_ps(*dx)), acc);
        _mm512_fmadd_ps(_mm512_load_ps(coefs.add(PANEL)), _mm512_set1_ps(*tx), sum)
    }
}

impl AmxBlocks for Int8BlockWeights {
    const DOTS: usize = 2;
    const SIGNED: bool = true;

    fn n(&self) -> usize {
        self.n
    }

    fn blocks(&self) -> usize {
        Int8BlockWeights::blocks(self)
    }

    #[inline(always)]
    unsafe fn unpack(&self, p: usize, b: usize, weights: *mut u8, coefs: *mut f32) {
        by_quant_bits!(self.bits, unpack_int8_blocks, (self, p, b, weights, coefs))
    }

    #[inline(always)]
    unsafe fn step(mut acc: __m512, sums: *const i32, stride: usize, coefs: *const f32, dx: *const f32, _: *const f32) -> __m512 {
        for h in 0..2 {
            let s = _mm512_cvtepi32_ps(_mm512_load_si512(sums.add(stride * h) as *const _));
            acc = _mm512_fmadd_ps(s, _mm512_mul_ps(_mm512_load_ps(coefs.add(PANEL * h)), _mm512_set1_ps(*dx)), acc);
        }
        acc
    }
}

/// [`AmxBlocks::unpack`] of 8-bit block weights of `BITS`-bit quants.
#[inline(always)]
unsafe fn unpack_int8_blocks<const BITS: u32>(w: &Int8BlockWeights, p: usize, b: usize, weights: *mut u8, coefs: *mut f32) {
    let rec = w.record(p, b);
    prefetch_ahead(rec, record_bytes(BITS));
    // |q - offset| <= 127 (see `crate::int8_block`): the wrapping byte difference is exact.
    let offset = _mm512_set1_epi8(w.offset() as i8);
    for g in 0..8 {
        _mm512_store_si512(weights.add(64 * g) as *mut _, _mm512_sub_epi8(quants_avx512::<BITS>(rec, g), offset));
    }
    for h in 0..2 {
        _mm512_store_ps(coefs.add(PANEL * h), _mm512_cvtph_ps(_mm256_loadu_si256(rec.add(quant_bytes(BITS) + 2 * PANEL * h) as *const _)));
    }
}

/// What one thread's call keeps between tiles: the unpacked weights of a chunk of blocks of
/// one panel and the C tiles' sums.
#[repr(C, align(64))]
struct Scratch {
    /// `[block of the chunk]`: a B tile (the block's dot products one after the other).
    weights: [[u8; B_BYTES]; CHUNK_DOTS],
    /// `[block]`: the epilogue's coefficients.
    coefs: [[f32; 2 * PANEL]; CHUNK_DOTS],
    /// `[dot product]`: a C tile of up to `ROWS` x 16 sums.
    sums: [[i32; ROWS * PANEL]; CHUNK_DOTS],
}

/// The tile configuration: two sets of tiles, set `i` for row tiles of `rows[i]` rows (a batch
/// has at most two heights, see [`set_of`]), with dot products of `depth` inputs. Set `i` has
/// A in tmm`i`, B in tmm`2 + i` and C in tmm`4 + 2i` and tmm`5 + 2i` (even and odd dot products).
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    /// No tiles yet, palette 1 (8 tiles of up to 16 rows of 64 bytes).
    fn empty() -> TileConfig {
        let mut bytes = [0u8; 64];
        bytes[0] = 1;
        TileConfig(bytes)
    }

    /// Gives tile `tile` `rows` rows of `row_bytes` bytes.
    fn set(&mut self, tile: usize, rows: usize, row_bytes: usize) {
        self.0[16 + 2 * tile..18 + 2 * tile].copy_from_slice(&(row_bytes as u16).to_le_bytes());
        self.0[48 + tile] = rows as u8;
    }

    fn new(rows: [usize; 2], depth: usize) -> TileConfig {
        let mut config = TileConfig::empty();
        for (i, &rows) in rows.iter().enumerate().filter(|(_, &rows)| rows > 0) {
            config.set(i, rows, depth);
            config.set(2 + i, depth / 4, 64);
            config.set(4 + 2 * i, rows, 64);
            config.set(5 + 2 * i, rows, 64);
        }
        config
    }

    unsafe fn load(&self) {
        asm!("ldtilecfg [{}]", in(reg) self.0.as_ptr(), options(nostack, readonly));
    }
}

/// The row tiles' heights for a batch of `m` rows: 16 (or `m`, if fewer), and what is left
/// after the last 16 (`for_each_tile_in_chunks`' row blocks are multiples of 16 rows).
fn heights(m: usize) -> [usize; 2] {
    [m.min(ROWS), if m > ROWS { m % ROWS } else { 0 }]
}

/// One dot product of set `$i` (see [`TileConfig`]): A from `$x` (rows `$stride` bytes apart),
/// B from `$w`, C (tile `$c`) = A x B stored to `$out`.
macro_rules! dot {
    ($op:literal, $a:literal, $b:literal, $c:literal, $x:expr, $stride:expr, $w:expr, $out:expr) => {
        asm!(
            concat!("tileloadd tmm", $a, ", [{x} + {stride}*1]"),
            concat!("tileloadd tmm", $b, ", [{w} + {s}*1]"),
            concat!("tilezero tmm", $c),
            concat!($op, " tmm", $c, ", tmm", $a, ", tmm", $b),
            concat!("tilestored [{out} + {s}*1], tmm", $c),
            x = in(reg) $x,
            stride = in(reg) $stride,
            w = in(reg) $w,
            out = in(reg) $out,
            s = in(reg) 64usize,
            options(nostack)
        )
    };
    ($op:literal, $set:expr, $odd:expr, $x:expr, $stride:expr, $w:expr, $out:expr) => {
        match ($set, $odd) {
            (0, false) => dot!($op, 0, 2, 4, $x, $stride, $w, $out),
            (0, true) => dot!($op, 0, 2, 5, $x, $stride, $w, $out),
            (_, false) => dot!($op, 1, 3, 6, $x, $stride, $w, $out),
            (_, true) => dot!($op, 1, 3, 7, $x, $stride, $w, $out),
        }
    };
}

/// Rows `row..row + rows` (at most 16, tile set `set`) by the panel `panel`, over `blocks` (at
/// most a chunk; its weights are unpacked once, by the first row tile, while `key` matches).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile<W: AmxBlocks>(t: &Tile<W>, rows: usize, set: usize, blocks: Range<usize>, s: *mut Scratch, key: &mut (usize, usize)) {
    if *key != (t.panel, blocks.start) {
        for (i, b) in blocks.clone().enumerate() {
            t.w.unpack(t.panel, b, (&raw mut (*s).weights[i]).cast(), (&raw mut (*s).coefs[i]).cast());
        }
        *key = (t.panel, blocks.start);
    }
    let (x, stride) = (t.x.q.as_ptr().add(t.row * t.x.k), t.x.k);
    let depth = QBLOCK / W::DOTS;
    for j in 0..blocks.len() * W::DOTS {
        let a = x.add((blocks.start + j / W::DOTS) * QBLOCK + j % W::DOTS * depth);
        let w = (&raw const (*s).weights[j / W::DOTS]).cast::<u8>().add(j % W::DOTS * B_BYTES / W::DOTS);
        let out = (&raw mut (*s).sums[j]).cast::<i32>();
        if W::SIGNED {
            dot!("tdpbssd", set, j % 2 == 1, a, stride, w, out);
        } else {
            dot!("tdpbsud", set, j % 2 == 1, a, stride, w, out);
        }
    }
    for first in (0..rows).step_by(8) {
        match rows - first {
            1 => epilogue::<W, 1>(t, first, blocks.clone(), s),
            2 => epilogue::<W, 2>(t, first, blocks.clone(), s),
            3 => epilogue::<W, 3>(t, first, blocks.clone(), s),
            4 => epilogue::<W, 4>(t, first, blocks.clone(), s),
            5 => epilogue::<W, 5>(t, first, blocks.clone(), s),
            6 => epilogue::<W, 6>(t, first, blocks.clone(), s),
            7 => epilogue::<W, 7>(t, first, blocks.clone(), s),
            _ => epilogue::<W, 8>(t, first, blocks.clone(), s),
        }
    }
}

/// Tile rows `first..first + R`: each block's sums through the float steps, in block order,
/// from the sums the columns hold (after the first chunk) to `out`.
#[inline(always)]
unsafe fn epilogue<W: AmxBlocks, const R: usize>(t: &Tile<W>, first: usize, blocks: Range<usize>, s: *const Scratch) {
    let n = t.w.n();
    let mut acc: [__m512; R] = std::array::from_fn(|r| t.load16(first + r, 0, n, blocks.start == 0));
    for (i, b) in blocks.enumerate() {
        let coefs = (&raw const (*s).coefs[i]).cast::<f32>();
        let sums = (&raw const (*s).sums[i * W::DOTS]).cast::<i32>().add(first * PANEL);
        unroll!(R, |r| {
            let (_, dx, tx) = t.x.block_scales(t.row + first + r, b);
            acc[r] = W::step(acc[r], sums.add(r * PANEL), ROWS * PANEL, coefs, dx, tx);
        });
    }
    for (r, a) in acc.iter().enumerate() {
        t.store16(first + r, 0, n, *a);
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn gemm<W: AmxBlocks>(x: &QuantizedBlocks, w: &W, panels: Range<usize>, out: *mut f32, ldo: usize) {
    let mut scratch = MaybeUninit::<Scratch>::uninit();
    let s = scratch.as_mut_ptr();
    let mut key = (usize::MAX, 0);
    let heights = heights(x.m);
    TileConfig::new(heights, QBLOCK / W::DOTS).load();
    let base = Tile { x, w, row: 0, panel: 0, out, ldo };
    for_each_tile_in_chunks(x.m, panels, ROWS, 1, w.blocks(), CHUNK_DOTS / W::DOTS, |row, rows, panel, _, blocks| {
        let set = usize::from(rows != heights[0]);
        debug_assert_eq!(rows, heights[set]);
        tile(&Tile { row, panel, ..base }, rows, set, blocks, s, &mut key);
    });
    asm!("tilerelease", options(nostack, nomem));
}

/// The fewest rows for which the AMX tiles beat the VNNI ones with 4-bit weights (measured at
/// [m x 576] x [3072 x 576] on Emerald Rapids, see the module doc).
pub const MIN_ROWS_Q4: usize = 32;
/// The same with 8-bit weights.
pub const MIN_ROWS_Q8: usize = 8;

/// # Safety
/// As [`crate::portable::int4::gemm_q4`]; only handed out after [`detected`].
pub unsafe fn gemm_q4_amx(x: &QuantizedBlocks, w: &Int4Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    if x.m < MIN_ROWS_Q4 {
        gemm_q4_vnni(x, w, panels, out, ldo)
    } else {
        gemm(x, w, panels, out, ldo)
    }
}

/// # Safety
/// As [`crate::portable::int8_block::gemm_q8`]; only handed out after [`detected`].
pub unsafe fn gemm_q8_amx(x: &QuantizedBlocks, w: &Int8BlockWeights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    if x.m < MIN_ROWS_Q8 {
        gemm_q8_vnni(x, w, panels, out, ldo)
    } else {
        gemm(x, w, panels, out, ldo)
    }
}

/// W8A8 ([`crate::int8`]): no scales inside a row, so a tile's C sums every input, 64 per
/// `tdpbssd`, and is stored once. A panel's blocks of 8 inputs x 16 outputs become B tiles once
/// per panel (two B rows per block: the outputs' first 4 inputs, then their last 4).
///
/// Tiles: A in tmm`2h + tail` (row-tile height `h` of [`heights`], `tail`: the last `k % 64`
/// inputs), B in tmm`4 + tail`, C in tmm`6 + h`.
mod w8a8 {
    use super::*;
    use crate::int8::{Int8Tile, Int8Weights, QuantizedRows, K_BLOCK};
    use crate::portable::gemm::for_each_tile;

    /// Inputs per dot product.
    const DEPTH: usize = 64;

    #[repr(C, align(64))]
    #[derive(Clone, Copy)]
    struct Line([u8; 64]);

    fn config(heights: [usize; 2], tail: usize) -> TileConfig {
        let mut config = TileConfig::empty();
        for (h, &rows) in heights.iter().enumerate().filter(|(_, &rows)| rows > 0) {
            config.set(2 * h, rows, DEPTH);
            if tail > 0 {
                config.set(2 * h + 1, rows, tail);
            }
            config.set(6 + h, rows, 64);
        }
        config.set(4, DEPTH / 4, 64);
        if tail > 0 {
            config.set(5, tail / 4, 64);
        }
        config
    }

    /// Writes panel `p`'s weights as B tiles to `b` (`k_padded / 4` rows of 64 bytes).
    #[inline(always)]
    unsafe fn unpack(w: &Int8Weights, p: usize, b: *mut Line) {
        let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
        let panel = w.data.as_ptr().add(p * w.panel_stride());
        for block in 0..w.k_padded / K_BLOCK {
            let at = panel.add(block * PANEL * K_BLOCK);
            let (lo, hi) = (_mm512_loadu_si512(at as *const _), _mm512_loadu_si512(at.add(64) as *const _));
            _mm512_store_si512(b.add(2 * block) as *mut _, _mm512_permutex2var_epi32(lo, even, hi));
            _mm512_store_si512(b.add(2 * block + 1) as *mut _, _mm512_permutex2var_epi32(lo, odd, hi));
        }
    }

    macro_rules! accumulate {
        ($a:literal, $b:literal, $c:literal, $x:expr, $stride:expr, $w:expr) => {
            asm!(
                concat!("tileloadd tmm", $a, ", [{x} + {stride}*1]"),
                concat!("tileloadd tmm", $b, ", [{w} + {s}*1]"),
                concat!("tdpbssd tmm", $c, ", tmm", $a, ", tmm", $b),
                x = in(reg) $x,
                stride = in(reg) $stride,
                w = in(reg) $w,
                s = in(reg) 64usize,
                options(nostack, readonly)
            )
        };
    }

    /// Rows `t.row..t.row + rows` (height `h`) by panel `t.panel`, from its B tiles `b`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn tile(t: &Int8Tile, rows: usize, h: usize, b: *const Line, sums: *mut i32) {
        let (x, stride) = (t.x.q.as_ptr().add(t.row * t.x.k_padded), t.x.k_padded);
        let (steps, tail) = (t.w.k_padded / DEPTH, t.w.k_padded % DEPTH);
        if h == 0 {
            asm!("tilezero tmm6", options(nostack, nomem));
        } else {
            asm!("tilezero tmm7", options(nostack, nomem));
        }
        for s in 0..steps {
            let (xs, ws) = (x.add(s * DEPTH), b.add(s * DEPTH / 4));
            if h == 0 {
                accumulate!(0, 4, 6, xs, stride, ws);
            } else {
                accumulate!(2, 4, 7, xs, stride, ws);
            }
        }
        if tail > 0 {
            let (xs, ws) = (x.add(steps * DEPTH), b.add(steps * DEPTH / 4));
            if h == 0 {
                accumulate!(1, 5, 6, xs, stride, ws);
            } else {
                accumulate!(3, 5, 7, xs, stride, ws);
            }
        }
        if h == 0 {
            asm!("tilestored [{a} + {s}*1], tmm6", a = in(reg) sums, s = in(reg) 64usize, options(nostack));
        } else {
            asm!("tilestored [{a} + {s}*1], tmm7", a = in(reg) sums, s = in(reg) 64usize, options(nostack));
        }
        let first = t.panel * PANEL;
        let w_scales = _mm512_loadu_ps(t.w.scales.as_ptr().add(first));
        let valid = ((1u32 << (t.w.n - first).min(PANEL)) - 1) as u16;
        for r in 0..rows {
            let i = t.row + r;
            let s = _mm512_cvtepi32_ps(_mm512_load_si512(sums.add(r * PANEL) as *const _));
            // (sum * x_scale) * w_scale, the epilogue's order.
            let values = _mm512_mul_ps(_mm512_mul_ps(s, _mm512_set1_ps(t.x.scales[i])), w_scales);
            _mm512_mask_storeu_ps(t.out.add(i * t.ldo + first), valid, values);
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn gemm(x: &QuantizedRows, w: &Int8Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
        let mut b = vec![Line([0; 64]); w.k_padded / 4];
        let mut sums = [Line([0; 64]); ROWS];
        let heights = heights(x.m);
        config(heights, w.k_padded % DEPTH).load();
        let mut unpacked = usize::MAX;
        for_each_tile(x.m, panels, ROWS, 1, |row, rows, panel, _| {
            if unpacked != panel {
                unpack(w, panel, b.as_mut_ptr());
                unpacked = panel;
            }
            let h = usize::from(rows != heights[0]);
            tile(&Int8Tile { x, w, row, panel, out, ldo }, rows, h, b.as_ptr(), sums.as_mut_ptr().cast());
        });
        asm!("tilerelease", options(nostack, nomem));
    }
}

/// The fewest rows for which the AMX W8A8 GEMM beats the VNNI one: rearranging a panel's
/// weights into B tiles costs about what 4 (k = 576) to 10 (k = 1536) rows of VNNI work do;
/// from 16 rows AMX takes less than half the VNNI time.
pub const MIN_ROWS_W8A8: usize = 8;

/// # Safety
/// As [`crate::portable::int8::gemm_i8`]; only handed out after [`detected`].
pub unsafe fn gemm_i8_amx(x: &QuantizedRows, w: &Int8Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    if x.m < MIN_ROWS_W8A8 {
        gemm_i8_vnni(x, w, panels, out, ldo)
    } else {
        w8a8::gemm(x, w, panels, out, ldo)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::portable::twin_tests::{check_blocks_paths_against_portable, check_int8_against_portable};
    use crate::Int8Gemm;

    unsafe fn q4_always(x: &QuantizedBlocks, w: &Int4Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
        gemm(x, w, panels, out, ldo)
    }

    unsafe fn i8_always(x: &QuantizedRows, w: &Int8Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
        w8a8::gemm(x, w, panels, out, ldo)
    }

    unsafe fn q8_always(x: &QuantizedBlocks, w: &Int8BlockWeights, panels: Range<usize>, out: *mut f32, ldo: usize) {
        gemm(x, w, panels, out, ldo)
    }

    /// The AMX tiles on every batch the twin tests run, below the thresholds too (the dispatched
    /// path hands those to VNNI).
    #[test]
    fn amx_tiles_match_portable_from_one_row() {
        if !detected() {
            eprintln!("no AMX here: skipped");
            return;
        }
        let path = Int8Gemm { isa: "avx512-amx (always)", gemm: i8_always, gemm_q4: q4_always, gemm_q8: q8_always };
        check_blocks_paths_against_portable(&path);
        check_int8_against_portable(&path);
    }
}
