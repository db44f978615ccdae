//! One request's grammar: its matcher, its token mask, and the reasoning gate that keeps the
//! grammar off until the model has finished thinking.

use super::Grammar;
use crate::error::Result;

pub(crate) struct Constraint {
    grammar: Box<dyn Grammar>,
    /// Until the output ends with these tokens (`</think>`), the output is free.
    think_end: Option<Vec<u32>>,
    /// Forced tokens are appended without sampling (jump-forward).
    jump_forward: bool,
    /// The allowed tokens of the next step, one bit per token.
    mask: Vec<u32>,
}

impl Constraint {
    pub fn new(grammar: Box<dyn Grammar>, vocab_size: usize, think_end: Option<Vec<u32>>, jump_forward: bool) -> Self {
        Constraint { grammar, think_end: think_end.filter(|t| !t.is_empty()), jump_forward, mask: vec![0; vocab_size.div_ceil(32)] }
    }

    /// Whether the grammar applies to the next token.
    pub fn is_active(&self) -> bool {
        self.think_end.is_none()
    }

    /// Computes the next step's mask (done for all constrained requests of a step at once).
    pub fn fill_mask(&mut self) -> Result<()> {
        self.grammar.fill_mask(&mut self.mask)
    }

    /// Sends every token the mask forbids to -inf.
    pub fn apply_mask(&self, logits: &mut [f32]) {
        (rsgl_kernels::kernels().apply_token_mask)(logits, &self.mask);
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
        Constraint::new(Box::new(Sequence123 { committed: Vec::new() }), 40, think_end, jump_forward)
    }

    #[test]
    fn the_mask_leaves_only_allowed_tokens() {
        let mut c = constraint(None, true);
        c.fill_mask().unwrap();
        let mut logits = vec![0.5; 40];
        c.apply_mask(&mut logits);
        let allowed: Vec<usize> = (0..40).filter(|&t| logits[t].is_finite()).collect();
        assert_eq!(allowed, vec![1]);
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
