//! Qwen2.5-VL's vision tower: an image of any size as a grid of patches (each over two frames
//! of the still image), embedded by a 3D convolution run as one GEMM over flattened patches;
//! pre-norm ViT blocks (RMSNorm, attention with a 2D rope of each patch's row and column, a
//! SwiGLU MLP with biases) that attend within windows of merged tokens, all but the
//! full-attention blocks; then the merger folds each `spatial_merge_size` squared patches into
//! one token of the language model (RMSNorm, then a GELU MLP). The rows it returns take the
//! place of the image's tokens, in the image's row-major order.
//!
//! The patches arrive merge square by merge square (as the processor orders them). For window
//! attention the merged tokens are reordered window by window, so that each window is one run of
//! patches; the tower runs in that order and the merger's rows are put back after.

use super::linear::{Compute, Linear, LinearParts};
use super::mlp::take_linear;
use super::vision_attention::{add, AttentionScratch, SegmentAttention, ELEMENTWISE_PIECE};
use crate::config::Qwen2_5VlVision;
use crate::error::{EngineError, Result};
use crate::weights::WeightStore;
use rsgl_kernels::portable::{rope_tables, RopeStyle};
use rsgl_kernels::WeightDtype;
use std::f64::consts::PI;
use std::ops::Range;

const TOWER: &str = "visual";
/// transformers' fixed epsilon of the tower's RMS norms.
const NORM_EPS: f32 = 1e-6;

/// One pre-norm block: attention over a window (or the whole image), then a SwiGLU MLP.
struct Block {
    norm1: Vec<f32>,
    qkv: Linear,
    proj: Linear,
    norm2: Vec<f32>,
    gate_up: Linear,
    down: Linear,
    full_attention: bool,
}

pub struct QwenVisionTower {
    cfg: Qwen2_5VlVision,
    /// The 3D patch convolution as a GEMM over flattened patches (`[hidden, 3 * frames * patch * patch]`).
    patch_embed: Linear,
    /// The 2D rope's inverse frequencies (a quarter of a head's width), which turn rows and
    /// columns alike.
    inv_freq: Vec<f64>,
    blocks: Vec<Block>,
    merger_norm: Vec<f32>,
    merger_in: Linear,
    merger_out: Linear,
    attention: SegmentAttention,
}

/// The merged tokens of an image reordered window by window, and the runs of patches (in that
/// order) that attend to each other.
#[derive(Debug, PartialEq)]
struct Windows {
    /// `order[k]`: the merged token (row-major over the image's frames, rows and columns) at place `k`.
    order: Vec<usize>,
    /// Each window's patches, in the reordered patches.
    windows: Vec<Range<usize>>,
    /// Each frame's patches (which full attention sees), in the reordered patches.
    frames: Vec<Range<usize>>,
}

impl Windows {
    /// The windows of a grid of `[frames, rows, columns]` patches merged by `merge`, windows
    /// `side` merged tokens a side (the last ones in a row or column cut short by the image's edge).
    fn new([frames, rows, columns]: [usize; 3], merge: usize, side: usize) -> Windows {
        let (rows, columns, unit) = (rows / merge, columns / merge, merge * merge);
        let (mut order, mut windows) = (Vec::with_capacity(frames * rows * columns), Vec::new());
        for frame in 0..frames {
            for (window_row, window_column) in (0..rows.div_ceil(side)).flat_map(|r| (0..columns.div_ceil(side)).map(move |c| (r, c))) {
                let start = order.len();
                for row in window_row * side..((window_row + 1) * side).min(rows) {
                    order.extend((window_column * side..((window_column + 1) * side).min(columns)).map(|column| (frame * rows + row) * columns + column));
                }
                windows.push(start * unit..order.len() * unit);
            }
        }
        let per_frame = rows * columns * unit;
        Windows { order, windows, frames: (0..frames).map(|f| f * per_frame..(f + 1) * per_frame).collect() }
    }

    /// `x`'s rows of `width` values, merged token by merged token (`unit` rows each), in window order.
    fn reorder(&self, x: &[f32], unit: usize, width: usize) -> Vec<f32> {
        let token = unit * width;
        self.order.iter().flat_map(|&t| &x[t * token..(t + 1) * token]).copied().collect()
    }

    /// Rows of `width` values, one per merged token in window order, put back in the image's order.
    fn restore(&self, x: &[f32], width: usize) -> Vec<f32> {
        let mut out = vec![0.0; x.len()];
        for (row, &t) in x.chunks_exact(width).zip(&self.order) {
            out[t * width..(t + 1) * width].copy_from_slice(row);
        }
        out
    }
}

