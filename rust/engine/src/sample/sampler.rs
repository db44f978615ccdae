use super::{Rng, SamplingParams};
use std::collections::{HashMap, HashSet};

/// What a request has seen so far, for the penalties.
#[derive(Debug, Default, Clone)]
pub struct History {
    prompt: HashSet<u32>,
    output_counts: HashMap<u32, u32>,
}

impl History {
    pub fn new(prompt: &[u32]) -> Self {
        History { prompt: prompt.iter().copied().collect(), output_counts: HashMap::new() }
    }

    pub fn push_output(&mut self, token: u32) {
        *self.output_counts.entry(token).or_default() += 1;
    }
}

pub(super) fn apply_penalties(logits: &mut [f32], p: &SamplingParams, hist: &History) {
    if p.repetition_penalty != 1.0 {
        let seen = hist.prompt.iter().chain(hist.output_counts.keys());
        for &t in seen.collect::<HashSet<_>>() {
            let l = &mut logits[t as usize];
            *l = if *l > 0.0 { *l / p.repetition_penalty } else { *l * p.repetition_penalty };
        }
    }
    if p.frequency_penalty != 0.0 || p.presence_penalty != 0.0 {
        for (&t, &count) in &hist.output_counts {
            logits[t as usize] -= p.frequency_penalty * count as f32 + p.presence_penalty;
        }
    }
}

/// Picks the next token. `banned` tokens (EOS and stop ids before `min_new_tokens`) are never
/// chosen. `logits` is overwritten (penalties, logit bias, temperature, then probabilities).
/// The bias is a fixed shift per token, so a grammar's refusal step (sample freely, mask and
/// sample again on refusal) still draws from exactly the masked, biased distribution; and a
/// token masked to -inf stays there whatever its bias.
pub fn sample(logits: &mut [f32], p: &SamplingParams, hist: &History, banned: &[u32], rng: &mut Rng) -> u32 {
    apply_penalties(logits, p, hist);
    for (&token, &bias) in &p.logit_bias {
        logits[token as usize] += bias;
    }
    for &t in banned {
        logits[t as usize] = f32::NEG_INFINITY;
    }
    let kernels = rsgl_kernels::kernels();
    if p.is_greedy() {
        return (kernels.argmax)(logits) as u32;
    }
    // A positive temperature keeps the order of the logits.
    let inv_t = 1.0 / p.temperature;
    // Candidates as (probability, token): the top-k renormalized among themselves, else tokens
    // under the whole vocabulary's distribution (best first when top-p needs an order).
    let mut cand = Vec::new();
    if p.top_k > 0 && (p.top_k as usize) < logits.len() {
        (kernels.top_k)(logits, p.top_k as usize, &mut cand);
        let mut probs: Vec<f32> = cand.iter().map(|c| c.0 * inv_t).collect();
        probabilities(&mut probs);
        cand.iter_mut().zip(probs).for_each(|(c, q)| c.0 = q);
    } else {
        logits.iter_mut().for_each(|l| *l *= inv_t);
        probabilities(logits);
        if p.top_p < 1.0 {
            nucleus_head(logits, p.top_p, kernels.top_k, &mut cand);
        } else {
            cand.extend(logits.iter().enumerate().map(|(i, &q)| (q, i as u32)));
        }
    }
    let mut probs: Vec<f64> = cand.iter().map(|c| c.0 as f64).collect();
    if p.top_p < 1.0 {
        // Keep the smallest head of the sorted list whose mass reaches top_p.
        let mut cum = 0.0;
        let keep = probs.iter().take_while(|q| {
            let before = cum;
            cum += **q;
            before < p.top_p as f64
        });
        let keep = keep.count().max(1);
        probs.truncate(keep);
        cand.truncate(keep);
    }
    if p.min_p > 0.0 {
        // The most likely token has relative probability 1, so at least one survives.
        let floor = p.min_p as f64 * probs.iter().copied().fold(0.0, f64::max);
        probs.iter_mut().for_each(|q| {
            if *q < floor {
                *q = 0.0
            }
        });
    }
    let mut u = rng.next_f64() * probs.iter().sum::<f64>();
    for (q, c) in probs.iter().zip(&cand) {
        if u < *q {
            return c.1;
        }
        u -= q;
    }
    // Rounding left a sliver of mass: take the last token that had any.
    cand[probs.iter().rposition(|q| *q > 0.0).unwrap_or(0)].1
}

/// Softmax in place, with tokens of logit -inf (banned, or masked by a grammar) at exactly 0:
/// the SIMD `exp` bottoms out at 2^-126, and a token that keeps any probability could still be
/// drawn when rounding leaves the draw past the last candidate.
pub(super) fn probabilities(x: &mut [f32]) {
    (rsgl_kernels::kernels().softmax)(x);
    x.iter_mut().filter(|q| **q <= f32::MIN_POSITIVE).for_each(|q| *q = 0.0);
}

/// The most probable tokens of `probs` (a distribution over the vocabulary), best first, as
/// many as it takes for their mass to reach `top_p`: heads of growing length are selected
/// rather than the whole vocabulary sorted, since a nucleus is usually a few dozen tokens.
fn nucleus_head(probs: &[f32], top_p: f32, top_k: rsgl_kernels::dispatch::TopKFn, head: &mut Vec<(f32, u32)>) {
    let mut len = 64;
    loop {
        top_k(probs, len.min(probs.len()), head);
        let mass: f64 = head.iter().map(|c| c.0 as f64).sum();
        if mass >= top_p as f64 || len >= probs.len() {
            return;
        }
        len *= 8;
    }
}
