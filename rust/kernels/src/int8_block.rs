//! 8-bit weights in blocks of [`QBLOCK`] inputs with an f16 scale per half block (16 inputs)
//! and output, for GGUF's Q8_0 (one scale per block: both halves carry it) and Q6_K (a scale
//! per 16 values), multiplied by activations quantized per block ([`QuantizedBlocks`]).
//!
//! Quants are stored as unsigned bytes `q = w + offset`, one offset per matrix (128 for Q8_0's
//! signed quants, 32 for Q6_K's 6-bit ones): `vpdpbusd` takes them as they are, the other
//! paths subtract the offset first. A Q8_0 quant of -128 (llama.cpp's quantizer never writes
//! one) is read as -127, so that `|w| <= 127` and AVX2's sign trick cannot overflow.
//!
//! Layout: panels of [`PANEL`] outputs, one record per block: 8 chunks of 64 bytes (chunk `g`:
//! output `o`'s inputs `4g..4g + 4` at bytes `4o..4o + 4`), then 16 f16 scales of the first
//! half, then 16 of the second.
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
/// Bytes of one record's quants: a panel's 16 outputs x 32 bytes.
pub const QUANT_BYTES: usize = PANEL * QBLOCK;
/// Bytes of a record: quants, then two sets of 16 f16 scales.
pub const RECORD_BYTES: usize = QUANT_BYTES + 2 * 2 * PANEL;

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
    /// What the stored quants are offset by.
    pub offset: u8,
    /// `[panel][block]` records.
    pub data: Frozen<u8>,
}

impl Int8BlockWeights {
    /// Quantizes a row-major `[n, k]` float matrix symmetrically per 16 values (tests).
    pub fn quantize(w: &[f32], n: usize, k: usize) -> Int8BlockWeights {
        assert_eq!(w.len(), n * k, "quantize: weights must be [n, k]");
        Self::pack_rows(n, k, 128, &ThreadPool::new(1, false), &|row, out| {
            for (h, values) in w[row * k..(row + 1) * k].chunks_exact(HALF_BLOCK).enumerate() {
                let d = values.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
                let d = f16_to_f32(f32_to_f16(d));
                out.scales[h] = f32_to_f16(d);
                for (q, v) in out.quants[h * HALF_BLOCK..][..HALF_BLOCK].iter_mut().zip(values) {
                    *q = (if d > 0.0 { (v / d).round().clamp(-127.0, 127.0) } else { 0.0 } as i32 + 128) as u8;
                }
            }
        })
    }

    /// Packs an `[n, k]` matrix whose rows `read_row(row, out)` writes (quants offset by
    /// `offset`), panel by panel on the threads of `pool`.
    pub fn pack_rows(n: usize, k: usize, offset: u8, pool: &ThreadPool, read_row: &(dyn Fn(usize, &mut Int8BlockRow) + Sync)) -> Int8BlockWeights {
        assert!(k.is_multiple_of(QBLOCK), "8-bit block weights need whole blocks of {QBLOCK} inputs, not {k}");
        let layout = Int8BlockWeights { n, k, offset, data: Frozen::from_slice(&[]) };
        let (stride, panels) = (layout.panel_stride(), layout.panels());
        // Quants below `offset - 127` would be weights under -127 (see the module doc).
        let lowest = offset.saturating_sub(127);
        let data = Frozen::filled(panels * stride, |out: &mut [u8]| {
            let dst = SendPtr(out.as_mut_ptr());
            pool.for_ranges(panels, &|panels| {
                let mut row = Int8BlockRow::new(k);
                for p in panels {
                    // SAFETY: panel `p` owns its `stride` bytes.
                    let packed = unsafe { std::slice::from_raw_parts_mut(dst.get().add(p * stride), stride) };
                    for rec in packed.chunks_exact_mut(RECORD_BYTES) {
                        // Rows past `n` hold zero weights: quants at the offset.
                        rec[..QUANT_BYTES].fill(offset);
                    }
                    for o in 0..PANEL.min(n - p * PANEL) {
                        read_row(p * PANEL + o, &mut row);
                        for (b, rec) in packed.chunks_exact_mut(RECORD_BYTES).enumerate() {
                            for (g, four) in row.quants[b * QBLOCK..][..QBLOCK].chunks_exact(4).enumerate() {
                                for (dst, &q) in rec[g * 64 + 4 * o..][..4].iter_mut().zip(four) {
                                    *dst = q.max(lowest);
                                }
                            }
                            for h in 0..2 {
                                rec[QUANT_BYTES + h * 2 * PANEL + 2 * o..][..2].copy_from_slice(&row.scales[2 * b + h].to_le_bytes());
                            }
                        }
                    }
                }
            });
        });
        Int8BlockWeights { data, ..layout }
    }

    pub fn blocks(&self) -> usize {
        self.k / QBLOCK
    }

    pub fn panels(&self) -> usize {
        self.n.div_ceil(PANEL)
    }

    /// Bytes from one panel's start to the next.
    pub fn panel_stride(&self) -> usize {
        self.blocks() * RECORD_BYTES
    }

    /// Bytes a pass over the weights reads (what bounds decode).
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Block `b` of panel `p`: its record.
    #[inline(always)]
    pub fn record(&self, p: usize, b: usize) -> *const u8 {
        // SAFETY (of callers' reads): records lie inside `data` for p < panels, b < blocks.
        unsafe { self.data.as_ptr().add(p * self.panel_stride() + b * RECORD_BYTES) }
    }

    /// Output `o`'s weight `j` (< 32) of a record, offset removed.
    pub fn weight(&self, rec: &[u8], o: usize, j: usize) -> i32 {
        rec[(j / 4) * 64 + 4 * o + j % 4] as i32 - self.offset as i32
    }

    /// Output `o`'s scale of half `h` of a record.
    pub fn scale(rec: &[u8], o: usize, h: usize) -> f32 {
        let at = QUANT_BYTES + h * 2 * PANEL + 2 * o;
        f16_to_f32(u16::from_le_bytes([rec[at], rec[at + 1]]))
    }

    /// Row `row` dequantized (embedding look-ups of a tied lm_head).
    pub fn row(&self, row: usize) -> Vec<f32> {
        assert!(row < self.n);
        let (p, o) = (row / PANEL, row % PANEL);
        let panel = &self.data[p * self.panel_stride()..][..self.panel_stride()];
        panel.chunks_exact(RECORD_BYTES).flat_map(|rec| (0..QBLOCK).map(move |j| self.weight(rec, o, j) as f32 * Self::scale(rec, o, j / HALF_BLOCK))).collect()
    }
}

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
        let q = Int8BlockWeights::quantize(&w, n, k);
        for r in 0..n {
            for (got, want) in q.row(r).chunks(HALF_BLOCK).zip(w[r * k..(r + 1) * k].chunks(HALF_BLOCK)) {
                let step = want.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
                for (g, v) in got.iter().zip(want) {
                    assert!((g - v).abs() <= step * 0.51 + 1e-4, "row {r}: {g} vs {v}");
                }
            }
        }
    }

    #[test]
    fn quants_under_minus_127_read_as_minus_127() {
        let w = Int8BlockWeights::pack_rows(1, 32, 128, &ThreadPool::new(1, false), &|_, out| {
            out.quants.fill(0);
            out.scales.fill(f32_to_f16(1.0));
        });
        assert!(w.row(0).iter().all(|&v| v == -127.0));
    }
}
