//! llama.cpp's tensor storage types and their dequantization, a row at a time.
//!
//! Quantized types store a row as blocks: 32 values with an f16 scale (and minimum) for the
//! classic types, 256-value super-blocks with 6- or 8-bit sub-block scales for the K-quants,
//! 32 e2m1 codes with an e8m0 scale for MXFP4.
//! Each value is computed as llama.cpp's reference dequantization computes it, in float32, in
//! the same order of operations, so the results equal gguf-py's bit for bit.

use rsgl_kernels::int4::{e8m0_half, Int4Offset, Int4Row, E2M1_LEVELS, QBLOCK};
use rsgl_kernels::int8_block::{Int8BlockRow, HALF_BLOCK};
use rsgl_kernels::packed::{bf16_to_f32, f16_bytes_to_f32, f16_to_f32, f32_to_f16};

/// A GGUF tensor's storage type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Mxfp4,
}

/// GGUF's type ids (`ggml_type`) and names, those rsgl reads first.
const TYPES: &[(u32, &str, Option<GgmlType>)] = &[
    (0, "F32", Some(GgmlType::F32)),
    (1, "F16", Some(GgmlType::F16)),
    (2, "Q4_0", Some(GgmlType::Q4_0)),
    (3, "Q4_1", Some(GgmlType::Q4_1)),
    (6, "Q5_0", Some(GgmlType::Q5_0)),
    (7, "Q5_1", Some(GgmlType::Q5_1)),
    (8, "Q8_0", Some(GgmlType::Q8_0)),
    (10, "Q2_K", Some(GgmlType::Q2K)),
    (11, "Q3_K", Some(GgmlType::Q3K)),
    (12, "Q4_K", Some(GgmlType::Q4K)),
    (13, "Q5_K", Some(GgmlType::Q5K)),
    (14, "Q6_K", Some(GgmlType::Q6K)),
    (30, "BF16", Some(GgmlType::BF16)),
    (9, "Q8_1", None),
    (15, "Q8_K", None),
    (16, "IQ2_XXS", None),
    (17, "IQ2_XS", None),
    (18, "IQ3_XXS", None),
    (19, "IQ1_S", None),
    (20, "IQ4_NL", None),
    (21, "IQ3_S", None),
    (22, "IQ2_S", None),
    (23, "IQ4_XS", None),
    (24, "I8", None),
    (25, "I16", None),
    (26, "I32", None),
    (27, "I64", None),
    (28, "F64", None),
    (29, "IQ1_M", None),
    (34, "TQ1_0", None),
    (35, "TQ2_0", None),
    (39, "MXFP4", Some(GgmlType::Mxfp4)),
];

/// Values per K-quant super-block.
const QK_K: usize = 256;

