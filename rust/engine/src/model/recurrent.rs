//! What the recurrent token mixers (Gated DeltaNet, Mamba-2) share: where each sequence's tokens
//! and state lie in a step, the short causal convolution whose window starts each sequence's
//! state, and softplus.

use super::decoder::{SeqChunk, Step};
use super::linear::Compute;
use crate::error::Result;
use crate::weights::WeightStore;
use rsgl_kernels::pool::SendPtr;
use rsgl_kernels::portable::{exp, ln};

/// Where each sequence's tokens start in the batch.
pub(super) fn first_tokens(step: &Step) -> Vec<usize> {
    step.seqs.iter().scan(0, |at, chunk| Some(std::mem::replace(at, *at + chunk.tokens.len()))).collect()
}

/// The state slot of a sequence of a model with recurrent layers.
pub(super) fn state_slot(chunk: &SeqChunk) -> usize {
    chunk.state_slot.expect("a model with recurrent layers gives every sequence a state slot")
}

/// A depthwise causal convolution over `channels` channels of `kernel` taps, then SiLU.
pub(super) struct CausalConv {
    /// `[kernel][channel]` (transposed from the checkpoint's, so each tap runs along a row of
    /// channels), the last on the newest input.
    taps: Vec<f32>,
    bias: Option<Vec<f32>>,
    channels: usize,
}

impl CausalConv {
    /// `{prefix}.conv1d.weight` (`[channels, 1, kernel]`) and its bias where the checkpoint has one.
    pub fn take(w: &mut WeightStore, prefix: &str, channels: usize, kernel: usize) -> Result<CausalConv> {
        let conv = w.take(&format!("{prefix}.conv1d.weight"), &[channels, 1, kernel])?;
        let taps = (0..kernel * channels).map(|i| conv[(i % channels) * kernel + i / channels]).collect();
        let bias = w.take_optional(&format!("{prefix}.conv1d.bias"), &[channels])?;
        Ok(CausalConv { taps, bias, channels })
    }

    /// Values of the window of past inputs a sequence's state keeps: `[kernel - 1][channel]`.
    pub fn window_len(&self) -> usize {
        self.taps.len() - self.channels
    }

    /// Convolves each sequence's new rows of `proj` (`width` wide, the channels from column `at`)
    /// in place, in parallel over sequences; each sequence's window is the first values of its
    /// slot's state in `states` (`slot_len` apart), zeroed for a chunk at position 0, and copied
    /// into the snapshot slot as it stands at the snapshot where the chunk asks for one.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(&self, c: &Compute, step: &Step, firsts: &[usize], proj: &mut [f32], width: usize, at: usize, states: &mut [f32], slot_len: usize) {
        let states_at = SendPtr(states.as_mut_ptr());
        let proj_at = SendPtr(proj.as_mut_ptr());
        c.pool.for_each_dynamic(step.seqs.len(), &|s| {
            let chunk = &step.seqs[s];
            // SAFETY: each sequence owns its slot's state and its own tokens' rows.
            let window = unsafe { std::slice::from_raw_parts_mut(states_at.get().add(state_slot(chunk) * slot_len), self.window_len()) };
            let rows = unsafe { std::slice::from_raw_parts_mut(proj_at.get().add(firsts[s] * width), chunk.tokens.len() * width) };
            if chunk.start_pos == 0 {
                window.fill(0.0);
            }
            let inputs = self.convolve(c, window, rows, width, at);
            if let Some((n, snapshot)) = chunk.snapshot {
                // SAFETY: a snapshot slot is written by its one sequence only.
                let copy = unsafe { std::slice::from_raw_parts_mut(states_at.get().add(snapshot * slot_len), self.window_len()) };
                copy.copy_from_slice(&inputs[n * self.channels..n * self.channels + copy.len()]);
            }
        });
    }

    /// One sequence's rows, reading the inputs before them from `window` (oldest first) and
    /// leaving there the last ones; returns the inputs in time order (the window before, then
    /// the rows').
    fn convolve(&self, c: &Compute, window: &mut [f32], rows: &mut [f32], width: usize, at: usize) -> Vec<f32> {
        let channels = self.channels;
        let n = rows.len() / width;
        // The inputs in time order: the window before, then the new rows.
        let mut inputs = window.to_vec();
        for row in rows.chunks_exact(width) {
            inputs.extend_from_slice(&row[at..at + channels]);
        }
        let (mut sums, ones) = (vec![0.0f32; channels], vec![1.0f32; channels]);
        for (t, row) in rows.chunks_exact_mut(width).enumerate() {
            match &self.bias {
                Some(bias) => sums.copy_from_slice(bias),
                None => sums.fill(0.0),
            }
            for (j, taps) in self.taps.chunks_exact(channels).enumerate() {
                let input = &inputs[(t + j) * channels..(t + j + 1) * channels];
                sums.iter_mut().zip(taps).zip(input).for_each(|((sum, &tap), &x)| *sum += tap * x);
            }
            // SiLU(sum) as SiLU(sum) · 1, the vector kernel's bits (times 1 is exact).
            (c.kernels.silu_mul)(&sums, &ones, &mut row[at..at + channels]);
        }
        window.copy_from_slice(&inputs[n * channels..n * channels + window.len()]);
        inputs
    }
}

/// `ln(1 + e^x)`, linear past 20 as torch's (in the kernels' own `exp` and `ln`: the same bits
/// on every CPU).
pub(super) fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        ln(1.0 + exp(x))
    }
}
