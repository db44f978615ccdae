//! What the image towers share: bidirectional multi-head attention within runs of patches (a
//! SigLIP tile, a Qwen2.5-VL window or frame), and their element-wise steps on the compute
//! threads.

use super::linear::Compute;
use rsgl_kernels::{linear, PackedWeights, WeightDtype};
use std::ops::Range;

/// What attention writes besides its output, kept from call to call (a tower calls it once per
/// layer).
#[derive(Default)]
pub(super) struct AttentionScratch {
    queries: Vec<f32>,
    scores: Vec<f32>,
    head_out: Vec<f32>,
    bf16: Vec<u16>,
}

/// A tower's multi-head attention: bidirectional, within runs of patches.
pub(super) struct SegmentAttention {
    pub hidden: usize,
    pub heads: usize,
    /// The format the keys and values are packed in: the tower's weights' (a bf16 tower's
    /// attention runs the bf16 kernels).
    pub dtype: WeightDtype,
}

impl SegmentAttention {
    /// Each of `segments` (runs of rows of `qkv`, `[rows, 3 * hidden]`, q|k|v) attending within
    /// itself, into `out` (`[rows, hidden]`). Per segment and head, two GEMMs on the compute
    /// threads: the scores against the keys packed as a weight matrix, then, softmaxed, the
    /// values packed transposed.
    pub fn attend(&self, c: &Compute, qkv: &[f32], segments: &[Range<usize>], out: &mut Vec<f32>, s: &mut AttentionScratch) {
        let (d, heads) = (self.hidden, self.heads);
        let hd = d / heads;
        let scale = 1.0 / (hd as f32).sqrt();
        let k = c.kernels;
        out.resize(qkv.len() / 3, 0.0);
        for (segment, head) in segments.iter().flat_map(|segment| (0..heads).map(move |head| (segment, head))) {
            let n = segment.len();
            let part = |i: usize, part: usize| &qkv[(segment.start + i) * 3 * d + part * d + head * hd..][..hd];
            s.queries.clear();
            (0..n).for_each(|i| s.queries.extend_from_slice(part(i, 0)));
            let keys = PackedWeights::pack_rows(n, hd, self.dtype, &c.pool, &|j, row| row.copy_from_slice(part(j, 1)));
            s.scores.resize(n * n, 0.0);
            linear(k, &c.pool, &s.queries, &keys, None, &mut s.scores, &mut s.bf16);
            c.pool.for_chunks_mut(&mut s.scores, n, &|_, row| {
                row.iter_mut().for_each(|score| *score *= scale);
                (k.softmax)(row);
            });
            let values = PackedWeights::pack_rows(hd, n, self.dtype, &c.pool, &|dim, row| row.iter_mut().enumerate().for_each(|(j, v)| *v = part(j, 2)[dim]));
            s.head_out.resize(n * hd, 0.0);
            linear(k, &c.pool, &s.scores, &values, None, &mut s.head_out, &mut s.bf16);
            for (i, row) in s.head_out.chunks_exact(hd).enumerate() {
                out[(segment.start + i) * d + head * hd..][..hd].copy_from_slice(row);
            }
        }
    }
}

/// Values one task of [`add`] or of an activation takes.
pub(super) const ELEMENTWISE_PIECE: usize = 4096;

/// `x += delta`, on the compute threads.
pub(super) fn add(c: &Compute, x: &mut [f32], delta: &[f32]) {
    c.pool.for_chunks_mut(x, ELEMENTWISE_PIECE, &|piece, values| {
        values.iter_mut().zip(&delta[piece * ELEMENTWISE_PIECE..]).for_each(|(v, d)| *v += d);
    });
}