impl GgmlType {
    /// The type with GGUF's numeric id, or None for ids rsgl does not read.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TYPES.iter().find(|(i, _, _)| *i == id).and_then(|(_, _, kind)| *kind)
    }

    /// llama.cpp's name for a type id, known or not, for error messages.
    pub fn id_name(id: u32) -> String {
        TYPES.iter().find(|(i, _, _)| *i == id).map_or_else(|| format!("type {id}"), |(_, name, _)| name.to_string())
    }

    pub fn name(self) -> &'static str {
        TYPES.iter().find(|(_, _, kind)| *kind == Some(self)).map(|(_, name, _)| *name).expect("every type is listed")
    }

    /// Values per block.
    pub fn block_values(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 | GgmlType::Mxfp4 => 32,
            GgmlType::Q2K | GgmlType::Q3K | GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K => QK_K,
        }
    }

    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q5_0 => 22,
            GgmlType::Q5_1 => 24,
            GgmlType::Q8_0 => 34,
            GgmlType::Q2K => 84,
            GgmlType::Q3K => 110,
            GgmlType::Q4K => 144,
            GgmlType::Q5K => 176,
            GgmlType::Q6K => 210,
            GgmlType::Mxfp4 => 17,
        }
    }

    /// The offset of this type's 4-bit blocks as the W4A8 kernels take them ([`int4_blocks`]),
    /// or None if it is not a 4-bit type they run.
    pub fn int4_offset(self) -> Option<Int4Offset> {
        match self {
            GgmlType::Q4_0 => Some(Int4Offset::Eight),
            GgmlType::Q4_1 | GgmlType::Q4K => Some(Int4Offset::Min),
            GgmlType::Mxfp4 => Some(Int4Offset::Mxfp4),
            _ => None,
        }
    }

    /// The bits of this type's quants in the 8-bit block kernels' blocks ([`int8_blocks`]), or
    /// None if it is not a type they run.
    pub fn int8_block_bits(self) -> Option<u32> {
        match self {
            GgmlType::Q8_0 => Some(8),
            GgmlType::Q6K => Some(6),
            GgmlType::Q5_0 => Some(5),
            _ => None,
        }
    }

    /// Bytes of a row of `cols` values, or None when `cols` is not a whole number of blocks.
    pub fn row_bytes(self, cols: usize) -> Option<usize> {
        cols.is_multiple_of(self.block_values()).then(|| cols / self.block_values() * self.block_bytes())
    }
}

fn half(bytes: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([bytes[at], bytes[at + 1]]))
}

/// Dequantizes one row: `bytes.len() == kind.row_bytes(out.len())`.
pub fn dequantize_row(kind: GgmlType, bytes: &[u8], out: &mut [f32]) {
    assert_eq!(Some(bytes.len()), kind.row_bytes(out.len()), "dequantize_row: {} bytes for {} {} values", bytes.len(), out.len(), kind.name());
    let blocks = bytes.chunks_exact(kind.block_bytes()).zip(out.chunks_exact_mut(kind.block_values()));
    match kind {
        GgmlType::F32 => out.iter_mut().zip(bytes.chunks_exact(4)).for_each(|(y, b)| *y = f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        GgmlType::F16 => f16_bytes_to_f32(bytes, out),
        GgmlType::BF16 => out.iter_mut().zip(bytes.chunks_exact(2)).for_each(|(y, b)| *y = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]))),
        GgmlType::Q4_0 => blocks.for_each(|(b, y)| nibbles(&b[2..18], 0, |q| (q as f32 - 8.0) * half(b, 0), y)),
        GgmlType::Q4_1 => blocks.for_each(|(b, y)| nibbles(&b[4..20], 0, |q| q as f32 * half(b, 0) + half(b, 2), y)),
        GgmlType::Q5_0 => blocks.for_each(|(b, y)| nibbles(&b[6..22], high_bits(&b[2..6]), |q| (q as f32 - 16.0) * half(b, 0), y)),
        GgmlType::Q5_1 => blocks.for_each(|(b, y)| nibbles(&b[8..24], high_bits(&b[4..8]), |q| q as f32 * half(b, 0) + half(b, 2), y)),
        GgmlType::Q8_0 => blocks.for_each(|(b, y)| {
            let d = half(b, 0);
            y.iter_mut().zip(&b[2..34]).for_each(|(v, &q)| *v = q as i8 as f32 * d);
        }),
        GgmlType::Q2K => blocks.for_each(|(b, y)| q2_k(b, y)),
        GgmlType::Q3K => blocks.for_each(|(b, y)| q3_k(b, y)),
        GgmlType::Q4K => blocks.for_each(|(b, y)| q4_k(b, y)),
        GgmlType::Q5K => blocks.for_each(|(b, y)| q5_k(b, y)),
        GgmlType::Q6K => blocks.for_each(|(b, y)| q6_k(b, y)),
        GgmlType::Mxfp4 => blocks.for_each(|(b, y)| nibbles(&b[1..17], 0, |q| e2m1_value(q) * e8m0_half(b[0]), y)),
    }
}

