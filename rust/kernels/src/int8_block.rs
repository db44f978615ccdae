//! Weights of up to 8 bits in blocks of [`QBLOCK`] inputs with an f16 scale per half block (16
//! inputs) and output, for GGUF's Q8_0 (one scale per block: both halves carry it), Q6_K (a scale
//! per 16 values) and Q5_0, multiplied by activations quantized per block ([`QuantizedBlocks`])
//! with 8-bit integer dot products.
//!
//! Quants are unsigned, `q = w + offset` with the offset `2^(bits - 1)` of their width: 128 for
//! Q8_0's signed quants, 32 for Q6_K's 6-bit ones, 16 for Q5_0's 5-bit ones. `vpdpbusd` takes
//! them as they are, the other paths subtract the offset first. A Q8_0 quant of -128
//! (llama.cpp's quantizer never writes one) is read as -127, so that `|w| <= 127` and AVX2's sign
//! trick cannot overflow.
//!
//! Layout: panels of [`PANEL`] outputs, one record per block: the quants, then 16 f16 scales of
//! the first half, then 16 of the second. The quants are 8 chunks of 64 bytes (chunk `g`: output
//! `o`'s inputs `4g..4g + 4` at bytes `4o..4o + 4`), stored as they are at 8 bits; narrower
//! quants keep each chunk byte's place but not its width, so a decode step reads only their
//! bits (5 or 6 of 8) and every vector width unpacks them the same way: byte `i` of chunk `g`
//! is the low (`g < 4`) or high nibble of byte `i` of nibble chunk `g % 4` (256 bytes), plus its
//! upper `bits - 4` bits from field `g % fields` of byte `i` of upper chunk `g / fields` (64 or
//! 128 bytes after the nibbles; `fields = 8 / (bits - 4)` fields to a byte).
//!
//! Every path computes the same bits: per block and half `h`, with `s_h = Σ (q - offset) q_x`
//! (exact) and `dx` the activation block's scale, `acc = fma(s_h as f32, d_h * dx, acc)`, the
//! first half first.

use crate::int4::QBLOCK;
use crate::memory::Frozen;
use crate::packed::{f16_to_f32, f32_to_f16, PANEL};
use crate::pool::{SendPtr, ThreadPool};

/// Inputs per scale.
pub const HALF_BLOCK: usize = QBLOCK / 2;
/// Bytes of one 8-bit chunk: a panel's 16 outputs x 4 inputs.
pub const CHUNK_BYTES: usize = 64;
/// Bytes of the nibbles of narrower quants: 4 chunks' worth.
pub const NIBBLE_BYTES: usize = 4 * CHUNK_BYTES;
/// Bytes of a record's scales: two sets of 16 f16 scales.
const SCALE_BYTES: usize = 2 * 2 * PANEL;

/// Bytes of one record's quants at `bits` per quant (8, 6 or 5).
pub const fn quant_bytes(bits: u32) -> usize {
    PANEL * QBLOCK * bits as usize / 8
}

/// Bytes of one record at `bits` per quant.
pub const fn record_bytes(bits: u32) -> usize {
    quant_bytes(bits) + SCALE_BYTES
}

/// Fields of upper bits in one byte of an upper chunk, for quants of `bits` (< 8).
pub const fn upper_fields(bits: u32) -> usize {
    8 / (bits as usize - 4)
}

/// Byte `i` of 8-bit chunk `g` of a record's quants.
#[inline(always)]
pub fn quant(quants: &[u8], bits: u32, g: usize, i: usize) -> u8 {
    if bits == 8 {
        return quants[CHUNK_BYTES * g + i];
    }
    let low = quants[CHUNK_BYTES * (g % 4) + i] >> (4 * (g / 4)) & 0x0f;
    let fields = upper_fields(bits);
    let width = bits - 4;
    let upper = quants[NIBBLE_BYTES + CHUNK_BYTES * (g / fields) + i] >> (width as usize * (g % fields)) & ((1 << width) - 1);
    low | upper << 4
}

/// Writes `q` as byte `i` of 8-bit chunk `g` of a record's quants (the inverse of [`quant`]).
fn set_quant(quants: &mut [u8], bits: u32, g: usize, i: usize, q: u8) {
    if bits == 8 {
        quants[CHUNK_BYTES * g + i] = q;
        return;
    }
    let nibble = &mut quants[CHUNK_BYTES * (g % 4) + i];
    let shift = 4 * (g / 4);
    *nibble = *nibble & !(0x0f << shift) | (q & 0x0f) << shift;
    let fields = upper_fields(bits);
    let width = bits as usize - 4;
    let (mask, shift) = ((1u8 << width) - 1, width * (g % fields));
    let upper = &mut quants[NIBBLE_BYTES + CHUNK_BYTES * (g / fields) + i];
    *upper = *upper & !(mask << shift) | (q >> 4 & mask) << shift;
}

