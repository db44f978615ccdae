//! One request's grammar: its matcher, its token mask, and the reasoning gate that keeps the
//! grammar off until the model has finished thinking.

use super::Grammar;
use crate::error::{EngineError, Result};

pub(crate) struct Constraint {
    grammar: Box<dyn Grammar>,
    /// Until the output ends with these tokens (`</think>`), the output is free.
    think_end: Option<Vec<u32>>,
    /// Forced tokens are appended without sampling (jump-forward).
    jump_forward: bool,
    /// The request samples as if free and fills the mask only when the grammar refuses the
    /// token (exact for greedy and plain temperature sampling, see [`Constraint::pick`]).
    mask_on_refusal: bool,
    /// The allowed tokens of the next step, one bit per token.
    mask: Vec<u32>,
    /// Whether the step's parallel pass filled the mask for the next pick (and if it failed).
    filled_ahead: Option<std::result::Result<(), EngineError>>,
}

impl Constraint {
    pub fn new(grammar: Box<dyn Grammar>, vocab_size: usize, think_end: Option<Vec<u32>>, jump_forward: bool, mask_on_refusal: bool) -> Self {
        let think_end = think_end.filter(|t| !t.is_empty());
        Constraint { grammar, think_end, jump_forward, mask_on_refusal, mask: vec![0; vocab_size.div_ceil(32)], filled_ahead: None }
    }

    /// Whether the grammar applies to the next token.
    pub fn is_active(&self) -> bool {
        self.think_end.is_none()
    }

    /// Whether the next token needs the mask before sampling (the step fills those masks for
    /// all its constrained requests at once, in parallel).
    pub fn needs_mask_first(&self) -> bool {
        self.is_active() && !self.mask_on_refusal
    }

    /// Fills the mask for the next [`Self::pick`] (a failure is reported there).
    pub fn fill_mask_ahead(&mut self) {
        self.filled_ahead = Some(self.grammar.fill_mask(&mut self.mask));
    }

    /// Picks the next token with `sample` (which may change the logits it is given). With the
    /// mask filled ahead, samples among allowed tokens. Otherwise samples from a copy of the
    /// free logits and keeps the token if the grammar allows it, else masks and samples again:
    /// a rejection step that, for greedy and plain temperature sampling, draws from exactly
    /// the masked distribution while the full mask is computed only on refusals.
    pub fn pick(&mut self, logits: &mut [f32], mut sample: impl FnMut(&mut [f32]) -> u32) -> Result<u32> {
        match self.filled_ahead.take() {
            Some(filled) => filled?,
            None => {
                if self.mask_on_refusal {
                    let token = sample(&mut logits.to_vec());
                    if self.grammar.allows(token)? {
                        return Ok(token);
                    }
                }
                self.grammar.fill_mask(&mut self.mask)?;
            }
        }
        (rsgl_kernels::kernels().apply_token_mask)(logits, &self.mask);
        Ok(sample(logits))
    }

    /// Follows a token appended to `output` (which ends with it): the grammar commits it, or,
    /// while reasoning, the gate opens once the output ends with the end-of-thinking tokens.
    pub fn follow(&mut self, output: &[u32]) -> Result<()> {
        match &self.think_end {
            Some(end) => {
                if output.ends_with(end) {
                    self.think_end = None;
                }
                Ok(())
            }
            None => self.grammar.commit(*output.last().expect("a token was appended")),
        }
    }

    /// Tokens to append without sampling, at most `limit`; each is committed by [`Self::follow`]
    /// as it is appended.
    pub fn forced_tokens(&mut self, limit: usize) -> Vec<u32> {
        if !self.jump_forward || !self.is_active() || limit == 0 {
            return Vec::new();
        }
        let mut forced = self.grammar.forced_tokens();
        forced.truncate(limit);
        forced
    }

    /// How many of `draft`'s first tokens the grammar allows after the output so far (all while
    /// the model thinks): verifying a token the grammar refuses would waste the pass.
    pub fn allowed_draft_len(&mut self, draft: &[u32]) -> usize {
        if !self.is_active() {
            return draft.len();
        }
        self.grammar.allowed_prefix(draft).unwrap_or(0) // a failing grammar reports at sampling
    }

