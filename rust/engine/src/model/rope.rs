//! Rotary position embedding tables, with linear, Llama 3, LongRoPE or YaRN frequency scaling, over all
//! of each head or its first `rotary_dim` dimensions, in the per-element form the rope kernel
//! takes (see [`rsgl_kernels::portable::rope`]).

use super::mrope::section_of;
use crate::config::{ModelConfig, RopeScaling};
use rsgl_kernels::portable::rope_tables;
use rsgl_kernels::RopeStyle;
use std::f64::consts::PI;
use std::sync::OnceLock;

/// Positions per block of the tables.
const BLOCK_POSITIONS: usize = 1024;

pub struct Rope {
    head_dim: usize,
    /// The dimensions rotated, at the start of each head.
    rotary_dim: usize,
    style: RopeStyle,
    frequencies: Frequencies,
    /// `[block][position in block][cos | sin][rotary_dim]`, each block computed the first time
    /// one of its positions rotates: tables for a model's whole context would hold hundreds of
    /// MB (Gemma 3 4B: 131,072 positions x 256 dimensions x 2 tables x 2 bases) that a server
    /// answering short prompts never reads.
    blocks: Vec<OnceLock<Box<[f32]>>>,
    /// M-RoPE's sections of the rotary frequencies (Qwen2.5-VL), which 3D positions turn.
    mrope_section: Option<[usize; 3]>,
}

/// What rotates position `p`: the inverse frequencies of each pair of rotated dimensions
/// (LongRoPE's long ones from `long.0` on), and the amplitude of cos and sin.
struct Frequencies {
    inv: Vec<f64>,
    long: Option<(usize, Vec<f64>)>,
    amplitude: f32,
}

