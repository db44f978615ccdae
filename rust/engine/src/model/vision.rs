//! The image side of a vision-language model (SmolVLM, Idefics3, Gemma 3): a SigLIP-style ViT
//! over each square tile's patches, then its projector into the language model's embedding
//! width: SmolVLM's pixel shuffle and one linear layer, or Gemma 3's average pool, RMS norm and
//! matrix. The rows it returns take the place of the prompt's image tokens.

use super::linear::{Compute, Linear, LinearParts};
use super::mlp::take_linear;
use super::vision_attention::{add, AttentionScratch, SegmentAttention, ELEMENTWISE_PIECE};
use crate::config::{VisionConfig, VisionProjector};
use crate::error::{EngineError, Result};
use crate::weights::WeightStore;
use rsgl_kernels::{kernels, WeightDtype};

const TOWER: &str = "model.vision_model";

/// Rows of a tile one task of the compute threads normalizes.
const ROWS_PER_TASK: usize = 16;

struct LayerNorm {
    weight: Vec<f32>,
    bias: Vec<f32>,
    eps: f32,
}

impl LayerNorm {
    fn take(w: &mut WeightStore, prefix: &str, width: usize, eps: f32) -> Result<LayerNorm> {
        Ok(LayerNorm { weight: w.take(&format!("{prefix}.weight"), &[width])?, bias: w.take(&format!("{prefix}.bias"), &[width])?, eps })
    }

    /// Each row of `x` normalized to zero mean and unit variance, then scaled and shifted, into
    /// `out` (rows split among the compute threads).
    fn forward_into(&self, c: &Compute, x: &[f32], out: &mut Vec<f32>) {
        let width = self.weight.len();
        out.resize(x.len(), 0.0);
        c.pool.for_chunks_mut(out, width * ROWS_PER_TASK, &|piece, rows| {
            for (row, out) in x[piece * width * ROWS_PER_TASK..].chunks_exact(width).zip(rows.chunks_exact_mut(width)) {
                let mean = row.iter().sum::<f32>() / width as f32;
                let variance = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / width as f32;
                let inverse = 1.0 / (variance + self.eps).sqrt();
                for (((o, v), w), b) in out.iter_mut().zip(row).zip(&self.weight).zip(&self.bias) {
                    *o = (v - mean) * inverse * w + b;
                }
            }
        });
    }
}