/// Each patch's (row, column) in the image, in the reordered patches: merged token by merged
/// token as `windows` orders them, the patches of a merged token row by row.
fn patch_positions(windows: &Windows, [_, rows, columns]: [usize; 3], merge: usize) -> Vec<(usize, usize)> {
    let (merged_rows, merged_columns) = (rows / merge, columns / merge);
    let mut positions = Vec::with_capacity(windows.order.len() * merge * merge);
    for &token in &windows.order {
        let (row, column) = ((token / merged_columns) % merged_rows, token % merged_columns);
        positions.extend((0..merge).flat_map(|i| (0..merge).map(move |j| (row * merge + i, column * merge + j))));
    }
    positions
}

/// Per patch at (row, column), the cos and sin of its 2D rope over a head of `4 * inv_freq.len()`
/// (`[patches, 2, head_dim]`): the first half of the frequencies turned by its row, the second by
/// its column, each pair of dimensions half a head apart (transformers' `rotate_half`).
fn rope_tables_2d(inv_freq: &[f64], positions: &[(usize, usize)]) -> Vec<f32> {
    let hd = 4 * inv_freq.len();
    let mut tables = vec![0.0; positions.len() * 2 * hd];
    let mut angles = vec![0.0; hd / 2];
    for (&(row, column), tables) in positions.iter().zip(tables.chunks_exact_mut(2 * hd)) {
        let (by_row, by_column) = angles.split_at_mut(hd / 4);
        by_row.iter_mut().zip(inv_freq).for_each(|(a, f)| *a = row as f64 * f);
        by_column.iter_mut().zip(inv_freq).for_each(|(a, f)| *a = column as f64 * f);
        let (cos, sin) = tables.split_at_mut(hd);
        rope_tables(&angles, RopeStyle::Neox, cos, sin);
    }
    tables
}

