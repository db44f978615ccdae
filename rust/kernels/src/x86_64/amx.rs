//! Block-quantized GEMMs on Intel AMX (AMX-INT8): the 4-bit blocks of [`crate::int4`] and the
//! 8-bit ones of [`crate::int8_block`], for batches of two rows and more (one row stays on the
//! VNNI tiles, which the weights' reads bound anyway).
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
//! Tiles: tmm0/tmm1 take A and tmm2/tmm3 B, alternately, tmm4..tmm7 C (by panel and the parity
//! of the dot product), so consecutive dot products do not wait on each other. The tile
//! configuration is loaded on each call's thread before its first tile and released at its end.

use super::int4::{gemm_q4_vnni, prefetch_ahead, Tile};
use super::int8_block::gemm_q8_vnni;
use crate::int4::{Int4Offset, Int4Weights, QuantizedBlocks, NIBBLE_BYTES, QBLOCK};
use crate::int8_block::{Int8BlockWeights, QUANT_BYTES, RECORD_BYTES};
use crate::packed::PANEL;
use crate::portable::gemm::{for_each_row, for_each_tile_in_chunks};
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
/// Most panels a tile runs side by side.
const MAX_PANELS: usize = 2;
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
        let nibble = _mm512_set1_epi8(0x0f);
        for c in 0..4 {
            let v = _mm512_loadu_si512(rec.add(64 * c) as *const _);
            _mm512_store_si512(weights.add(64 * c) as *mut _, _mm512_and_si512(v, nibble));
            _mm512_store_si512(weights.add(64 * (c + 4)) as *mut _, _mm512_and_si512(_mm512_srli_epi16::<4>(v), nibble));
        }
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(rec.add(NIBBLE_BYTES) as *const _));
        let m = match self.offset {
            Int4Offset::Min => _mm512_cvtph_ps(_mm256_loadu_si256(rec.add(NIBBLE_BYTES + 2 * PANEL) as *const _)),
            Int4Offset::Eight => _mm512_mul_ps(d, _mm512_set1_ps(-8.0)),
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
        let rec = self.record(p, b);
        prefetch_ahead(rec, RECORD_BYTES);
        // |q - offset| <= 127 (see `crate::int8_block`): the wrapping byte difference is exact.
        let offset = _mm512_set1_epi8(self.offset as i8);
        for g in 0..8 {
            let v = _mm512_loadu_si512(rec.add(64 * g) as *const _);
            _mm512_store_si512(weights.add(64 * g) as *mut _, _mm512_sub_epi8(v, offset));
        }
        for h in 0..2 {
            _mm512_store_ps(coefs.add(PANEL * h), _mm512_cvtph_ps(_mm256_loadu_si256(rec.add(QUANT_BYTES + 2 * PANEL * h) as *const _)));
        }
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

/// What one thread's call keeps between tiles: the unpacked weights of a chunk of blocks (for
/// the panels `key` names), the C tiles' sums, and which configuration is loaded.
#[repr(C, align(64))]
struct Scratch {
    /// `[block of the chunk][panel]`: a B tile (the block's dot products one after the other).
    weights: [[[u8; B_BYTES]; MAX_PANELS]; CHUNK_DOTS],
    /// `[block][panel]`: the epilogue's coefficients.
    coefs: [[[f32; 2 * PANEL]; MAX_PANELS]; CHUNK_DOTS],
    /// `[dot product][panel]`: a C tile of `ROWS` x 16 sums.
    sums: [[[i32; ROWS * PANEL]; MAX_PANELS]; CHUNK_DOTS],
}

/// The tile configuration for `rows` activation rows and dot products of `depth` inputs.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    fn new(rows: usize, depth: usize) -> TileConfig {
        let mut bytes = [0u8; 64];
        bytes[0] = 1; // palette 1: 8 tiles of up to 16 rows of 64 bytes
        let mut set = |tile: usize, rows: usize, row_bytes: usize| {
            bytes[16 + 2 * tile..18 + 2 * tile].copy_from_slice(&(row_bytes as u16).to_le_bytes());
            bytes[48 + tile] = rows as u8;
        };
        for a in 0..2 {
            set(a, rows, depth);
        }
        for b in 2..4 {
            set(b, depth / 4, 64);
        }
        for c in 4..8 {
            set(c, rows, 64);
        }
        TileConfig(bytes)
    }

    unsafe fn load(&self) {
        asm!("ldtilecfg [{}]", in(reg) self.0.as_ptr(), options(nostack, readonly));
    }
}

/// One dot product: B (tile `$b`) from `$w`, C (tile `$c`) = A (tile `$a`) x B, stored to `$out`.
macro_rules! dot {
    ($op:literal, $a:literal, $b:literal, $c:literal, $w:expr, $out:expr) => {
        asm!(
            concat!("tileloadd tmm", $b, ", [{w} + {s}*1]"),
            concat!("tilezero tmm", $c),
            concat!($op, " tmm", $c, ", tmm", $a, ", tmm", $b),
            concat!("tilestored [{out} + {s}*1], tmm", $c),
            w = in(reg) $w,
            out = in(reg) $out,
            s = in(reg) 64usize,
            options(nostack)
        )
    };
    ($op:literal, $parity:expr, $p:expr, $w:expr, $out:expr) => {
        match ($parity, $p) {
            (0, 0) => dot!($op, 0, 2, 4, $w, $out),
            (0, _) => dot!($op, 0, 3, 5, $w, $out),
            (_, 0) => dot!($op, 1, 2, 6, $w, $out),
            (_, _) => dot!($op, 1, 3, 7, $w, $out),
        }
    };
}

