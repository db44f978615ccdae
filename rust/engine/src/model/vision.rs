//! The image side of a vision-language model (SmolVLM, Idefics3, Gemma 3): a SigLIP-style ViT
//! over each square tile's patches, then its projector into the language model's embedding
//! width: SmolVLM's pixel shuffle and one linear layer, or Gemma 3's average pool, RMS norm and
//! matrix. The rows it returns take the place of the prompt's image tokens.

use super::linear::{Compute, Linear, LinearParts};
use super::mlp::take_linear;
use crate::config::{VisionConfig, VisionProjector};
use crate::error::{EngineError, Result};
use crate::weights::WeightStore;
use rsgl_kernels::pool::SendPtr;
use rsgl_kernels::{kernels, linear, PackedWeights, WeightDtype};

const TOWER: &str = "model.vision_model";

struct LayerNorm {
    weight: Vec<f32>,
    bias: Vec<f32>,
    eps: f32,
}

impl LayerNorm {
    fn take(w: &mut WeightStore, prefix: &str, width: usize, eps: f32) -> Result<LayerNorm> {
        Ok(LayerNorm { weight: w.take(&format!("{prefix}.weight"), &[width])?, bias: w.take(&format!("{prefix}.bias"), &[width])?, eps })
    }

    /// Each row of `x` normalized to zero mean and unit variance, then scaled and shifted.
    fn forward(&self, x: &[f32]) -> Vec<f32> {
        let width = self.weight.len();
        let mut out = Vec::with_capacity(x.len());
        for row in x.chunks_exact(width) {
            let mean = row.iter().sum::<f32>() / width as f32;
            let variance = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / width as f32;
            let inverse = 1.0 / (variance + self.eps).sqrt();
            out.extend(row.iter().zip(&self.weight).zip(&self.bias).map(|((v, w), b)| (v - mean) * inverse * w + b));
        }
        out
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
    /// The RMS norm's weight (its 1 added) and the projection.
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
                norm.iter_mut().for_each(|weight| *weight += 1.0);
                let projection = w.take_transposed("model.multi_modal_projector.mm_input_projection_weight", text_hidden, d)?;
                Projector::AveragePool { norm, projection: pack(vec![LinearParts::new(projection, None)]) }
            }
        };
        Ok(VisionTower { cfg: cfg.clone(), patch_embedding, positions, layers, post_norm, projector })
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
        let patches = cfg.patches_per_side().pow(2);
        let mut x = self.patch_embedding.forward(c, &patch_rows(pixels, cfg));
        for tile in x.chunks_exact_mut(patches * cfg.hidden_size) {
            tile.iter_mut().zip(&self.positions).for_each(|(v, p)| *v += p);
        }
        for layer in &self.layers {
            let qkv = layer.qkv.forward(c, &layer.norm1.forward(&x));
            let attended = self.attention(c, &qkv, tiles);
            add(&mut x, &layer.out.forward(c, &attended));
            let mut hidden = layer.fc1.forward(c, &layer.norm2.forward(&x));
            gelu_tanh(&mut hidden);
            add(&mut x, &layer.fc2.forward(c, &hidden));
        }
        let x = self.post_norm.forward(&x);
        Ok(self.project(c, &x, tiles))
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

    /// Bidirectional multi-head attention within each tile; `qkv` is `[tiles * patches, 3 * hidden]`.
    /// Per tile and head, two GEMMs on the compute threads: the scores against the keys packed as
    /// a weight matrix, then, softmaxed, the values packed transposed.
    fn attention(&self, c: &Compute, qkv: &[f32], tiles: usize) -> Vec<f32> {
        let (d, heads) = (self.cfg.hidden_size, self.cfg.num_attention_heads);
        let (hd, n) = (d / heads, self.cfg.patches_per_side().pow(2));
        let scale = 1.0 / (hd as f32).sqrt();
        let k = kernels();
        let mut out = vec![0.0f32; tiles * n * d];
        let (mut scores, mut head_out, mut scratch) = (vec![0.0f32; n * n], vec![0.0f32; n * hd], Vec::new());
        for (tile, head) in (0..tiles).flat_map(|tile| (0..heads).map(move |head| (tile, head))) {
            let part = |i: usize, part: usize| &qkv[(tile * n + i) * 3 * d + part * d + head * hd..][..hd];
            let queries: Vec<f32> = (0..n).flat_map(|i| part(i, 0).iter().copied()).collect();
            let keys = PackedWeights::pack_rows(n, hd, WeightDtype::F32, &c.pool, &|j, row| row.copy_from_slice(part(j, 1)));
            linear(k, &c.pool, &queries, &keys, None, &mut scores, &mut scratch);
            let rows_at = SendPtr(scores.as_mut_ptr());
            c.pool.for_each_dynamic(n, &|i| {
                // SAFETY: each task owns one row of the scores.
                let row = unsafe { std::slice::from_raw_parts_mut(rows_at.get().add(i * n), n) };
                row.iter_mut().for_each(|s| *s *= scale);
                (k.softmax)(row);
            });
            let values =
                PackedWeights::pack_rows(hd, n, WeightDtype::F32, &c.pool, &|dim, row| row.iter_mut().enumerate().for_each(|(j, v)| *v = part(j, 2)[dim]));
            linear(k, &c.pool, &scores, &values, None, &mut head_out, &mut scratch);
            for (i, row) in head_out.chunks_exact(hd).enumerate() {
                out[(tile * n + i) * d + head * hd..][..hd].copy_from_slice(row);
            }
        }
        out
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
                add(&mut sum, patch(row * s + i, col * s + j));
            }
            out.extend(sum.iter().map(|v| v / (s * s) as f32));
        }
    }
    out
}

fn add(x: &mut [f32], delta: &[f32]) {
    x.iter_mut().zip(delta).for_each(|(v, d)| *v += d);
}

/// Values [`gelu_tanh`] takes at a time (it copies each piece once).
const GELU_PIECE: usize = 4096;

/// GELU with the tanh approximation (transformers' `gelu_pytorch_tanh`), the kernels' gated one
/// times 1, piece by piece rather than with two copies of the whole input.
fn gelu_tanh(x: &mut [f32]) {
    let ones = [1.0f32; GELU_PIECE];
    let gelu_tanh_mul = kernels().gelu_tanh_mul;
    for piece in x.chunks_mut(GELU_PIECE) {
        let gate = piece.to_vec();
        gelu_tanh_mul(&gate, &ones[..piece.len()], piece);
    }
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
        };
        let x: Vec<f32> = (0..16).map(|v| v as f32).collect();
        // Patches row by row, 4 per row: the top-left square is 0, 1, 4, 5.
        assert_eq!(pixel_shuffle(&x, &cfg, 1), [0.0, 1.0, 4.0, 5.0, 2.0, 3.0, 6.0, 7.0, 8.0, 9.0, 12.0, 13.0, 10.0, 11.0, 14.0, 15.0]);
        // The same squares averaged; a second tile after the first.
        let two_tiles: Vec<f32> = x.iter().chain(&x).copied().collect();
        assert_eq!(average_pool(&two_tiles, &cfg, 2), [2.5, 4.5, 10.5, 12.5, 2.5, 4.5, 10.5, 12.5]);
    }
}