/// Twice the value of an e2m1 code (llama.cpp's `kvalues_mxfp4`): an MXFP4 value is this
/// times half its block's scale, [`e8m0_half`].
pub fn e2m1_value(q: u8) -> f32 {
    E2M1_LEVELS[q as usize] as f32 - 12.0
}

/// A 4-bit row as the W4A8 kernels' blocks of 32 (`kind` has an [`GgmlType::int4_offset`]
/// `offset` can be read as, see [`reads_as`]):
/// - Q4_0 and Q4_1 blocks as they are (bytes copied); a Q4_0 block asked for with a minimum
///   gets `-8 d`, exact in f16.
/// - MXFP4 blocks as they are: codes copied, the e8m0 byte as the scale.
/// - Q4_K: each 32-value sub-block with scale `d * sc` and minimum `-(dmin * m)`, products of
///   an f16 and a 6-bit integer rounded to f16 (at most 2^-11 relative, far below the 4-bit
///   step); the nibbles move to the classic order (byte `j`: values `j` and `j + 16`).
pub fn int4_blocks(kind: GgmlType, bytes: &[u8], out: &mut Int4Row, offset: Int4Offset) {
    assert_eq!(Some(bytes.len()), kind.row_bytes(out.scales.len() * QBLOCK), "int4_blocks: {} bytes of {}", bytes.len(), kind.name());
    assert!(reads_as(kind, offset), "int4_blocks: {} blocks cannot be read with offset {offset:?}", kind.name());
    let half_bits = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
    let blocks = bytes.chunks_exact(kind.block_bytes());
    match kind {
        GgmlType::Q4_0 | GgmlType::Q4_1 => {
            for (b, block) in blocks.enumerate() {
                out.scales[b] = half_bits(block, 0);
                out.nibbles[b * 16..][..16].copy_from_slice(&block[block.len() - 16..]);
                out.mins[b] = match (kind, offset) {
                    (GgmlType::Q4_1, _) => half_bits(block, 2),
                    (_, Int4Offset::Min) => f32_to_f16(-8.0 * half(block, 0)),
                    (_, Int4Offset::Eight | Int4Offset::Mxfp4) => 0,
                };
            }
        }
        GgmlType::Mxfp4 => {
            for (b, block) in blocks.enumerate() {
                out.scales[b] = block[0] as u16;
                out.nibbles[b * 16..][..16].copy_from_slice(&block[1..17]);
                out.mins[b] = 0;
            }
        }
        GgmlType::Q4K => {
            for (sb, block) in blocks.enumerate() {
                let (d, min, scales, qs) = (half(block, 0), half(block, 2), &block[4..16], &block[16..144]);
                for sub in 0..QK_K / QBLOCK {
                    let b = sb * QK_K / QBLOCK + sub;
                    let (sc, m) = scale_min_k4(sub, scales);
                    out.scales[b] = f32_to_f16(d * sc);
                    out.mins[b] = f32_to_f16(-(min * m));
                    // Sub-block 2p + h is the low (h = 0) or high nibbles of bytes 32p..32p + 32.
                    let value = |l: usize| (qs[sub / 2 * 32 + l] >> (4 * (sub % 2))) & 0x0f;
                    for j in 0..16 {
                        out.nibbles[b * 16 + j] = value(j) | (value(j + 16) << 4);
                    }
                }
            }
        }
        other => panic!("int4_blocks: {} is not a 4-bit type the kernels run", other.name()),
    }
}

/// Whether `kind`'s rows can be read as 4-bit blocks with `offset` exactly: their own offset,
/// or the form with minimums for those with a fixed offset 8 or their own minimums.
pub fn reads_as(kind: GgmlType, offset: Int4Offset) -> bool {
    match kind.int4_offset() {
        Some(own) => own == offset || (offset == Int4Offset::Min && own != Int4Offset::Mxfp4),
        None => false,
    }
}