impl Frequencies {
    fn new(rotary_dim: usize, theta: f64, scaling: Option<&RopeScaling>) -> Frequencies {
        let d = rotary_dim as f64;
        let base: Vec<f64> = (0..rotary_dim / 2).map(|i| 1.0 / theta.powf(2.0 * i as f64 / d)).collect();
        let divided = |factors: &[f64]| base.iter().zip(factors).map(|(f, factor)| f / factor).collect();
        let inv = match scaling {
            None => base.clone(),
            Some(RopeScaling::Linear { factor }) => base.iter().map(|f| f / factor).collect(),
            Some(RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings }) => {
                let low_wavelen = original_max_position_embeddings / low_freq_factor;
                let high_wavelen = original_max_position_embeddings / high_freq_factor;
                base.iter()
                    .map(|&f| {
                        let wavelen = 2.0 * PI / f;
                        if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / factor
                        } else {
                            let smooth = (original_max_position_embeddings / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect()
            }
            Some(RopeScaling::LongRope { short_factor, .. }) => divided(short_factor),
            Some(RopeScaling::Yarn { factor, original_max_position_embeddings, beta_fast, beta_slow, truncate, .. }) => {
                // The (fractional) index of the frequency that turns `turns` times over the original context.
                let index_turning = |turns: f64| d * (*original_max_position_embeddings as f64 / (turns * 2.0 * PI)).ln() / (2.0 * theta.ln());
                let (mut low, mut high) = (index_turning(*beta_fast), index_turning(*beta_slow));
                if *truncate {
                    (low, high) = (low.floor(), high.ceil());
                }
                let (low, high) = (low.max(0.0), high.min(d - 1.0));
                // transformers widens an empty blend so as not to divide by zero.
                let width = if low == high { 0.001 } else { high - low };
                base.iter()
                    .enumerate()
                    .map(|(i, &f)| {
                        let interpolated = ((i as f64 - low) / width).clamp(0.0, 1.0);
                        interpolated * f / factor + (1.0 - interpolated) * f
                    })
                    .collect()
            }
        };
        let (long, amplitude) = match scaling {
            Some(RopeScaling::LongRope { long_factor, original_max_position_embeddings, attention_factor, .. }) => {
                (Some((*original_max_position_embeddings, divided(long_factor))), *attention_factor as f32)
            }
            Some(RopeScaling::Yarn { attention_factor, .. }) => (None, *attention_factor as f32),
            _ => (None, 1.0),
        };
        Frequencies { inv, long, amplitude }
    }

    fn at(&self, position: usize) -> &[f64] {
        match &self.long {
            Some((from, long)) if position >= *from => long,
            _ => &self.inv,
        }
    }
}

impl Rope {
    /// The global layers' rope of `cfg` for positions `0..max_positions`.
    pub fn global(cfg: &ModelConfig, max_positions: usize, style: RopeStyle) -> Rope {
        Rope::new(cfg, cfg.rope_theta, cfg.rope_scaling.as_ref(), max_positions, style)
    }

    /// The rope of base `theta` (frequencies scaled by `scaling`) for the heads of `cfg`.
    pub fn new(cfg: &ModelConfig, theta: f64, scaling: Option<&RopeScaling>, max_positions: usize, style: RopeStyle) -> Rope {
        let (head_dim, rotary_dim) = (cfg.head_dim, cfg.rotary_dim.unwrap_or(cfg.head_dim));
        let frequencies = Frequencies::new(rotary_dim, theta, scaling);
        let blocks = (0..max_positions.div_ceil(BLOCK_POSITIONS)).map(|_| OnceLock::new()).collect();
        Rope { head_dim, rotary_dim, style, frequencies, blocks, mrope_section: None }
    }

    /// This rope, turned at 3D positions by M-RoPE's sections (see [`Rope::apply_3d`]).
    pub fn with_mrope_section(self, mrope_section: Option<[usize; 3]>) -> Rope {
        Rope { mrope_section, ..self }
    }

    /// The cos and sin tables of the positions of block `block`.
    fn block(&self, block: usize) -> Box<[f32]> {
        let d = self.rotary_dim;
        let mut tables = vec![0.0; BLOCK_POSITIONS * 2 * d];
        let mut angles = vec![0.0; d / 2];
        for (i, tables) in tables.chunks_exact_mut(2 * d).enumerate() {
            let p = block * BLOCK_POSITIONS + i;
            angles.iter_mut().zip(self.frequencies.at(p)).for_each(|(a, f)| *a = p as f64 * f);
            let (cos, sin) = tables.split_at_mut(d);
            rope_tables(&angles, self.style, cos, sin);
            if self.frequencies.amplitude != 1.0 {
                tables.iter_mut().for_each(|value| *value *= self.frequencies.amplitude);
            }
        }
        tables.into_boxed_slice()
    }

    /// The cos and sin of position `pos`, `rotary_dim` each.
    fn tables(&self, pos: usize) -> (&[f32], &[f32]) {
        let (d, block) = (self.rotary_dim, pos / BLOCK_POSITIONS);
        let tables = self.blocks.get(block).unwrap_or_else(|| panic!("rope: position {pos} is past the model's context")).get_or_init(|| self.block(block));
        tables[(pos % BLOCK_POSITIONS) * 2 * d..][..2 * d].split_at(d)
    }

    /// Rotates `part`, `rotary_dim` values (the rope part of one head), for position `pos`.
    pub fn rotate(&self, kernels: &rsgl_kernels::Kernels, part: &mut [f32], pos: usize) {
        assert_eq!(part.len(), self.rotary_dim, "rope: a part to rotate is rotary_dim wide");
        let (cos, sin) = self.tables(pos);
        (kernels.rope)(part, cos, sin, self.style);
    }

    /// Rotates every head in `heads` (concatenated) for position `pos`.
    pub fn apply(&self, kernels: &rsgl_kernels::Kernels, heads: &mut [f32], pos: usize) {
        let (cos, sin) = self.tables(pos);
        self.rotate_heads(kernels, heads, cos, sin);
    }

    /// Rotates every head of a token's `q` and `k` for M-RoPE's 3D `positions` (temporal,
    /// height, width): each rotary frequency turned by the position of its section (the mixed
    /// tables built once for both). Equal positions are the ordinary rope.
    pub fn apply_3d(&self, kernels: &rsgl_kernels::Kernels, q: &mut [f32], k: &mut [f32], positions: [usize; 3]) {
        let section = match self.mrope_section {
            Some(section) if positions.iter().any(|&p| p != positions[0]) => section,
            _ => {
                self.apply(kernels, q, positions[0]);
                return self.apply(kernels, k, positions[0]);
            }
        };
        let d = self.rotary_dim;
        let tables = positions.map(|p| self.tables(p));
        let (mut cos, mut sin) = (vec![0.0; d], vec![0.0; d]);
        for i in 0..d {
            let frequency = match self.style {
                RopeStyle::Neox => i % (d / 2),
                RopeStyle::GptJ => i / 2,
            };
            let (part_cos, part_sin) = tables[section_of(section, frequency)];
            (cos[i], sin[i]) = (part_cos[i], part_sin[i]);
        }
        self.rotate_heads(kernels, q, &cos, &sin);
        self.rotate_heads(kernels, k, &cos, &sin);
    }

    fn rotate_heads(&self, kernels: &rsgl_kernels::Kernels, heads: &mut [f32], cos: &[f32], sin: &[f32]) {
        if self.rotary_dim == self.head_dim {
            (kernels.rope)(heads, cos, sin, self.style);
        } else {
            for head in heads.chunks_exact_mut(self.head_dim) {
                (kernels.rope)(&mut head[..self.rotary_dim], cos, sin, self.style);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yarn(factor: f64, original: usize, truncate: bool, attention_factor: f64) -> RopeScaling {
        RopeScaling::Yarn { factor, original_max_position_embeddings: original, beta_fast: 32.0, beta_slow: 1.0, truncate, attention_factor }
    }

    fn assert_close(got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() <= 2e-7 * w, "{got:?} != {want:?}");
        }
    }

    /// The inverse frequencies transformers' `_compute_yarn_parameters` gives (in float32).
    #[test]
    fn yarn_blends_kept_and_divided_frequencies_as_transformers_does() {
        // tests/zoo_models.py's Ministral 3: index 0 kept, 1 halfway, the rest divided by 4.
        let ministral = Frequencies::new(16, 1e6, Some(&yarn(4.0, 64, true, 1.0)));
        let want = [1.0, 1.1114246398e-01, 7.9056946561e-03, 1.4058533125e-03, 2.5000001187e-04, 4.4456985052e-05, 7.9056935647e-06, 1.4058533679e-06];
        assert_close(&ministral.inv, &want);
        assert_eq!((ministral.amplitude, ministral.at(1000).len()), (1.0, 8));
        // gpt-oss: the blend between the exact bounds (indices 8.09 to 17.4), every 4th frequency.
        let gpt_oss = Frequencies::new(64, 150000.0, Some(&yarn(32.0, 4096, false, 1.3465735902799727)));
        let every_4th: Vec<f64> = gpt_oss.inv.iter().step_by(4).copied().collect();
        let want = [1.0, 2.2541800141e-01, 5.0813272595e-02, 6.7949593067e-03, 4.5648391824e-04, 1.8188336981e-05, 4.0999784687e-06, 9.2420896181e-07];
        assert_close(&every_4th, &want);
        assert_eq!(gpt_oss.amplitude, 1.3465735902799727f64 as f32);
    }

    #[test]
    fn three_positions_turn_their_sections_of_the_frequencies() {
        let json = serde_json::json!({"architectures": ["LlamaForCausalLM"], "hidden_size": 16, "intermediate_size": 8, "num_hidden_layers": 1,
                                      "num_attention_heads": 2, "vocab_size": 4, "max_position_embeddings": 64});
        let cfg = ModelConfig::from_hf_config(json).unwrap();
        // Heads of 8: 4 frequencies, the first turned by the temporal position, the next by the height, the last two by the width.
        let rope = Rope::new(&cfg, 10000.0, None, 64, RopeStyle::Neox).with_mrope_section(Some([1, 1, 2]));
        let k = rsgl_kernels::kernels();
        let x: Vec<f32> = (0..16).map(|v| v as f32 * 0.1 + 0.3).collect();
        let (mut plain, mut equal, mut equal_k) = (x.clone(), x.clone(), x.clone());
        rope.apply(k, &mut plain, 5);
        rope.apply_3d(k, &mut equal, &mut equal_k, [5; 3]);
        assert_eq!((&plain, &plain), (&equal, &equal_k), "equal positions are the ordinary rope");
        let positions = [3, 9, 20];
        let (mut got, mut got_k) = (x.clone(), x.clone());
        rope.apply_3d(k, &mut got, &mut got_k, positions);
        assert_eq!(got, got_k, "q and k turn alike");
        for (head, j) in (0..2).flat_map(|head| (0..4).map(move |j| (head, j))) {
            let angle = positions[[0, 1, 2, 2][j]] as f64 / 10000f64.powf(2.0 * j as f64 / 8.0);
            let (x0, x1) = (x[head * 8 + j] as f64, x[head * 8 + j + 4] as f64);
            let want = [x0 * angle.cos() - x1 * angle.sin(), x1 * angle.cos() + x0 * angle.sin()];
            let pair = [got[head * 8 + j] as f64, got[head * 8 + j + 4] as f64];
            assert!((pair[0] - want[0]).abs() < 1e-5 && (pair[1] - want[1]).abs() < 1e-5, "head {head}, frequency {j}: {pair:?} != {want:?}");
        }
    }

    #[test]
    fn yarn_attention_factor_is_derived_as_transformers_does() {
        let derived = |factor, mscale, mscale_all_dim| RopeScaling::yarn_attention_factor(factor, mscale, mscale_all_dim);
        assert!((derived(32.0, None, None) - 1.3465735902799727).abs() < 1e-12);
        assert!((derived(40.0, Some(2.0), Some(1.0)) - 1.269480015985188).abs() < 1e-12);
        assert_eq!((derived(4.0, Some(1.0), Some(1.0)), derived(0.5, None, None), derived(4.0, Some(1.0), None)), (1.0, 1.0, 1.0 + 0.1 * 4f64.ln()));
    }
}
