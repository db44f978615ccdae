//! What a request asked to get back besides its tokens and text: log-probabilities of sampled
//! and prompt tokens, and the logits after its prompt.

use crate::request::GenerateRequest;
use crate::sample::{log_softmax, top_n, TokenLogprob};

pub(crate) struct Report {
    pub return_logprob: bool,
    top_logprobs_num: usize,
    return_prompt_logits: bool,
    /// First prompt position whose log-probability is wanted, if any (at least 1).
    input_logprobs_from: Option<usize>,
    /// Those log-probabilities so far (with the top alternatives asked for), in position order.
    input_logprobs: Vec<TokenLogprob>,
}

impl Report {
    pub fn new(req: &GenerateRequest) -> Self {
        let prompt_len = req.input_ids.len();
        Report {
            return_logprob: req.return_logprob,
            top_logprobs_num: req.top_logprobs_num,
            return_prompt_logits: req.return_prompt_logits,
            input_logprobs_from: req.logprob_start_len.map(|s| s.clamp(1, prompt_len)),
            input_logprobs: Vec::new(),
        }
    }

    /// Where the cacheable prefix of a prompt of `len` tokens ends: prompt positions whose
    /// log-probability is wanted must be computed.
    pub fn cacheable_len(&self, len: usize) -> usize {
        self.input_logprobs_from.map_or(len, |from| from.min(len))
    }

    /// Whether a chunk from `start` of a prompt of `prompt_len` tokens needs the logits of
    /// every one of its tokens.
    pub fn wants_chunk_logits(&self, start: usize, prompt_len: usize) -> bool {
        self.input_logprobs_from.is_some() && start + 1 < prompt_len
    }

    /// Records the prompt log-probabilities the logits rows of positions `start..` of `tokens`
    /// give; positions already recorded (computed again after a retraction) are skipped.
    pub fn record_input_logprobs(&mut self, tokens: &[u32], prompt_len: usize, start: usize, rows: &[&[f32]]) {
        let Some(from) = self.input_logprobs_from else { return };
        for (row, pos) in rows.iter().zip(start..) {
            let next = pos + 1;
            if next >= from && next < prompt_len && next - from == self.input_logprobs.len() {
                let scored = self.token_logprobs(Some(&log_softmax(row)), tokens[next]);
                self.input_logprobs.extend(scored);
            }
        }
    }

    /// The recorded prompt log-probabilities, handed over once (in the first output).
    pub fn take_input_logprobs(&mut self) -> Option<Vec<TokenLogprob>> {
        self.input_logprobs_from.map(|_| std::mem::take(&mut self.input_logprobs))
    }

    /// The logits after the prompt, when asked for (with the first output).
    pub fn prompt_logits(&self, logits: &[f32]) -> Option<Vec<f32>> {
        self.return_prompt_logits.then(|| logits.to_vec())
    }

    /// The token's log-probability and the top alternatives, when asked for.
    pub fn token_logprobs(&self, log_probs: Option<&[f32]>, token: u32) -> Vec<TokenLogprob> {
        log_probs.map(|lp| vec![TokenLogprob { token_id: token, logprob: lp[token as usize], top: top_n(lp, self.top_logprobs_num) }]).unwrap_or_default()
    }
}