/// A Q8_0, Q5_0 or Q6_K row as the 8-bit block kernels' blocks: Q8_0's quants plus 128 with its
/// scale on both halves of each block; Q5_0's 5-bit quants as they are (offset 16), likewise;
/// Q6_K's 6-bit quants as they are (offset 32) with each 16 values' scale `d * sc` rounded to
/// f16 (at most 2^-11 relative).
pub fn int8_blocks(kind: GgmlType, bytes: &[u8], out: &mut Int8BlockRow) {
    assert_eq!(Some(bytes.len()), kind.row_bytes(out.quants.len()), "int8_blocks: {} bytes of {}", bytes.len(), kind.name());
    let blocks = bytes.chunks_exact(kind.block_bytes());
    match kind {
        GgmlType::Q8_0 => {
            for (b, block) in blocks.enumerate() {
                let scale = u16::from_le_bytes([block[0], block[1]]);
                out.scales[2 * b..2 * b + 2].fill(scale);
                for (q, &v) in out.quants[b * 32..][..32].iter_mut().zip(&block[2..34]) {
                    *q = (v as i8 as i16 + 128) as u8;
                }
            }
        }
        GgmlType::Q5_0 => {
            for (b, block) in blocks.enumerate() {
                out.scales[2 * b..2 * b + 2].fill(u16::from_le_bytes([block[0], block[1]]));
                let fifth = high_bits(&block[2..6]);
                let high = |bit: usize| (((fifth >> bit) & 1) << 4) as u8;
                for (j, &q) in block[6..22].iter().enumerate() {
                    out.quants[b * 32 + j] = (q & 0x0f) | high(j);
                    out.quants[b * 32 + j + 16] = (q >> 4) | high(j + 16);
                }
            }
        }
        GgmlType::Q6K => {
            for (sb, block) in blocks.enumerate() {
                let (scales, d) = (&block[192..208], half(block, 208));
                for (sub, &sc) in scales.iter().enumerate() {
                    out.scales[sb * QK_K / HALF_BLOCK + sub] = f32_to_f16(d * sc as i8 as f32);
                }
                q6_k_quants(block, |i, q| out.quants[sb * QK_K + i] = q);
            }
        }
        other => panic!("int8_blocks: {} is not a type the 8-bit block kernels run", other.name()),
    }
}

/// The 32-bit word of a Q5 block's fifth bits.
fn high_bits(qh: &[u8]) -> u32 {
    u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]])
}

/// A 32-value block of nibbles: value `j < 16` is the low nibble of byte `j`, value `j + 16` its
/// high nibble; bit `j` of `fifth` adds 16 to value `j` (Q5 types).
fn nibbles(qs: &[u8], fifth: u32, value: impl Fn(u8) -> f32, y: &mut [f32]) {
    for (j, &q) in qs.iter().enumerate() {
        let high = |bit: usize| (((fifth >> bit) & 1) << 4) as u8;
        y[j] = value((q & 0x0f) | high(j));
        y[j + 16] = value((q >> 4) | high(j + 16));
    }
}

/// Q2_K: 16 sub-blocks of 16 two-bit values; 4-bit scale and minimum per sub-block.
fn q2_k(b: &[u8], y: &mut [f32]) {
    let (scales, qs) = (&b[..16], &b[16..80]);
    let (d, min) = (half(b, 80), half(b, 82));
    let mut sub = 0;
    for (n, q) in qs.chunks_exact(32).enumerate() {
        for shift in (0..8).step_by(2) {
            for half_block in 0..2 {
                let sc = scales[sub];
                sub += 1;
                let (dl, ml) = (d * (sc & 0x0f) as f32, min * (sc >> 4) as f32);
                let base = n * 128 + shift / 2 * 32 + half_block * 16;
                for l in 0..16 {
                    y[base + l] = dl * ((q[half_block * 16 + l] >> shift) & 3) as f32 - ml;
                }
            }
        }
    }
}

