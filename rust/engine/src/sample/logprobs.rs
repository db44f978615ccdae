use serde::Serialize;

/// Log-probability of a chosen token, with the most likely alternatives when asked.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TokenLogprob {
    pub token_id: u32,
    pub logprob: f32,
    pub top: Vec<TopLogprob>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TopLogprob {
    pub token_id: u32,
    pub logprob: f32,
}

pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max + logits.iter().map(|v| (v - max).exp()).sum::<f32>().ln();
    logits.iter().map(|v| v - lse).collect()
}

/// The `n` best entries, highest first (ties broken by lower token id).
pub fn top_n(logprobs: &[f32], n: usize) -> Vec<TopLogprob> {
    let mut best = Vec::with_capacity(n);
    (rsgl_kernels::kernels().top_k)(logprobs, n, &mut best);
    best.into_iter().map(|(logprob, token_id)| TopLogprob { token_id, logprob }).collect()
}