    /// The grammar allows nothing more.
    pub fn is_finished(&self) -> bool {
        self.is_active() && self.grammar.is_finished()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A grammar over tokens 0..4 that accepts exactly `[1, 2, 3]` and forces 2 and 3 after 1.
    struct Sequence123 {
        committed: Vec<u32>,
    }

    impl Grammar for Sequence123 {
        fn fill_mask(&mut self, mask: &mut [u32]) -> Result<()> {
            mask[0] = 1 << (self.committed.len() + 1);
            Ok(())
        }
        fn allowed_prefix(&mut self, tokens: &[u32]) -> Result<usize> {
            Ok(tokens.iter().zip(self.committed.len() as u32 + 1..=3).take_while(|(t, next)| *t == next).count())
        }
        fn commit(&mut self, token: u32) -> Result<()> {
            assert_eq!(token as usize, self.committed.len() + 1, "only the next token of 1 2 3 is allowed");
            self.committed.push(token);
            Ok(())
        }
        fn rollback(&mut self, tokens: usize) -> Result<()> {
            self.committed.truncate(self.committed.len() - tokens);
            Ok(())
        }
        fn forced_tokens(&mut self) -> Vec<u32> {
            if self.committed.is_empty() {
                Vec::new()
            } else {
                (self.committed.len() as u32 + 1..=3).collect()
            }
        }
        fn is_finished(&self) -> bool {
            self.committed.len() == 3
        }
        fn fork(&self) -> Box<dyn Grammar> {
            Box::new(Sequence123 { committed: self.committed.clone() })
        }
    }

    fn constraint(think_end: Option<Vec<u32>>, jump_forward: bool) -> Constraint {
        Constraint::new(Box::new(Sequence123 { committed: Vec::new() }), 40, think_end, jump_forward, false)
    }

    fn argmax(logits: &mut [f32]) -> u32 {
        (0..logits.len()).max_by(|&a, &b| logits[a].total_cmp(&logits[b])).unwrap() as u32
    }

    #[test]
    fn the_mask_leaves_only_allowed_tokens() {
        let mut c = constraint(None, true);
        c.fill_mask_ahead();
        let mut logits = vec![0.5; 40];
        logits[7] = 9.0;
        assert_eq!(c.pick(&mut logits, argmax).unwrap(), 1);
        let allowed: Vec<usize> = (0..40).filter(|&t| logits[t].is_finite()).collect();
        assert_eq!(allowed, vec![1]);
    }

    #[test]
    fn masking_on_refusal_keeps_allowed_picks_and_resamples_refused_ones() {
        let mut c = Constraint::new(Box::new(Sequence123 { committed: Vec::new() }), 40, None, true, true);
        assert!(!c.needs_mask_first());
        let mut logits = vec![0.5; 40];
        logits[1] = 9.0;
        assert_eq!(c.pick(&mut logits.clone(), argmax).unwrap(), 1, "allowed: kept");
        assert!(logits.iter().all(|l| l.is_finite()), "no mask applied");
        logits[7] = 20.0;
        assert_eq!(c.pick(&mut logits, argmax).unwrap(), 1, "7 refused: masked and sampled again");
    }

    #[test]
    fn forced_tokens_follow_a_choice_within_the_limit() {
        let mut c = constraint(None, true);
        assert!(c.forced_tokens(8).is_empty(), "the first token is a choice");
        c.follow(&[1]).unwrap();
        assert_eq!(c.forced_tokens(1), vec![2]);
        assert_eq!(c.forced_tokens(8), vec![2, 3]);
        c.follow(&[1, 2]).unwrap();
        c.follow(&[1, 2, 3]).unwrap();
        assert!(c.is_finished());
        let mut off = constraint(None, false);
        off.follow(&[1]).unwrap();
        assert!(off.forced_tokens(8).is_empty(), "jump-forward off forces nothing");
    }

    #[test]
    fn the_grammar_starts_after_the_end_of_thinking() {
        let mut c = constraint(Some(vec![7, 8]), true);
        for (i, output) in [vec![5], vec![5, 8], vec![5, 8, 7]].iter().enumerate() {
            c.follow(output).unwrap();
            assert!(!c.is_active(), "still thinking after {} tokens", i + 1);
            assert!(c.forced_tokens(8).is_empty());
        }
        c.follow(&[5, 8, 7, 8]).unwrap();
        assert!(c.is_active(), "</think> seen: the grammar applies from the next token");
        c.follow(&[5, 8, 7, 8, 1]).unwrap();
        assert_eq!(c.forced_tokens(8), vec![2, 3]);
    }
}