/// Q3_K: 16 sub-blocks of 16 three-bit values (two low bits, a high bit in `hmask`); 6-bit
/// signed scales packed into 12 bytes.
fn q3_k(b: &[u8], y: &mut [f32]) {
    let (hmask, qs, packed) = (&b[..32], &b[32..96], &b[96..108]);
    let d = half(b, 108);
    let scales: [i8; 16] = std::array::from_fn(|i| {
        let low = if i < 8 { packed[i] & 0x0f } else { packed[i - 8] >> 4 };
        let high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
        (low | (high << 4)) as i8 - 32
    });
    let mut sub = 0;
    for (n, q) in qs.chunks_exact(32).enumerate() {
        for (step, shift) in (0..8).step_by(2).enumerate() {
            let bit = 1u8 << (n * 4 + step);
            for half_block in 0..2 {
                let dl = d * scales[sub] as f32;
                sub += 1;
                let base = n * 128 + step * 32 + half_block * 16;
                for l in 0..16 {
                    let i = half_block * 16 + l;
                    let low = ((q[i] >> shift) & 3) as i8;
                    y[base + l] = dl * (low - if hmask[i] & bit != 0 { 0 } else { 4 }) as f32;
                }
            }
        }
    }
}

/// The 6-bit scale and minimum of sub-block `j` of a Q4_K / Q5_K super-block.
fn scale_min_k4(j: usize, q: &[u8]) -> (f32, f32) {
    let (d, m) = if j < 4 { (q[j] & 63, q[j + 4] & 63) } else { ((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)) };
    (d as f32, m as f32)
}

/// Q4_K: 8 sub-blocks of 32 four-bit values, each with a 6-bit scale and minimum.
fn q4_k(b: &[u8], y: &mut [f32]) {
    let (d, min, scales, qs) = (half(b, 0), half(b, 2), &b[4..16], &b[16..144]);
    for (pair, q) in qs.chunks_exact(32).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * pair, scales);
        let (sc2, m2) = scale_min_k4(2 * pair + 1, scales);
        let (d1, min1, d2, min2) = (d * sc1, min * m1, d * sc2, min * m2);
        for l in 0..32 {
            y[pair * 64 + l] = d1 * (q[l] & 0x0f) as f32 - min1;
            y[pair * 64 + 32 + l] = d2 * (q[l] >> 4) as f32 - min2;
        }
    }
}

/// Q5_K: Q4_K with a fifth bit per value in `qh`.
fn q5_k(b: &[u8], y: &mut [f32]) {
    let (d, min, scales, qh, qs) = (half(b, 0), half(b, 2), &b[4..16], &b[16..48], &b[48..176]);
    for (pair, q) in qs.chunks_exact(32).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * pair, scales);
        let (sc2, m2) = scale_min_k4(2 * pair + 1, scales);
        let (d1, min1, d2, min2) = (d * sc1, min * m1, d * sc2, min * m2);
        let (u1, u2) = (1u8 << (2 * pair), 2u8 << (2 * pair));
        for l in 0..32 {
            let fifth = |mask: u8| if qh[l] & mask != 0 { 16.0 } else { 0.0 };
            y[pair * 64 + l] = d1 * ((q[l] & 0x0f) as f32 + fifth(u1)) - min1;
            y[pair * 64 + 32 + l] = d2 * ((q[l] >> 4) as f32 + fifth(u2)) - min2;
        }
    }
}

/// Q6_K: 16 sub-blocks of 16 six-bit values, each with an 8-bit signed scale.
fn q6_k(b: &[u8], y: &mut [f32]) {
    let (scales, d) = (&b[192..208], half(b, 208));
    q6_k_quants(b, |i, q| y[i] = d * scales[i / 16] as i8 as f32 * (q as i8 - 32) as f32);
}

