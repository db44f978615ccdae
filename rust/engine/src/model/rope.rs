//! Rotary position embedding tables, with linear or Llama 3 frequency scaling, in the
//! per-element form the rope kernel takes (see [`rsgl_kernels::portable::rope`]).

use crate::config::RopeScaling;
use rsgl_kernels::portable::rope_tables;
use rsgl_kernels::RopeStyle;

pub struct Rope {
    head_dim: usize,
    style: RopeStyle,
    /// `[position][head_dim]`
    cos: Vec<f32>,
    sin: Vec<f32>,
}

fn inv_frequencies(head_dim: usize, theta: f64, scaling: Option<&RopeScaling>) -> Vec<f64> {
    let d = head_dim as f64;
    let base: Vec<f64> = (0..head_dim / 2).map(|i| 1.0 / theta.powf(2.0 * i as f64 / d)).collect();
    match scaling {
        None => base,
        Some(RopeScaling::Linear { factor }) => base.into_iter().map(|f| f / factor).collect(),
        Some(RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings }) => {
            let low_wavelen = original_max_position_embeddings / low_freq_factor;
            let high_wavelen = original_max_position_embeddings / high_freq_factor;
            base.into_iter()
                .map(|f| {
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
    }
}

impl Rope {
    /// The tables of base `theta` (frequency scaled by `scaling`) for positions `0..max_positions`.
    pub fn new(head_dim: usize, theta: f64, scaling: Option<&RopeScaling>, max_positions: usize, style: RopeStyle) -> Self {
        let inv = inv_frequencies(head_dim, theta, scaling);
        let d = head_dim;
        let (mut cos, mut sin) = (vec![0.0; max_positions * d], vec![0.0; max_positions * d]);
        let mut angles = vec![0.0; inv.len()];
        for p in 0..max_positions {
            angles.iter_mut().zip(&inv).for_each(|(a, f)| *a = p as f64 * f);
            rope_tables(&angles, style, &mut cos[p * d..(p + 1) * d], &mut sin[p * d..(p + 1) * d]);
        }
        Rope { head_dim: d, style, cos, sin }
    }

    /// Rotates every head in `heads` (concatenated) for position `pos`.
    pub fn apply(&self, kernels: &rsgl_kernels::Kernels, heads: &mut [f32], pos: usize) {
        let at = pos * self.head_dim..(pos + 1) * self.head_dim;
        (kernels.rope)(heads, &self.cos[at.clone()], &self.sin[at], self.style);
    }
}