/// Rows `row..row + rows` (at most 16) by `NP` panels from `panel`, over `blocks` (at most a
/// chunk, the same for every row tile of these panels until `key` changes).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile<W: AmxBlocks, const NP: usize>(t: &Tile<W>, rows: usize, blocks: Range<usize>, s: *mut Scratch, key: &mut (usize, usize, usize)) {
    if *key != (t.panel, blocks.start, NP) {
        for (i, b) in blocks.clone().enumerate() {
            for p in 0..NP {
                t.w.unpack(t.panel + p, b, (&raw mut (*s).weights[i][p]).cast(), (&raw mut (*s).coefs[i][p]).cast());
            }
        }
        *key = (t.panel, blocks.start, NP);
    }
    let (x, stride) = (t.x.q.as_ptr().add(t.row * t.x.k), t.x.k);
    let depth = QBLOCK / W::DOTS;
    for (i, b) in blocks.clone().enumerate() {
        for h in 0..W::DOTS {
            let j = i * W::DOTS + h;
            let a = x.add(b * QBLOCK + h * depth);
            if j % 2 == 0 {
                asm!("tileloadd tmm0, [{a} + {s}*1]", a = in(reg) a, s = in(reg) stride, options(nostack, readonly));
            } else {
                asm!("tileloadd tmm1, [{a} + {s}*1]", a = in(reg) a, s = in(reg) stride, options(nostack, readonly));
            }
            for p in 0..NP {
                let (w, out) = ((&raw const (*s).weights[i][p]).cast::<u8>().add(h * B_BYTES / W::DOTS), (&raw mut (*s).sums[j][p]).cast::<i32>());
                if W::SIGNED {
                    dot!("tdpbssd", j % 2, p, w, out);
                } else {
                    dot!("tdpbsud", j % 2, p, w, out);
                }
            }
        }
    }
    for p in 0..NP {
        for first in (0..rows).step_by(8) {
            match rows - first {
                1 => epilogue::<W, 1>(t, first, p, blocks.clone(), s),
                2 => epilogue::<W, 2>(t, first, p, blocks.clone(), s),
                3 => epilogue::<W, 3>(t, first, p, blocks.clone(), s),
                4 => epilogue::<W, 4>(t, first, p, blocks.clone(), s),
                5 => epilogue::<W, 5>(t, first, p, blocks.clone(), s),
                6 => epilogue::<W, 6>(t, first, p, blocks.clone(), s),
                7 => epilogue::<W, 7>(t, first, p, blocks.clone(), s),
                _ => epilogue::<W, 8>(t, first, p, blocks.clone(), s),
            }
        }
    }
}

/// Tile rows `first..first + R` of panel `p`: each block's sums through the float steps, in
/// block order, from the sums the columns hold (after the first chunk) to `out`.
#[inline(always)]
unsafe fn epilogue<W: AmxBlocks, const R: usize>(t: &Tile<W>, first: usize, p: usize, blocks: Range<usize>, s: *const Scratch) {
    let n = t.w.n();
    let mut acc: [__m512; R] = std::array::from_fn(|r| t.load16(first + r, p, n, blocks.start == 0));
    let stride = MAX_PANELS * ROWS * PANEL;
    for (i, b) in blocks.enumerate() {
        let coefs = (&raw const (*s).coefs[i][p]).cast::<f32>();
        let sums = (&raw const (*s).sums[i * W::DOTS][p]).cast::<i32>().add(first * PANEL);
        for_each_row!(R, |r| {
            let (_, dx, tx) = t.x.block_scales(t.row + first + r, b);
            acc[r] = W::step(acc[r], sums.add(r * PANEL), stride, coefs, dx, tx);
        });
    }
    for (r, a) in acc.iter().enumerate() {
        t.store16(first + r, p, n, *a);
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn gemm<W: AmxBlocks>(x: &QuantizedBlocks, w: &W, panels: Range<usize>, out: *mut f32, ldo: usize) {
    let mut scratch = MaybeUninit::<Scratch>::uninit();
    let s = scratch.as_mut_ptr();
    let (mut key, mut loaded_rows) = ((usize::MAX, 0, 0), 0);
    let base = Tile { x, w, row: 0, panel: 0, out, ldo };
    let np = MAX_PANELS;
    for_each_tile_in_chunks(x.m, panels, ROWS, np, w.blocks(), CHUNK_DOTS / W::DOTS, |row, rows, panel, np, blocks| {
        if rows != loaded_rows {
            TileConfig::new(rows, QBLOCK / W::DOTS).load();
            loaded_rows = rows;
        }
        let t = &Tile { row, panel, ..base };
        match np {
            1 => tile::<W, 1>(t, rows, blocks, s, &mut key),
            _ => tile::<W, 2>(t, rows, blocks, s, &mut key),
        }
    });
    asm!("tilerelease", options(nostack, nomem));
}

/// # Safety
/// As [`crate::portable::gemm_q4::gemm_q4`]; only handed out after [`detected`].
pub unsafe fn gemm_q4_amx(x: &QuantizedBlocks, w: &Int4Weights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    if x.m < 2 {
        gemm_q4_vnni(x, w, panels, out, ldo)
    } else {
        gemm(x, w, panels, out, ldo)
    }
}

/// # Safety
/// As [`crate::portable::gemm_q8::gemm_q8`]; only handed out after [`detected`].
pub unsafe fn gemm_q8_amx(x: &QuantizedBlocks, w: &Int8BlockWeights, panels: Range<usize>, out: *mut f32, ldo: usize) {
    if x.m < 2 {
        gemm_q8_vnni(x, w, panels, out, ldo)
    } else {
        gemm(x, w, panels, out, ldo)
    }
}