/// One output row as a checkpoint stores it: the offset quants and a scale (f16 bits) per 16.
pub struct Int8BlockRow {
    pub quants: Vec<u8>,
    pub scales: Vec<u16>,
}

impl Int8BlockRow {
    pub fn new(k: usize) -> Int8BlockRow {
        Int8BlockRow { quants: vec![0; k], scales: vec![0; k / HALF_BLOCK] }
    }
}

pub struct Int8BlockWeights {
    /// Output rows.
    pub n: usize,
    /// Inner dimension, a multiple of [`QBLOCK`].
    pub k: usize,
    /// Bits per quant: 8, 6 or 5.
    pub bits: u32,
    /// `[panel][block]` records.
    pub data: Frozen<u8>,
}

impl Int8BlockWeights {
    /// Quantizes a row-major `[n, k]` float matrix symmetrically per 16 values to quants of
    /// `bits` (tests and benchmarks).
    pub fn quantize(w: &[f32], n: usize, k: usize, bits: u32) -> Int8BlockWeights {
        assert_eq!(w.len(), n * k, "quantize: weights must be [n, k]");
        let top = ((1 << (bits - 1)) - 1) as f32;
        Self::pack_rows(n, k, bits, &ThreadPool::new(1, false), &|row, out| {
            for (h, values) in w[row * k..(row + 1) * k].chunks_exact(HALF_BLOCK).enumerate() {
                let d = values.iter().fold(0f32, |m, v| m.max(v.abs())) / top;
                let d = f16_to_f32(f32_to_f16(d));
                out.scales[h] = f32_to_f16(d);
                for (q, v) in out.quants[h * HALF_BLOCK..][..HALF_BLOCK].iter_mut().zip(values) {
                    *q = (if d > 0.0 { (v / d).round().clamp(-top, top) } else { 0.0 } as i32 + (1 << (bits - 1))) as u8;
                }
            }
        })
    }

    /// Packs an `[n, k]` matrix of `bits`-bit quants (offset by `2^(bits - 1)`) whose rows
    /// `read_row(row, out)` writes, panel by panel on the threads of `pool`.
    pub fn pack_rows(n: usize, k: usize, bits: u32, pool: &ThreadPool, read_row: &(dyn Fn(usize, &mut Int8BlockRow) + Sync)) -> Int8BlockWeights {
        assert!(k.is_multiple_of(QBLOCK), "8-bit block weights need whole blocks of {QBLOCK} inputs, not {k}");
        assert!(matches!(bits, 5 | 6 | 8), "8-bit block weights hold quants of 8, 6 or 5 bits, not {bits}");
        let layout = Int8BlockWeights { n, k, bits, data: Frozen::from_slice(&[]) };
        let (stride, panels, offset) = (layout.panel_stride(), layout.panels(), layout.offset());
        let (record, quants) = (record_bytes(bits), quant_bytes(bits));
        // Quants below `offset - 127` would be weights under -127 (see the module doc).
        let lowest = offset.saturating_sub(127);
        let data = Frozen::filled(panels * stride, |out: &mut [u8]| {
            let dst = SendPtr(out.as_mut_ptr());
            pool.for_ranges(panels, &|panels| {
                let mut row = Int8BlockRow::new(k);
                for p in panels {
                    // SAFETY: panel `p` owns its `stride` bytes.
                    let packed = unsafe { std::slice::from_raw_parts_mut(dst.get().add(p * stride), stride) };
                    let rows = PANEL.min(n - p * PANEL);
                    if rows < PANEL {
                        // Rows past `n` hold zero weights: quants at the offset.
                        for rec in packed.chunks_exact_mut(record) {
                            for o in rows..PANEL {
                                (0..QBLOCK).for_each(|j| set_quant(rec, bits, j / 4, 4 * o + j % 4, offset));
                            }
                        }
                    }
                    for o in 0..rows {
                        read_row(p * PANEL + o, &mut row);
                        for (b, rec) in packed.chunks_exact_mut(record).enumerate() {
                            for (j, &q) in row.quants[b * QBLOCK..][..QBLOCK].iter().enumerate() {
                                set_quant(rec, bits, j / 4, 4 * o + j % 4, q.max(lowest));
                            }
                            for h in 0..2 {
                                rec[quants + h * 2 * PANEL + 2 * o..][..2].copy_from_slice(&row.scales[2 * b + h].to_le_bytes());
                            }
                        }
                    }
                }
            });
        });
        Int8BlockWeights { data, ..layout }
    }

    /// What the stored quants are offset by: `2^(bits - 1)`.
    pub fn offset(&self) -> u8 {
        1 << (self.bits - 1)
    }

    pub fn blocks(&self) -> usize {
        self.k / QBLOCK
    }

    pub fn panels(&self) -> usize {
        self.n.div_ceil(PANEL)
    }

