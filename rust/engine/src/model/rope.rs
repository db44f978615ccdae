//! Rotary position embedding tables (neox layout), with Llama 3 frequency scaling.

use crate::config::{ModelConfig, RopeScaling};

pub struct Rope {
    half: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

fn inv_frequencies(cfg: &ModelConfig) -> Vec<f64> {
    let d = cfg.head_dim as f64;
    let base: Vec<f64> = (0..cfg.head_dim / 2).map(|i| 1.0 / cfg.rope_theta.powf(2.0 * i as f64 / d)).collect();
    match &cfg.rope_scaling {
        None => base,
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
                        let smooth = (original_max_position_embeddings / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect()
        }
    }
}

impl Rope {
    pub fn new(cfg: &ModelConfig, max_positions: usize) -> Self {
        let inv = inv_frequencies(cfg);
        let half = inv.len();
        let mut cos = Vec::with_capacity(max_positions * half);
        let mut sin = Vec::with_capacity(max_positions * half);
        for p in 0..max_positions {
            for f in &inv {
                let angle = p as f64 * f;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        Rope { half, cos, sin }
    }

    /// Rotates every head in `heads` (concatenated, each `2 * half` long) for position `pos`.
    pub fn apply(&self, heads: &mut [f32], pos: usize) {
        let (cos, sin) = (&self.cos[pos * self.half..(pos + 1) * self.half], &self.sin[pos * self.half..(pos + 1) * self.half]);
        for head in heads.chunks_exact_mut(2 * self.half) {
            rsgl_kernels::portable::rope_neox(head, cos, sin);
        }
    }
}
