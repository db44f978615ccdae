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
    let mut ids: Vec<u32> = (0..logprobs.len() as u32).collect();
    let n = n.min(ids.len());
    let by_score = |a: &u32, b: &u32| logprobs[*b as usize].total_cmp(&logprobs[*a as usize]).then(a.cmp(b));
    if n < ids.len() && n > 0 {
        ids.select_nth_unstable_by(n - 1, by_score);
    }
    ids.truncate(n);
    ids.sort_by(by_score);
    ids.into_iter().map(|id| TopLogprob { token_id: id, logprob: logprobs[id as usize] }).collect()
}