/// Calls `f(i, q)` with each of a Q6_K super-block's 256 quants (0..=63, offset 32): four low
/// bits in `ql`, two high ones in `qh`; value `i` belongs to sub-block `i / 16`.
fn q6_k_quants(b: &[u8], mut f: impl FnMut(usize, u8)) {
    let (ql, qh) = (&b[..128], &b[128..192]);
    for n in 0..2 {
        let (ql, qh) = (&ql[n * 64..], &qh[n * 32..]);
        for l in 0..32 {
            let quant = |low: u8, shift: u32| low | (((qh[l] >> shift) & 3) << 4);
            f(n * 128 + l, quant(ql[l] & 0x0f, 0));
            f(n * 128 + l + 32, quant(ql[l + 32] & 0x0f, 2));
            f(n * 128 + l + 64, quant(ql[l] >> 4, 4));
            f(n * 128 + l + 96, quant(ql[l + 32] >> 4, 6));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_whole_blocks() {
        assert_eq!(GgmlType::Q4K.row_bytes(512), Some(288));
        assert_eq!(GgmlType::Q8_0.row_bytes(33), None);
        assert_eq!(GgmlType::F16.row_bytes(7), Some(14));
        assert_eq!(GgmlType::from_id(12), Some(GgmlType::Q4K));
        assert_eq!((GgmlType::from_id(16), GgmlType::id_name(16), GgmlType::id_name(99)), (None, "IQ2_XXS".into(), "type 99".into()));
        assert_eq!(GgmlType::Q6K.name(), "Q6_K");
    }

    /// The 4-bit blocks of every type the kernels run give the values llama.cpp's dequantization
    /// gives (Q4_K within its scales' f16 rounding).
    #[test]
    fn int4_blocks_hold_the_dequantized_values() {
        let cols = 512;
        for kind in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q4K] {
            // Arbitrary bytes with small f16 scales: every bit pattern is a valid block.
            let mut bytes: Vec<u8> = (0..kind.row_bytes(cols).unwrap()).map(|i| (i * 151 % 251) as u8).collect();
            for block in bytes.chunks_exact_mut(kind.block_bytes()) {
                let halves = if kind == GgmlType::Q4_0 { 1 } else { 2 };
                for h in 0..halves {
                    block[2 * h..2 * h + 2].copy_from_slice(&f32_to_f16(0.01 + 0.002 * h as f32).to_le_bytes());
                }
            }
            let mut want = vec![0.0; cols];
            dequantize_row(kind, &bytes, &mut want);
            for offset in [Int4Offset::Eight, Int4Offset::Min] {
                if offset == Int4Offset::Eight && kind.int4_offset() != Some(Int4Offset::Eight) {
                    continue;
                }
                let mut row = Int4Row::new(cols);
                int4_blocks(kind, &bytes, &mut row, offset);
                for (i, want) in want.iter().enumerate() {
                    let (b, j) = (i / QBLOCK, i % QBLOCK);
                    let q = (row.nibbles[b * 16 + j % 16] >> (4 * (j / 16))) & 0x0f;
                    let (d, m) = (f16_to_f32(row.scales[b]), f16_to_f32(row.mins[b]));
                    let got = if offset == Int4Offset::Eight { d * (q as f32 - 8.0) } else { d * q as f32 + m };
                    // Each f16-rounded scale or minimum is within 2^-11 of its product.
                    let tol = ((d * q as f32).abs() + m.abs()) / 2048.0 + 1e-6;
                    assert!((got - want).abs() <= tol, "{} {offset:?} value {i}: {got} vs {want}", kind.name());
                }
            }
        }
    }

    /// The 8-bit blocks of Q8_0, Q5_0 and Q6_K give llama.cpp's dequantized values (Q6_K within
    /// its scales' f16 rounding).
    #[test]
    fn int8_blocks_hold_the_dequantized_values() {
        let cols = 512;
        for kind in [GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q6K] {
            let mut bytes: Vec<u8> = (0..kind.row_bytes(cols).unwrap()).map(|i| (i * 151 % 251) as u8).collect();
            for block in bytes.chunks_exact_mut(kind.block_bytes()) {
                let at = if kind == GgmlType::Q6K { 208 } else { 0 };
                block[at..at + 2].copy_from_slice(&f32_to_f16(0.01).to_le_bytes());
            }
            let mut want = vec![0.0; cols];
            dequantize_row(kind, &bytes, &mut want);
            let mut row = Int8BlockRow::new(cols);
            int8_blocks(kind, &bytes, &mut row);
            let offset = (1 << (kind.int8_block_bits().unwrap() - 1)) as f32;
            for (i, want) in want.iter().enumerate() {
                let got = (row.quants[i] as f32 - offset) * f16_to_f32(row.scales[i / HALF_BLOCK]);
                assert!((got - want).abs() <= want.abs() / 2048.0 + 1e-6, "{} value {i}: {got} vs {want}", kind.name());
            }
        }
    }

    /// MXFP4 blocks (arbitrary codes, e8m0 bytes over their range) read as the kernels' blocks
    /// as they are, and dequantize to code value times scale.
    #[test]
    fn mxfp4_blocks_read_as_stored() {
        let cols = 256;
        let kind = GgmlType::from_id(39).unwrap();
        let bytes: Vec<u8> = (0..kind.row_bytes(cols).unwrap()).map(|i| if i % 17 == 0 { (i * 37 % 252) as u8 } else { (i * 151 % 251) as u8 }).collect();
        let mut values = vec![0.0; cols];
        dequantize_row(kind, &bytes, &mut values);
        let mut row = Int4Row::new(cols);
        assert!(reads_as(kind, Int4Offset::Mxfp4) && !reads_as(kind, Int4Offset::Min) && !reads_as(GgmlType::Q4_0, Int4Offset::Mxfp4));
        int4_blocks(kind, &bytes, &mut row, Int4Offset::Mxfp4);
        for (i, got) in values.iter().enumerate() {
            let (b, j) = (i / QBLOCK, i % QBLOCK);
            let block = &bytes[b * 17..(b + 1) * 17];
            let code = (block[1 + j % 16] >> (4 * (j / 16))) & 0x0f;
            assert_eq!(row.scales[b], block[0] as u16);
            assert_eq!((row.nibbles[b * 16 + j % 16] >> (4 * (j / 16))) & 0x0f, code);
            const E2M1: [f64; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
            let want = E2M1[code as usize % 8] * if code >= 8 { -1.0 } else { 1.0 } * 2f64.powi(block[0] as i32 - 127);
            assert_eq!(*got as f64, want, "value {i}");
        }
    }

    #[test]
    fn classic_blocks_dequantize_by_hand() {
        // Q4_0: scale 0.5 (f16 0x3800); byte j holds value j (low) and j + 16 (high).
        let mut block = vec![0x00, 0x38];
        block.extend((0..16u8).map(|j| (15 - j) << 4 | j));
        let mut y = [0.0; 32];
        dequantize_row(GgmlType::Q4_0, &block, &mut y);
        assert_eq!((y[0], y[15], y[16], y[31]), (-4.0, 3.5, 3.5, -4.0));
        // Q8_0: scale 2, values -128..
        let mut block = vec![0x00, 0x40];
        block.extend((0..32).map(|j| (j as i8 - 16) as u8));
        dequantize_row(GgmlType::Q8_0, &block, &mut y);
        assert_eq!((y[0], y[16], y[31]), (-32.0, 0.0, 30.0));
        // Q5_1: scale 1, minimum -1, fifth bit set on value 3 only.
        let mut block = vec![0x00, 0x3c, 0x00, 0xbc, 0b1000, 0, 0, 0];
        block.extend([0x21; 16]);
        dequantize_row(GgmlType::Q5_1, &block, &mut y);
        assert_eq!((y[0], y[3], y[16]), (0.0, 16.0, 1.0));
    }
}