/// One pre-norm ViT block: attention over the tile's patches, then a GELU-tanh MLP.
struct EncoderLayer {
    norm1: LayerNorm,
    qkv: Linear,
    out: Linear,
    norm2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

/// How the tower's patches become the language model's rows ([`VisionProjector`]).
enum Projector {
    PixelShuffle(Linear),
    /// The RMS norm's weight (its offset added) and the projection.
    AveragePool {
        norm: Vec<f32>,
        projection: Linear,
    },
}

pub struct VisionTower {
    cfg: VisionConfig,
    /// The patch convolution as a GEMM over flattened patches (`[hidden, 3 * patch * patch]`).
    patch_embedding: Linear,
    /// The position embedding, a row per patch of a tile in order (SigLIP's, Gemma 3's). For
    /// SmolVLM, transformers buckets fractional patch coordinates in float32 to the same rows,
    /// except that for some sides (19, 25, 29... never SmolVLM's 32 or Idefics3's 26) torch's
    /// vectorized `arange` rounds a boundary the other way, differently on different CPUs.
    positions: Vec<f32>,
    layers: Vec<EncoderLayer>,
    post_norm: LayerNorm,
    projector: Projector,
    attention: SegmentAttention,
}

/// What a tile's pass through the layers writes, kept from layer to layer and tile to tile: a
/// tile's rows fit the caches, an image's (17 tiles of SmolVLM's) would not, and fresh buffers
/// of that size cost a page fault per 4 KiB.
#[derive(Default)]
struct TileBuffers {
    normed: Vec<f32>,
    qkv: Vec<f32>,
    attended: Vec<f32>,
    /// A sublayer's output before it joins the residual stream.
    delta: Vec<f32>,
    hidden: Vec<f32>,
    attention: AttentionScratch,
}

impl VisionTower {
    /// Takes the tower's and projector's tensors from `w`, packed in `dtype` (`text_hidden`: the
    /// language model's embedding width).
    pub fn take(w: &mut WeightStore, cfg: &VisionConfig, text_hidden: usize, dtype: WeightDtype, c: &Compute) -> Result<VisionTower> {
        let (d, p) = (cfg.hidden_size, cfg.patch_size);
        let pack = |parts: Vec<LinearParts>| Linear::fused(parts, dtype, None, &c.pool);
        let patch_weight = w.take_flattened(&format!("{TOWER}.embeddings.patch_embedding.weight"), &[d, 3, p, p])?;
        let patch_bias = w.take(&format!("{TOWER}.embeddings.patch_embedding.bias"), &[d])?;
        let patch_embedding = pack(vec![LinearParts::new(patch_weight, Some(patch_bias))]);
        let side = cfg.patches_per_side();
        let positions = w.take(&format!("{TOWER}.embeddings.position_embedding.weight"), &[side * side, d])?;
        let eps = cfg.layer_norm_eps;
        let layers = (0..cfg.num_hidden_layers)
            .map(|l| {
                let prefix = format!("{TOWER}.encoder.layers.{l}");
                let mut projection = |name: &str, out: usize, inp: usize| take_linear(w, &format!("{prefix}.{name}"), out, inp);
                let qkv = vec![projection("self_attn.q_proj", d, d)?, projection("self_attn.k_proj", d, d)?, projection("self_attn.v_proj", d, d)?];
                let out = projection("self_attn.out_proj", d, d)?;
                let (fc1, fc2) = (projection("mlp.fc1", cfg.intermediate_size, d)?, projection("mlp.fc2", d, cfg.intermediate_size)?);
                Ok(EncoderLayer {
                    norm1: LayerNorm::take(w, &format!("{prefix}.layer_norm1"), d, eps)?,
                    qkv: pack(qkv),
                    out: pack(vec![out]),
                    norm2: LayerNorm::take(w, &format!("{prefix}.layer_norm2"), d, eps)?,
                    fc1: pack(vec![fc1]),
                    fc2: pack(vec![fc2]),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let post_norm = LayerNorm::take(w, &format!("{TOWER}.post_layernorm"), d, eps)?;
        let projector = match cfg.projector {
            VisionProjector::PixelShuffle => {
                let shuffled = d * cfg.scale_factor * cfg.scale_factor;
                Projector::PixelShuffle(pack(vec![take_linear(w, "model.connector.modality_projection.proj", text_hidden, shuffled)?]))
            }
            VisionProjector::AveragePool => {
                // SigLIP's pooling head, which transformers may save but Gemma 3 does not run.
                w.drop_prefixed(&format!("{TOWER}.head."));
                let mut norm = w.take("model.multi_modal_projector.mm_soft_emb_norm.weight", &[d])?;
                norm.iter_mut().for_each(|weight| *weight += cfg.projector_norm_offset);
                let projection = w.take_transposed("model.multi_modal_projector.mm_input_projection_weight", text_hidden, d)?;
                Projector::AveragePool { norm, projection: pack(vec![LinearParts::new(projection, None)]) }
            }
        };
        let attention = SegmentAttention { hidden: d, heads: cfg.num_attention_heads, dtype };
        Ok(VisionTower { cfg: cfg.clone(), patch_embedding, positions, layers, post_norm, projector, attention })
    }

    /// The language model's rows for an image's tiles (`[tiles, 3, image_size, image_size]`
    /// pixel values, preprocessed): `[tiles * tokens_per_tile, text_hidden]`, tile by tile.
    pub fn forward(&self, c: &Compute, pixels: &[f32]) -> Result<Vec<f32>> {
        let cfg = &self.cfg;
        if pixels.is_empty() || !pixels.len().is_multiple_of(cfg.values_per_tile()) {
            return Err(EngineError::InvalidRequest(format!(
                "an image's pixel values must be whole tiles of 3 x {0} x {0} values; got {1}",
                cfg.image_size,
                pixels.len()
            )));
        }
        let tiles = pixels.len() / cfg.values_per_tile();
        let mut encoded = Vec::with_capacity(tiles * cfg.patches_per_side().pow(2) * cfg.hidden_size);
        let mut buffers = TileBuffers::default();
        for tile in pixels.chunks_exact(cfg.values_per_tile()) {
            encoded.extend_from_slice(self.encode_tile(c, tile, &mut buffers));
        }
        Ok(self.project(c, &encoded, tiles))
    }

    /// The projector over the tower's output `x` (`[tiles * patches, hidden]`).
    fn project(&self, c: &Compute, x: &[f32], tiles: usize) -> Vec<f32> {
        match &self.projector {
            Projector::PixelShuffle(projection) => projection.forward(c, &pixel_shuffle(x, &self.cfg, tiles)),
            Projector::AveragePool { norm, projection } => {
                let mut pooled = average_pool(x, &self.cfg, tiles);
                let mut normed = vec![0.0; pooled.len()];
                for (row, out) in pooled.chunks_exact_mut(norm.len()).zip(normed.chunks_exact_mut(norm.len())) {
                    (c.kernels.add_rmsnorm)(row, None, norm, self.cfg.layer_norm_eps, out);
                }
                projection.forward(c, &normed)
            }
        }
    }

    /// One tile's patches through the encoder, post-normed (in `buffers.normed`): each tile
    /// attends within itself, so tile by tile gives the same rows as all at once.
    fn encode_tile<'b>(&self, c: &Compute, pixels: &[f32], b: &'b mut TileBuffers) -> &'b [f32] {
        let mut x = self.patch_embedding.forward(c, &patch_rows(pixels, &self.cfg));
        add(c, &mut x, &self.positions);
        for layer in &self.layers {
            layer.norm1.forward_into(c, &x, &mut b.normed);
            layer.qkv.forward_into(c, &b.normed, &mut b.qkv);
            // Each tile attends within itself: one segment of all its patches.
            let tile = 0..self.cfg.patches_per_side().pow(2);
            self.attention.attend(c, &b.qkv, std::slice::from_ref(&tile), &mut b.attended, &mut b.attention);
            layer.out.forward_into(c, &b.attended, &mut b.delta);
            add(c, &mut x, &b.delta);
            layer.norm2.forward_into(c, &x, &mut b.normed);
            layer.fc1.forward_into(c, &b.normed, &mut b.hidden);
            gelu_tanh(c, &mut b.hidden);
            layer.fc2.forward_into(c, &b.hidden, &mut b.delta);
            add(c, &mut x, &b.delta);
        }
        self.post_norm.forward_into(c, &x, &mut b.normed);
        &b.normed
    }
}

/// Each tile's patches as rows of `3 * patch * patch` values (channel, then patch row, then
/// column: the convolution weight's order), patches row by row.
fn patch_rows(pixels: &[f32], cfg: &VisionConfig) -> Vec<f32> {
    let (size, p, side) = (cfg.image_size, cfg.patch_size, cfg.patches_per_side());
    let mut rows = Vec::with_capacity(pixels.len());
    for tile in pixels.chunks_exact(cfg.values_per_tile()) {
        for (py, px) in (0..side).flat_map(|py| (0..side).map(move |px| (py, px))) {
            for channel in tile.chunks_exact(size * size) {
                for y in py * p..(py + 1) * p {
                    rows.extend_from_slice(&channel[y * size + px * p..][..p]);
                }
            }
        }
    }
    rows
}

/// SmolVLM's pixel shuffle: each `scale` x `scale` square of neighbouring patches becomes one
/// token, their features side by side (row within the square, then column); tokens row by row.
fn pixel_shuffle(x: &[f32], cfg: &VisionConfig, tiles: usize) -> Vec<f32> {
    let (d, side, s) = (cfg.hidden_size, cfg.patches_per_side(), cfg.scale_factor);
    let mut out = Vec::with_capacity(x.len());
    for tile in 0..tiles {
        let patch = |row: usize, col: usize| &x[((tile * side + row) * side + col) * d..][..d];
        for (row, col) in (0..side / s).flat_map(|row| (0..side / s).map(move |col| (row, col))) {
            for (i, j) in (0..s).flat_map(|i| (0..s).map(move |j| (i, j))) {
                out.extend_from_slice(patch(row * s + i, col * s + j));
            }
        }
    }
    out
}

/// Gemma 3's average pool: each `scale` x `scale` square of neighbouring patches becomes the
/// mean of their features; tokens row by row.
fn average_pool(x: &[f32], cfg: &VisionConfig, tiles: usize) -> Vec<f32> {
    let (d, side, s) = (cfg.hidden_size, cfg.patches_per_side(), cfg.scale_factor);
    let mut out = Vec::with_capacity(x.len() / (s * s));
    for tile in 0..tiles {
        let patch = |row: usize, col: usize| &x[((tile * side + row) * side + col) * d..][..d];
        for (row, col) in (0..side / s).flat_map(|row| (0..side / s).map(move |col| (row, col))) {
            let mut sum = vec![0.0f32; d];
            for (i, j) in (0..s).flat_map(|i| (0..s).map(move |j| (i, j))) {
                sum.iter_mut().zip(patch(row * s + i, col * s + j)).for_each(|(v, p)| *v += p);
            }
            out.extend(sum.iter().map(|v| v / (s * s) as f32));
        }
    }
    out
}

/// GELU with the tanh approximation (transformers' `gelu_pytorch_tanh`), the kernels' gated one
/// times 1, piece by piece on the compute threads rather than with two copies of the whole input.
fn gelu_tanh(c: &Compute, x: &mut [f32]) {
    let gelu_tanh_mul = kernels().gelu_tanh_mul;
    c.pool.for_chunks_mut(x, ELEMENTWISE_PIECE, &|_, piece| {
        let (mut gate, ones) = ([0.0f32; ELEMENTWISE_PIECE], [1.0f32; ELEMENTWISE_PIECE]);
        gate[..piece.len()].copy_from_slice(piece);
        gelu_tanh_mul(&gate[..piece.len()], &ones[..piece.len()], piece);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pixel_shuffle_and_average_pool_fold_squares_of_patches() {
        let cfg = VisionConfig {
            hidden_size: 1,
            intermediate_size: 1,
            num_hidden_layers: 0,
            num_attention_heads: 1,
            image_size: 4,
            patch_size: 1,
            layer_norm_eps: 1e-6,
            scale_factor: 2,
            projector: VisionProjector::PixelShuffle,
            image_token_id: 0,
            bidirectional_image_tokens: false,
            projector_norm_offset: 0.0,
        };
        let x: Vec<f32> = (0..16).map(|v| v as f32).collect();
        // Patches row by row, 4 per row: the top-left square is 0, 1, 4, 5.
        assert_eq!(pixel_shuffle(&x, &cfg, 1), [0.0, 1.0, 4.0, 5.0, 2.0, 3.0, 6.0, 7.0, 8.0, 9.0, 12.0, 13.0, 10.0, 11.0, 14.0, 15.0]);
        // The same squares averaged; a second tile after the first.
        let two_tiles: Vec<f32> = x.iter().chain(&x).copied().collect();
        assert_eq!(average_pool(&two_tiles, &cfg, 2), [2.5, 4.5, 10.5, 12.5, 2.5, 4.5, 10.5, 12.5]);
    }
}
