//! How much of the KV pool the running requests may still need, and which to retract when it
//! runs out anyway.
//!
//! Admission keeps pages back for the output the running requests have yet to write, as
//! SGLang does: each may write up to its `max_new_tokens`, but most stop sooner (or are cut off
//! by the context), so only a fraction of that budget is reserved, SGLang's `new_token_ratio`.
//! It starts at 0.7, decays towards a floor every step while nothing is retracted (admitting
//! more as the estimate proves safe), and after a retraction jumps back to what the running
//! requests have actually used.

use crate::sequence::Sequence;

/// Output tokens past which a request's reservation stops growing (SGLang's
/// `CLIP_MAX_NEW_TOKENS`): a request asking for a huge budget does not lock the pool.
pub(crate) const CLIP_MAX_NEW_TOKENS: usize = 4096;
/// SGLang's defaults: `SGLANG_INIT_NEW_TOKEN_RATIO`, `SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR` and
/// `SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS`.
const INIT_RATIO: f64 = 0.7;
const MIN_RATIO: f64 = INIT_RATIO * 0.14;
const DECAY_STEPS: f64 = 600.0;
/// Decode steps a request is assumed still to run after a retraction (SGLang's `RETRACT_DECODE_STEPS`).
const RETRACT_DECODE_STEPS: usize = 20;

/// The fraction of the running requests' remaining output budgets admission keeps pages for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct NewTokenRatio {
    ratio: f64,
    init: f64,
    min: f64,
}

impl Default for NewTokenRatio {
    fn default() -> Self {
        NewTokenRatio::new(1.0)
    }
}

impl NewTokenRatio {
    /// SGLang's estimate scaled by `conservativeness` (its `--schedule-conservativeness`).
    pub fn new(conservativeness: f64) -> Self {
        let init = (INIT_RATIO * conservativeness).min(1.0);
        NewTokenRatio { ratio: init, init, min: init * MIN_RATIO / INIT_RATIO }
    }

    #[cfg(test)]
    pub fn value(self) -> f64 {
        self.ratio
    }

    /// After a step without retraction: the estimate relaxes towards its floor.
    pub fn decay(&mut self) {
        self.ratio = (self.ratio - (self.init - self.min) / DECAY_STEPS).max(self.min);
    }

    /// After retracting: the fraction of their output budgets the requests still running have
    /// written, plus a few steps each (at most all of it).
    pub fn after_retraction(&mut self, running: &[Sequence]) {
        let decoded: usize = running.iter().map(Sequence::output_len).sum();
        let budgets: usize = running.iter().map(|s| s.max_new_tokens.min(CLIP_MAX_NEW_TOKENS)).sum();
        let estimate = (decoded + RETRACT_DECODE_STEPS * running.len()) as f64 / budgets.max(1) as f64;
        self.ratio = estimate.clamp(self.min, 1.0);
    }

    /// Output tokens to keep room for, for a request with `remaining` tokens of its budget left.
    pub fn reserve_tokens(self, remaining: usize) -> usize {
        (remaining.min(CLIP_MAX_NEW_TOKENS) as f64 * self.ratio).ceil() as usize
    }
}

/// Pages `seq` may still take beyond those it holds: its prompt's (or what it has written so
/// far), then its reserved output, at `page_size` tokens a page.
pub(crate) fn reserved_pages(seq: &Sequence, ratio: NewTokenRatio, page_size: usize) -> usize {
    let remaining = seq.max_new_tokens.saturating_sub(seq.output_len());
    (seq.tokens.len() + ratio.reserve_tokens(remaining)).div_ceil(page_size).saturating_sub(seq.kv.pages.len())
}

/// Which running request to retract when the pool cannot give one its next page: the one with
/// the fewest output tokens (the least decoding thrown away), of those the one holding the most
/// pages (the most room made), of those the latest in `running`. SGLang's choice too.
pub(crate) fn retraction_victim(running: &[Sequence]) -> Option<usize> {
    (0..running.len()).min_by_key(|&i| (running[i].output_len(), std::cmp::Reverse(running[i].kv.pages.len()), std::cmp::Reverse(i)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{GenerateRequest, OutputSink};

    fn seq(prompt: usize, max_new: usize, output: usize, pages: usize) -> Sequence {
        let ids: Vec<u32> = (0..prompt as u32).collect();
        let json = format!(r#"{{"rid": "x", "input_ids": {ids:?}, "sampling_params": {{"max_new_tokens": {max_new}}}}}"#);
        let req = GenerateRequest::from_json(&json).unwrap();
        let mut s = Sequence::new(req, OutputSink::new(std::sync::mpsc::channel().0, None), &[], 100_000, 0);
        s.tokens.extend(std::iter::repeat_n(7, output));
        s.kv.pages = (0..pages as u32).collect();
        s
    }

    #[test]
    fn ratio_decays_to_its_floor_and_rises_after_a_retraction() {
        let mut ratio = NewTokenRatio::default();
        assert_eq!(ratio.value(), 0.7);
        ratio.decay();
        assert!(ratio.value() < 0.7);
        (0..1000).for_each(|_| ratio.decay());
        assert!((ratio.value() - 0.098).abs() < 1e-9);
        // Two requests of 100-token budgets, 50 and 30 written: (80 + 2 * 20) / 200.
        ratio.after_retraction(&[seq(4, 100, 50, 4), seq(4, 100, 30, 3)]);
        assert!((ratio.value() - 0.6).abs() < 1e-9);
        ratio.after_retraction(&[seq(4, 10, 9, 1)]);
        assert_eq!(ratio.value(), 1.0);
    }

    #[test]
    fn conservativeness_scales_the_estimate_and_zero_reserves_nothing() {
        assert!((NewTokenRatio::new(0.5).value() - 0.35).abs() < 1e-9);
        assert_eq!(NewTokenRatio::new(3.0).value(), 1.0);
        let mut none = NewTokenRatio::new(0.0);
        none.decay();
        assert_eq!(none.reserve_tokens(1000), 0);
        // Pages only for the tokens it already has.
        assert_eq!(reserved_pages(&seq(33, 100, 0, 2), none, 16), 1);
    }

    #[test]
    fn reservation_counts_pages_not_yet_held() {
        let ratio = NewTokenRatio::default();
        assert_eq!(ratio.reserve_tokens(100), 70);
        assert_eq!(ratio.reserve_tokens(1_000_000), (CLIP_MAX_NEW_TOKENS as f64 * 0.7).ceil() as usize);
        // 32 prompt tokens in 2 pages of 16, 100 to go: 70 more tokens, 102 in all, 7 pages.
        assert_eq!(reserved_pages(&seq(32, 100, 0, 2), ratio, 16), 5);
        // Done with its budget: nothing beyond the page its last token needs.
        assert_eq!(reserved_pages(&seq(32, 10, 10, 3), ratio, 16), 0);
    }

    #[test]
    fn retracts_the_least_decoded_then_the_largest_then_the_latest() {
        let running = [seq(64, 100, 5, 5), seq(32, 100, 0, 2), seq(64, 100, 0, 4), seq(16, 100, 9, 2)];
        assert_eq!(retraction_victim(&running), Some(2));
        let tied = [seq(32, 100, 1, 2), seq(32, 100, 1, 2)];
        assert_eq!(retraction_victim(&tied), Some(1));
        assert_eq!(retraction_victim(&[]), None);
    }
}
