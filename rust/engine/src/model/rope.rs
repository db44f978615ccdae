//! Rotary position embedding tables, with linear, Llama 3 or LongRoPE frequency scaling, over all
//! of each head or its first `rotary_dim` dimensions, in the per-element form the rope kernel
//! takes (see [`rsgl_kernels::portable::rope`]).

use crate::config::{ModelConfig, RopeScaling};
use rsgl_kernels::portable::rope_tables;
use rsgl_kernels::RopeStyle;

pub struct Rope {
    head_dim: usize,
    /// The dimensions rotated, at the start of each head.
    rotary_dim: usize,
    style: RopeStyle,
    /// `[position][rotary_dim]`
    cos: Vec<f32>,
    sin: Vec<f32>,
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
                        let wavelen = 2.0 * std::f64::consts::PI / f;
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
        };
        let (long, amplitude) = match scaling {
            Some(RopeScaling::LongRope { long_factor, original_max_position_embeddings, attention_factor, .. }) => {
                (Some((*original_max_position_embeddings, divided(long_factor))), *attention_factor as f32)
            }
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
        let d = rotary_dim;
        let (mut cos, mut sin) = (vec![0.0; max_positions * d], vec![0.0; max_positions * d]);
        let mut angles = vec![0.0; d / 2];
        for p in 0..max_positions {
            angles.iter_mut().zip(frequencies.at(p)).for_each(|(a, f)| *a = p as f64 * f);
            let (cos, sin) = (&mut cos[p * d..(p + 1) * d], &mut sin[p * d..(p + 1) * d]);
            rope_tables(&angles, style, cos, sin);
            if frequencies.amplitude != 1.0 {
                cos.iter_mut().chain(sin.iter_mut()).for_each(|value| *value *= frequencies.amplitude);
            }
        }
        Rope { head_dim, rotary_dim, style, cos, sin }
    }

    /// Rotates every head in `heads` (concatenated) for position `pos`.
    pub fn apply(&self, kernels: &rsgl_kernels::Kernels, heads: &mut [f32], pos: usize) {
        let at = pos * self.rotary_dim..(pos + 1) * self.rotary_dim;
        let (cos, sin) = (&self.cos[at.clone()], &self.sin[at]);
        if self.rotary_dim == self.head_dim {
            (kernels.rope)(heads, cos, sin, self.style);
        } else {
            for head in heads.chunks_exact_mut(self.head_dim) {
                (kernels.rope)(&mut head[..self.rotary_dim], cos, sin, self.style);
            }
        }
    }
}