    /// Bytes of one record.
    pub fn record_bytes(&self) -> usize {
        record_bytes(self.bits)
    }

    /// Where a record's scales start.
    pub fn scales_at(&self) -> usize {
        quant_bytes(self.bits)
    }

    /// Bytes from one panel's start to the next.
    pub fn panel_stride(&self) -> usize {
        self.blocks() * self.record_bytes()
    }

    /// Bytes a pass over the weights reads (what bounds decode).
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Block `b` of panel `p`: its record.
    #[inline(always)]
    pub fn record(&self, p: usize, b: usize) -> *const u8 {
        // SAFETY (of callers' reads): records lie inside `data` for p < panels, b < blocks.
        unsafe { self.data.as_ptr().add(p * self.panel_stride() + b * self.record_bytes()) }
    }

    /// Output `o`'s weight `j` (< 32) of a record, offset removed.
    pub fn weight(&self, rec: &[u8], o: usize, j: usize) -> i32 {
        quant(rec, self.bits, j / 4, 4 * o + j % 4) as i32 - self.offset() as i32
    }

    /// Output `o`'s scale of half `h` of a record.
    pub fn scale(&self, rec: &[u8], o: usize, h: usize) -> f32 {
        let at = self.scales_at() + h * 2 * PANEL + 2 * o;
        f16_to_f32(u16::from_le_bytes([rec[at], rec[at + 1]]))
    }

    /// Row `row` dequantized (embedding look-ups of a tied lm_head).
    pub fn row(&self, row: usize) -> Vec<f32> {
        assert!(row < self.n);
        let (p, o) = (row / PANEL, row % PANEL);
        let panel = &self.data[p * self.panel_stride()..][..self.panel_stride()];
        panel
            .chunks_exact(self.record_bytes())
            .flat_map(|rec| (0..QBLOCK).map(move |j| self.weight(rec, o, j) as f32 * self.scale(rec, o, j / HALF_BLOCK)))
            .collect()
    }
}

/// Calls `$f::<BITS>$args` with the weights' bits per quant as a constant, so each kernel is
/// compiled once per width.
macro_rules! by_quant_bits {
    ($bits:expr, $f:ident, $args:tt) => {
        match $bits {
            8 => $f::<8> $args,
            6 => $f::<6> $args,
            5 => $f::<5> $args,
            bits => unreachable!("no 8-bit block kernel for {bits}-bit quants"),
        }
    };
}
pub(crate) use by_quant_bits;

/// One half block's step of an output's sum (the float epilogue every path keeps).
#[inline(always)]
pub fn accumulate_half(acc: f32, s: i32, dx: f32, d: f32) -> f32 {
    (s as f32).mul_add(d * dx, acc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_dequantize_within_half_a_step() {
        let (n, k) = (19, 64);
        let w: Vec<f32> = (0..n * k).map(|i| ((i as f32 + 2.0) * 0.731).sin()).collect();
        for bits in [8, 6, 5] {
            let q = Int8BlockWeights::quantize(&w, n, k, bits);
            assert_eq!(q.bytes(), q.panels() * q.blocks() * (PANEL * QBLOCK * bits as usize / 8 + 64));
            for r in 0..n {
                for (got, want) in q.row(r).chunks(HALF_BLOCK).zip(w[r * k..(r + 1) * k].chunks(HALF_BLOCK)) {
                    let step = want.iter().fold(0f32, |m, v| m.max(v.abs())) / ((1 << (bits - 1)) - 1) as f32;
                    for (g, v) in got.iter().zip(want) {
                        assert!((g - v).abs() <= step * 0.51 + 1e-4, "{bits} bits, row {r}: {g} vs {v}");
                    }
                }
            }
        }
    }

    /// Every quant of every width reads back from where it was written, beside any others.
    #[test]
    fn quants_read_back_at_every_width() {
        for bits in [8, 6, 5] {
            let mut rec = vec![0u8; quant_bytes(bits)];
            let value = |at: usize| ((at * 37 + 11) % (1 << bits)) as u8;
            for at in 0..QBLOCK * PANEL {
                set_quant(&mut rec, bits, at / CHUNK_BYTES, at % CHUNK_BYTES, value(at));
            }
            for at in 0..QBLOCK * PANEL {
                assert_eq!(quant(&rec, bits, at / CHUNK_BYTES, at % CHUNK_BYTES), value(at), "{bits} bits, byte {at}");
            }
        }
    }

    #[test]
    fn quants_under_minus_127_read_as_minus_127() {
        let w = Int8BlockWeights::pack_rows(1, 32, 8, &ThreadPool::new(1, false), &|_, out| {
            out.quants.fill(0);
            out.scales.fill(f32_to_f16(1.0));
        });
        assert!(w.row(0).iter().all(|&v| v == -127.0));
    }
}
