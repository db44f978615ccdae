//! How many tokens to draft for a request, from its acceptance history: the length doubles after
//! a fully accepted draft and drops to one past the accepted run after a rejection; a request
//! whose drafts keep failing (open-ended writing) stops drafting and only probes with one token
//! now and then (or drafts behind a long match, see [`super::Speculator::propose`]), so
//! speculation costs it almost nothing.

/// Weight of the latest verify in the acceptance average: about the last eight verifies count.
const EMA_WEIGHT: f32 = 0.25;
/// Below this average acceptance a drafted token is more likely wasted compute than a saved step.
const PAUSE_BELOW: f32 = 0.2;
/// While paused, one step in this many drafts a single token to notice text turning repetitive.
const PROBE_EVERY: u32 = 16;
/// First drafts are short until the request shows they get accepted.
const INITIAL_LENGTH: usize = 2;

#[derive(Debug)]
pub struct DraftLength {
    max: usize,
    length: usize,
    /// Exponential moving average of accepted / proposed over verifies.
    acceptance: f32,
    /// Moving sums (same weight) of accepted draft tokens and of the tokens that decided
    /// something: the accepted ones and the first rejected one, if any.
    accepted_tokens: f32,
    deciding_tokens: f32,
    paused_steps: u32,
}

impl DraftLength {
    pub fn new(max: usize) -> Self {
        // Starting between the pause threshold and full acceptance: a few failed drafts pause.
        Self { max, length: INITIAL_LENGTH.min(max), acceptance: 0.5, accepted_tokens: 0.0, deciding_tokens: 0.0, paused_steps: 0 }
    }

    /// Tokens to draft this step (0: don't draft).
    pub fn next(&mut self) -> usize {
        if self.acceptance >= PAUSE_BELOW {
            return self.length;
        }
        self.paused_steps += 1;
        if self.paused_steps.is_multiple_of(PROBE_EVERY) {
            self.max.min(1)
        } else {
            0
        }
    }

    /// Tokens to draft when a paused request's text matches well again: the first draft length.
    pub fn resume_length(&self) -> usize {
        INITIAL_LENGTH.min(self.max)
    }

    /// The chance a draft token is accepted when the ones before it were (one accept and one
    /// reject of prior, so a new request starts at one half).
    pub fn token_acceptance(&self) -> f32 {
        (self.accepted_tokens + 1.0) / (self.deciding_tokens + 2.0)
    }

    /// The verify of a `proposed`-token draft accepted its first `accepted` tokens.
    pub fn observe(&mut self, accepted: usize, proposed: usize) {
        debug_assert!(accepted <= proposed, "{accepted} of {proposed} drafted tokens accepted");
        if proposed == 0 {
            return;
        }
        self.acceptance += EMA_WEIGHT * (accepted as f32 / proposed as f32 - self.acceptance);
        let deciding = accepted + usize::from(accepted < proposed);
        self.accepted_tokens = (1.0 - EMA_WEIGHT) * self.accepted_tokens + accepted as f32;
        self.deciding_tokens = (1.0 - EMA_WEIGHT) * self.deciding_tokens + deciding as f32;
        let length = if accepted == proposed { self.length * 2 } else { accepted + 1 };
        self.length = length.max(1).min(self.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_on_full_acceptance_and_shrinks_to_the_accepted_run() {
        let mut length = DraftLength::new(8);
        assert_eq!(length.next(), 2);
        length.observe(2, 2);
        assert_eq!(length.next(), 4);
        length.observe(4, 4);
        length.observe(8, 8);
        assert_eq!(length.next(), 8, "capped at the maximum");
        length.observe(3, 8);
        assert_eq!(length.next(), 4);
        length.observe(0, 4);
        assert_eq!(length.next(), 1);
    }

    #[test]
    fn token_acceptance_counts_accepted_tokens_against_first_rejections() {
        let mut length = DraftLength::new(8);
        assert_eq!(length.token_acceptance(), 0.5);
        for _ in 0..40 {
            length.observe(3, 4); // three accepted, then one rejected: 3 of 4 deciding tokens
        }
        assert!((length.token_acceptance() - 0.75).abs() < 0.03, "{}", length.token_acceptance());
        for _ in 0..40 {
            length.observe(4, 4); // nothing rejected
        }
        assert!(length.token_acceptance() > 0.9, "{}", length.token_acceptance());
    }

    #[test]
    fn a_zero_maximum_never_drafts() {
        let mut length = DraftLength::new(0);
        for _ in 0..100 {
            assert_eq!(length.next(), 0);
            length.observe(0, 0);
        }
    }

    #[test]
    fn failing_drafts_pause_then_probe_and_resume_when_accepted() {
        let mut length = DraftLength::new(6);
        let mut verifies = 0;
        while length.next() > 0 {
            length.observe(0, 1);
            verifies += 1;
        }
        assert!(verifies <= 4, "{verifies} failed verifies before pausing");
        let drafted: Vec<usize> = (0..4 * PROBE_EVERY).map(|_| length.next()).collect();
        assert_eq!(drafted.iter().sum::<usize>(), 4, "one single-token probe per {PROBE_EVERY} steps: {drafted:?}");
        // An accepted probe brings drafting back.
        assert!((0..PROBE_EVERY).any(|_| length.next() == 1), "no probe in {PROBE_EVERY} steps");
        length.observe(1, 1);
        assert_eq!(length.next(), 2);
    }
}
