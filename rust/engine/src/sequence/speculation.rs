//! A request's speculative decoding: drafting tokens before its decode pass, and verifying
//! them with the rows that pass returns.
//!
//! The draft rides on the request's tokens for the pass (one logits row after the last token
//! and after each draft token), then comes off again. Verification samples from each row in
//! turn, as decoding one token at a time would, while the tokens appended so far are the draft
//! the rows were computed after. Greedy sampling gives exactly the tokens plain decoding gives;
//! random sampling keeps its distribution, because a draft token is kept exactly when the
//! token drawn from the model's own distribution equals it (the rejection rule of speculative
//! sampling for a draft that is one token with certainty).

use super::Sequence;
use crate::request::Output;
use crate::speculative::{Drafter, Speculator};
use crate::text::TokenTable;

pub(crate) struct Speculation {
    drafter: Drafter,
    /// Draft tokens on the request's tokens for this step's pass.
    pending: usize,
    /// The first draft token the step's budget dropped: checked against the token the pass
    /// samples after the kept ones anyway, so a request whose drafts are dropped keeps
    /// learning how often they would be accepted.
    dropped: Option<u32>,
    pub verify_ct: usize,
    pub draft_tokens: usize,
    pub accepted_tokens: usize,
}

/// One step's output of a request, with what the step did.
pub(crate) struct Advanced {
    pub output: Output,
    /// Tokens the grammar forced (appended without sampling).
    pub forced: usize,
    pub drafted: usize,
    pub accepted: usize,
}

impl Speculation {
    pub fn new(drafter: Drafter) -> Self {
        Speculation { drafter, pending: 0, dropped: None, verify_ct: 0, draft_tokens: 0, accepted_tokens: 0 }
    }
}

impl Sequence {
    /// Draft tokens on the tokens for this step's pass.
    pub fn draft_len(&self) -> usize {
        self.speculation.as_ref().map_or(0, |s| s.pending)
    }

    /// Drafts tokens to verify in this step's pass: what `speculator` proposes, cut where the
    /// grammar refuses one, at most what the budget leaves after the token the pass samples.
    pub fn draft(&mut self, speculator: &Speculator) {
        let room = self.max_new_tokens.saturating_sub(self.output_len() + 1);
        let Some(speculation) = self.speculation.as_mut() else { return };
        let mut draft = speculator.propose(&mut speculation.drafter, &self.tokens, room);
        if let Some(constraint) = self.constraint.as_mut() {
            draft.truncate(constraint.allowed_draft_len(&draft));
        }
        speculation.pending = draft.len();
        self.tokens.extend(draft);
    }

    /// This request's draft length, and the chance one of its draft tokens is accepted when the
    /// ones before it were.
    pub fn draft_odds(&self) -> (usize, f32) {
        self.speculation.as_ref().map_or((0, 0.0), |s| (s.pending, s.drafter.token_acceptance()))
    }

    /// Keeps the first `keep` tokens of this step's draft.
    pub fn shorten_draft(&mut self, keep: usize) {
        let Some(speculation) = self.speculation.as_mut() else { return };
        let dropped = speculation.pending.saturating_sub(keep);
        speculation.pending -= dropped;
        speculation.dropped = (dropped > 0).then(|| self.tokens[self.tokens.len() - dropped]);
        self.tokens.truncate(self.tokens.len() - dropped);
    }

    /// Drops this step's draft unverified (the request leaves the batch).
    pub fn discard_draft(&mut self) {
        if let Some(speculation) = self.speculation.as_mut() {
            speculation.dropped = None;
        }
        self.take_draft();
    }

    /// Takes this step's draft back off the tokens.
    pub fn take_draft(&mut self) -> Vec<u32> {
        let pending = self.speculation.as_mut().map_or(0, |s| std::mem::take(&mut s.pending));
        self.tokens.split_off(self.tokens.len() - pending)
    }

    /// Samples the next token from `rows[0]`, then one from each following row while the tokens
    /// appended so far are `draft`'s first ones (the tokens those rows were computed after).
    /// The KV of the draft tokens so confirmed is kept; the rest is overwritten later.
    pub fn advance_through_draft(&mut self, rows: &[&[f32]], draft: &[u32], table: Option<&TokenTable>) -> Advanced {
        let before = self.tokens.len();
        let mut forced = 0;
        let mut output: Option<Output> = None;
        let mut row = 0;
        loop {
            let next = self.advance(&mut rows[row].to_vec(), table);
            forced += next.token_ids.len() - 1;
            let output = match output.as_mut() {
                Some(output) => {
                    output.append(next);
                    output
                }
                None => output.insert(next),
            };
            let appended = &self.tokens[before..];
            if output.finished.is_some() || appended.len() > draft.len() || appended != &draft[..appended.len()] {
                break;
            }
            row = appended.len(); // the row computed after the last appended token
        }
        let accepted = self.tokens[before..].iter().zip(draft).take_while(|(token, drafted)| token == drafted).count();
        self.kv.computed = before + accepted;
        if let Some(speculation) = self.speculation.as_mut() {
            // A dropped token decides something only when every kept one was accepted.
            let dropped = speculation.dropped.take().filter(|_| accepted == draft.len());
            let sampled_after = self.tokens.get(before + accepted);
            let dropped_hit = dropped.is_some_and(|token| sampled_after == Some(&token));
            let dropped_seen = usize::from(dropped.is_some() && sampled_after.is_some());
            if !draft.is_empty() || dropped_seen > 0 {
                speculation.drafter.observe(accepted + usize::from(dropped_hit), draft.len() + dropped_seen);
            }
            if !draft.is_empty() {
                speculation.verify_ct += 1;
                speculation.draft_tokens += draft.len();
                speculation.accepted_tokens += accepted;
            }
        }
        Advanced { output: output.expect("the loop advances at least once"), forced, drafted: draft.len(), accepted }
    }
}