impl QwenVisionTower {
    /// Takes the tower's and merger's tensors from `w`, packed in `dtype` (`text_hidden`: the
    /// language model's embedding width, which the merger projects to).
    pub fn take(w: &mut WeightStore, cfg: &Qwen2_5VlVision, text_hidden: usize, dtype: WeightDtype, c: &Compute) -> Result<QwenVisionTower> {
        let (d, inter, p) = (cfg.hidden_size, cfg.intermediate_size, cfg.patch_size);
        let pack = |parts: Vec<LinearParts>| Linear::fused(parts, dtype, None, &c.pool);
        let patch = w.take_flattened(&format!("{TOWER}.patch_embed.proj.weight"), &[d, 3, cfg.temporal_patch_size, p, p])?;
        let patch_embed = pack(vec![LinearParts::new(patch, None)]);
        let blocks = (0..cfg.depth)
            .map(|l| {
                let prefix = format!("{TOWER}.blocks.{l}");
                let fused_qkv = w.contains(&format!("{prefix}.attn.qkv.weight"));
                let mut projection = |name: &str, out: usize, inp: usize| take_linear(w, &format!("{prefix}.{name}"), out, inp);
                // llama.cpp's projector files hold q, k and v apart.
                let qkv = match fused_qkv {
                    true => vec![projection("attn.qkv", 3 * d, d)?],
                    false => ["attn.q", "attn.k", "attn.v"].into_iter().map(|name| projection(name, d, d)).collect::<Result<_>>()?,
                };
                let proj = projection("attn.proj", d, d)?;
                let gate_up = vec![projection("mlp.gate_proj", inter, d)?, projection("mlp.up_proj", inter, d)?];
                let down = projection("mlp.down_proj", d, inter)?;
                Ok(Block {
                    norm1: w.take(&format!("{prefix}.norm1.weight"), &[d])?,
                    qkv: pack(qkv),
                    proj: pack(vec![proj]),
                    norm2: w.take(&format!("{prefix}.norm2.weight"), &[d])?,
                    gate_up: pack(gate_up),
                    down: pack(vec![down]),
                    full_attention: cfg.fullatt_block_indexes.contains(&l),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let merged = d * cfg.patches_per_token();
        let merger_norm = w.take(&format!("{TOWER}.merger.ln_q.weight"), &[d])?;
        let merger_in = pack(vec![take_linear(w, &format!("{TOWER}.merger.mlp.0"), merged, merged)?]);
        let merger_out = pack(vec![take_linear(w, &format!("{TOWER}.merger.mlp.2"), text_hidden, merged)?]);
        let quarter = cfg.head_dim() / 4;
        let inv_freq = (0..quarter).map(|j| 1.0 / cfg.rope_theta.powf(j as f64 / quarter as f64)).collect();
        let attention = SegmentAttention { hidden: d, heads: cfg.num_heads, dtype };
        Ok(QwenVisionTower { cfg: cfg.clone(), patch_embed, inv_freq, blocks, merger_norm, merger_in, merger_out, attention })
    }

    /// The language model's rows for an image of patch grid `grid` (`[frames, rows, columns]`)
    /// from its patches' pixel values (`[patches, values_per_patch]`, preprocessed): one row per
    /// merged token, in the image's row-major order.
    pub fn forward(&self, c: &Compute, pixels: &[f32], grid: [usize; 3]) -> Result<Vec<f32>> {
        let cfg = &self.cfg;
        let (merge, unit, d) = (cfg.spatial_merge_size, cfg.patches_per_token(), cfg.hidden_size);
        let patches: usize = grid.iter().product();
        if patches == 0 || !grid[1].is_multiple_of(merge) || !grid[2].is_multiple_of(merge) || pixels.len() != patches * cfg.values_per_patch() {
            return Err(EngineError::InvalidRequest(format!(
                "an image's pixel values must be its grid {grid:?} of patches, {} values each, rows and columns multiples of {merge}; got {} values",
                cfg.values_per_patch(),
                pixels.len()
            )));
        }
        let windows = Windows::new(grid, merge, cfg.merged_tokens_per_window());
        let mut x = windows.reorder(&self.patch_embed.forward(c, pixels), unit, d);
        let tables = rope_tables_2d(&self.inv_freq, &patch_positions(&windows, grid, merge));
        let kern = c.kernels;
        let (mut attended, mut scratch) = (Vec::new(), AttentionScratch::default());
        for block in &self.blocks {
            let mut qkv = block.qkv.forward(c, &rms_norm(c, &mut x, &block.norm1));
            let hd = cfg.head_dim();
            c.pool.for_chunks_mut(&mut qkv, 3 * d, &|patch, row| {
                let (cos, sin) = tables[patch * 2 * hd..(patch + 1) * 2 * hd].split_at(hd);
                (kern.rope)(&mut row[..2 * d], cos, sin, RopeStyle::Neox);
            });
            let segments = if block.full_attention { &windows.frames } else { &windows.windows };
            self.attention.attend(c, &qkv, segments, &mut attended, &mut scratch);
            add(c, &mut x, &block.proj.forward(c, &attended));
            let gate_up = block.gate_up.forward(c, &rms_norm(c, &mut x, &block.norm2));
            let inter = cfg.intermediate_size;
            let mut activated = vec![0.0; gate_up.len() / 2];
            c.pool.for_chunks_mut(&mut activated, inter, &|row, out| {
                let (gate, up) = gate_up[row * 2 * inter..(row + 1) * 2 * inter].split_at(inter);
                (kern.silu_mul)(gate, up, out);
            });
            add(c, &mut x, &block.down.forward(c, &activated));
        }
        // Each merged token's patches are consecutive rows: their normed features side by side.
        let mut hidden = self.merger_in.forward(c, &rms_norm(c, &mut x, &self.merger_norm));
        c.pool.for_chunks_mut(&mut hidden, ELEMENTWISE_PIECE, &|_, piece| piece.iter_mut().for_each(|v| *v = gelu(*v)));
        let merged = self.merger_out.forward(c, &hidden);
        Ok(windows.restore(&merged, self.merger_out.out_features()))
    }
}

/// The RMSNorm of each row of `x` (left as it is), row-parallel.
fn rms_norm(c: &Compute, x: &mut [f32], weight: &[f32]) -> Vec<f32> {
    let (width, kern) = (weight.len(), c.kernels);
    let mut normed = vec![0.0; x.len()];
    c.pool.for_chunk_pairs_mut(x, width, &mut normed, width, &|_, x, out| (kern.add_rmsnorm)(x, None, weight, NORM_EPS, out));
    normed
}

/// GELU with the exact error function (torch's `nn.GELU()`), computed in f64.
fn gelu(x: f32) -> f32 {
    let x = x as f64;
    (0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2))) as f32
}

/// The error function to about 1e-14: its Maclaurin series below 2.5, else one minus erfc's
/// continued fraction.
fn erf(x: f64) -> f64 {
    let a = x.abs();
    let value = if a < 2.5 {
        let (square, mut term, mut sum) = (a * a, a, a);
        for n in 1..80 {
            term *= -square / n as f64;
            let next = term / (2 * n + 1) as f64;
            sum += next;
            if next.abs() < 1e-17 {
                break;
            }
        }
        sum * 2.0 / PI.sqrt()
    } else {
        // erfc(a) = exp(-a^2) / sqrt(pi) / (a + (1/2) / (a + 1 / (a + (3/2) / (a + ...)))).
        let fraction = (1..=80).rev().fold(a, |tail, n| a + n as f64 / 2.0 / tail);
        1.0 - (-a * a).exp() / PI.sqrt() / fraction
    };
    value.copysign(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_reorder_merged_tokens_and_restore_them() {
        // 6 x 10 patches merged by 2: 3 x 5 merged tokens, windows of 2 x 2 of them.
        let windows = Windows::new([1, 6, 10], 2, 2);
        #[rustfmt::skip]
        let order = [0, 1, 5, 6,  2, 3, 7, 8,  4, 9,  10, 11,  12, 13,  14];
        assert_eq!(windows.order, order);
        let lengths: Vec<usize> = windows.windows.iter().map(|w| w.len() / 4).collect();
        assert_eq!(lengths, [4, 4, 2, 2, 2, 1]);
        assert_eq!(windows.frames, vec![Range { start: 0, end: 60 }]);
        // One value per patch: each merged token's 4 patches move together, and come back.
        let patches: Vec<f32> = (0..60).map(|v| v as f32).collect();
        let reordered = windows.reorder(&patches, 4, 1);
        assert_eq!(reordered[4..8], [4.0, 5.0, 6.0, 7.0], "merged token 1's patches second");
        assert_eq!(reordered[8..12], [20.0, 21.0, 22.0, 23.0], "then merged token 5's");
        let tokens: Vec<f32> = windows.order.iter().map(|&t| t as f32).collect();
        assert_eq!(windows.restore(&tokens, 1), (0..15).map(|v| v as f32).collect::<Vec<_>>());
    }

    #[test]
    fn windows_as_transformers_pads_them_and_frames_apart() {
        // Sides that are whole windows give no empty ones; each frame has its own.
        let windows = Windows::new([2, 4, 4], 2, 2);
        assert_eq!(windows.order, [0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(windows.windows, [0..16, 16..32]);
        assert_eq!(windows.frames, [0..16, 16..32]);
    }

    #[test]
    fn patch_positions_are_rows_and_columns_within_merged_tokens() {
        let windows = Windows::new([1, 4, 6], 2, 2);
        let positions = patch_positions(&windows, [1, 4, 6], 2);
        // The first window: merged tokens 0, 1 (row 0), 3, 4 (row 1); each 2 x 2 patches.
        assert_eq!(positions[..8], [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3), (1, 2), (1, 3)]);
        assert_eq!(positions[8..12], [(2, 0), (2, 1), (3, 0), (3, 1)]);
        // The second window holds merged tokens 2 and 5 (column 2).
        assert_eq!(positions[16..20], [(0, 4), (0, 5), (1, 4), (1, 5)]);
    }

    #[test]
    fn the_2d_rope_turns_by_row_then_by_column() {
        // Heads of 8: frequencies 1 and 0.5 by the row, then the same by the column; dimension i pairs with i + 4.
        let tables = rope_tables_2d(&[1.0, 0.5], &[(0, 0), (3, 5)]);
        let (cos, sin) = tables[16..].split_at(8);
        let angles = [3.0, 1.5, 5.0, 2.5f64];
        for (i, angle) in angles.iter().chain(&angles).enumerate() {
            assert!((cos[i] as f64 - angle.cos()).abs() < 1e-6, "cos {i}");
            let sign = if i < 4 { -1.0 } else { 1.0 };
            assert!((sin[i] as f64 - sign * angle.sin()).abs() < 1e-6, "sin {i}");
        }
        assert!(tables[..8].iter().all(|&c| c == 1.0) && tables[8..16].iter().all(|&s| s == 0.0), "patch (0, 0) is not turned");
    }

    #[test]
    fn erf_matches_known_values() {
        for (x, want) in [
            (0.0, 0.0),
            (0.5, 0.5204998778130465),
            (1.0, 0.8427007929497149),
            (2.0, 0.9953222650189527),
            (3.0, 0.9999779095030014),
            (-1.5, -0.9661051464753108),
        ] {
            assert!((erf(x) - want).abs() < 1e-13, "erf({x}) = {} != {want}", erf(x));
        }
        assert_eq!(gelu(0.0), 0.0);
        assert!((gelu(1.0) - 0.8413447).abs() < 1e-6);
    }
}
