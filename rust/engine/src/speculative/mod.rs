//! Draft tokens for speculative decoding without a draft model: the request's own text
//! ([`prompt_lookup`], n-gram matching) or a suffix trie over it and over recent outputs of other
//! requests ([`suffix`]), as many as the request's acceptance history asks for ([`draft_len`]) or
//! as the matched pattern is long.
//!
//! The engine holds one [`Speculator`] (the options and the window of recent outputs that all
//! requests share) and one [`Drafter`] per request; each step it asks for a draft, verifies it,
//! and reports how much was accepted. Drafters only read the request's tokens, so verification,
//! rollback and grammars stay with the engine.

mod budget;
mod draft_len;
mod prompt_lookup;
mod suffix;

pub use budget::{CostModel, StepCost};
use draft_len::DraftLength;
use prompt_lookup::PromptLookup;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use suffix::{GlobalSuffixCache, SuffixDrafter};

/// Where drafts come from (`--speculative-algorithm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SpeculativeAlgorithm {
    /// Prompt lookup: the longest recent n-gram of the request's prompt and output, continued.
    Ngram,
    /// SuffixDecoding: a suffix trie over the request and over recent outputs of other requests.
    Suffix,
}

/// A paused request (its drafts kept failing) still drafts behind a match this long: text that
/// turns to quoting again is caught at once, not at the next single-token probe.
const RESUME_PATTERN: usize = 3;

/// A drafter's continuation and the length of the pattern it continues.
#[derive(Debug, Default)]
struct Proposal {
    pattern: usize,
    tokens: Vec<u32>,
}

/// The speculation state shared by all requests.
#[derive(Debug)]
pub struct Speculator {
    algorithm: SpeculativeAlgorithm,
    max_draft: usize,
    recent_outputs: GlobalSuffixCache,
    /// What a decode step's rows cost, to budget its draft tokens (none: every draft token is
    /// verified).
    pub step_cost: Option<StepCost>,
}

/// One request's drafting state.
#[derive(Debug)]
pub struct Drafter {
    source: DraftSource,
    length: DraftLength,
}

#[derive(Debug)]
enum DraftSource {
    Ngram(PromptLookup),
    Suffix(SuffixDrafter),
}

impl Speculator {
    /// `max_draft` tokens at most per step (`--speculative-num-draft-tokens`); suffix drafting
    /// keeps about `window_tokens` tokens of recent outputs; `budget`: steps verify only the
    /// draft tokens their fitted cost says pay.
    pub fn new(algorithm: SpeculativeAlgorithm, max_draft: usize, window_tokens: usize, budget: bool) -> Self {
        let window_tokens = if algorithm == SpeculativeAlgorithm::Suffix { window_tokens } else { 0 };
        let step_cost = budget.then(StepCost::default);
        Self { algorithm, max_draft, recent_outputs: GlobalSuffixCache::new(window_tokens), step_cost }
    }

    pub fn drafter(&self) -> Drafter {
        let source = match self.algorithm {
            SpeculativeAlgorithm::Ngram => DraftSource::Ngram(PromptLookup::default()),
            SpeculativeAlgorithm::Suffix => DraftSource::Suffix(SuffixDrafter::default()),
        };
        Drafter { source, length: DraftLength::new(self.max_draft) }
    }

    /// Tokens to verify after `tokens` (the request's prompt and output so far; each call's must
    /// extend the previous call's), at most `max` (e.g. what `max_new_tokens` leaves) and at most
    /// `max_draft`: as many as the request's acceptance history asks for, or as the pattern the
    /// draft continues is long, whichever is more. Empty when nothing matches, or when the
    /// request's drafts are paused and the match is shorter than [`RESUME_PATTERN`].
    pub fn propose(&self, drafter: &mut Drafter, tokens: &[u32], max: usize) -> Vec<u32> {
        let length = drafter.length.next();
        let paused = length == 0;
        let longest = if paused { drafter.length.resume_length() } else { self.max_draft }.min(max);
        if longest == 0 {
            return Vec::new();
        }
        let mut proposal = match &mut drafter.source {
            DraftSource::Ngram(lookup) => lookup.propose(tokens, longest),
            DraftSource::Suffix(suffix) => suffix.propose(tokens, longest, &self.recent_outputs),
        };
        if paused && proposal.pattern < RESUME_PATTERN {
            return Vec::new();
        }
        // As long as the history asks, or as the pattern matched (SuffixDecoding's rule: text that
        // repeats a long stretch tends to go on repeating it), whichever is longer; the drafter
        // already stopped at `longest`.
        proposal.tokens.truncate(length.max(proposal.pattern));
        proposal.tokens
    }

    /// A request finished with `output`: it joins the window that suffix drafts also draw from.
    pub fn finished(&mut self, output: &[u32]) {
        if self.algorithm == SpeculativeAlgorithm::Suffix {
            self.recent_outputs.insert(output);
        }
    }
}

impl Drafter {
    /// The verify of the last draft (`proposed` tokens) accepted its first `accepted` tokens.
    pub fn observe(&mut self, accepted: usize, proposed: usize) {
        self.length.observe(accepted, proposed);
    }

    /// The chance one of this request's draft tokens is accepted when the ones before it were.
    pub fn token_acceptance(&self) -> f32 {
        self.length.token_acceptance()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn algorithm_names_as_options_spell_them() {
        let parse = |name: &str| serde_json::from_str::<SpeculativeAlgorithm>(&format!("{name:?}"));
        assert_eq!(parse("ngram").unwrap(), SpeculativeAlgorithm::Ngram);
        assert_eq!(parse("suffix").unwrap(), SpeculativeAlgorithm::Suffix);
        assert!(parse("eagle").is_err());
    }

    /// Drafts a greedy "model" that copies a document with a few edits: drafts grow while the
    /// copy holds, and every step's draft is checked against the true next tokens.
    fn copy_with_edits(algorithm: SpeculativeAlgorithm) -> (usize, usize) {
        let document: Vec<u32> = (0..600u32).map(|i| (i * 7919) % 1000).collect();
        let mut edited = document.clone();
        for i in (50..600).step_by(97) {
            edited[i] = 5000 + i as u32;
        }
        let speculator = Speculator::new(algorithm, 8, 0, false);
        let mut drafter = speculator.drafter();
        let mut tokens = document;
        let (mut steps, mut generated) = (0, 0);
        while generated < edited.len() {
            let draft = speculator.propose(&mut drafter, &tokens, edited.len() - generated);
            let truth = &edited[generated..];
            let accepted = draft.iter().zip(truth).take_while(|(d, t)| d == t).count();
            drafter.observe(accepted, draft.len());
            // The verify step also yields the model's own token after the accepted ones.
            let committed = (accepted + 1).min(truth.len());
            tokens.extend_from_slice(&truth[..committed]);
            generated += committed;
            steps += 1;
        }
        (steps, generated)
    }

    #[test]
    fn copying_takes_far_fewer_steps_than_tokens() {
        for algorithm in [SpeculativeAlgorithm::Ngram, SpeculativeAlgorithm::Suffix] {
            let (steps, generated) = copy_with_edits(algorithm);
            assert!(steps * 4 < generated, "{algorithm:?}: {steps} steps for {generated} tokens");
        }
    }

    #[test]
    fn a_long_match_drafts_at_least_its_length() {
        for algorithm in [SpeculativeAlgorithm::Ngram, SpeculativeAlgorithm::Suffix] {
            let speculator = Speculator::new(algorithm, 8, 0, false);
            // A new request's history asks for 2 tokens; the 4-token match "1 2 3 4" gets 4.
            let tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4];
            assert_eq!(speculator.propose(&mut speculator.drafter(), &tokens, 8), vec![5, 6, 7, 8], "{algorithm:?}");
            assert_eq!(speculator.propose(&mut speculator.drafter(), &tokens[..12], 8), vec![3, 4], "{algorithm:?}");
        }
    }

    #[test]
    fn a_paused_request_drafts_again_behind_a_long_match() {
        for algorithm in [SpeculativeAlgorithm::Ngram, SpeculativeAlgorithm::Suffix] {
            let speculator = Speculator::new(algorithm, 8, 0, false);
            let mut drafter = speculator.drafter();
            // "7 8" went on with 1 and 2 before: every draft after "7 8" fails until drafts pause.
            let mut tokens = vec![7, 8, 1, 7, 8, 2];
            let mut paused_at = None;
            for step in 0..10 {
                tokens.extend([7, 8]);
                let draft = speculator.propose(&mut drafter, &tokens, 8);
                if draft.is_empty() {
                    paused_at = Some(step);
                    break;
                }
                drafter.observe(0, draft.len());
                tokens.push(100 + step);
            }
            assert!(paused_at.is_some(), "{algorithm:?}: drafts never paused");
            // A two-token match stays paused; a three-token one ("30 31 32", quoted) drafts.
            tokens.extend([30, 31, 32, 33, 34, 35, 36, 0, 30, 31]);
            assert!(speculator.propose(&mut drafter, &tokens, 8).is_empty(), "{algorithm:?}");
            tokens.push(32);
            assert_eq!(speculator.propose(&mut drafter, &tokens, 8), vec![33, 34], "{algorithm:?}");
        }
    }

    #[test]
    fn suffix_drafts_draw_on_finished_requests() {
        let mut speculator = Speculator::new(SpeculativeAlgorithm::Suffix, 4, 1 << 16, false);
        speculator.finished(&[10, 11, 12, 13, 14, 15]);
        let mut drafter = speculator.drafter();
        assert_eq!(speculator.propose(&mut drafter, &[1, 11, 12], 8), vec![13, 14]);
        let mut ngram = Speculator::new(SpeculativeAlgorithm::Ngram, 4, 1 << 16, false);
        ngram.finished(&[10, 11, 12, 13, 14, 15]);
        assert!(ngram.propose(&mut ngram.drafter(), &[1, 11, 12], 8).is_empty());
    }

    /// Per-propose cost at long contexts, one new token per step as in decoding:
    /// `cargo test --release -p rsgl-engine speculative::tests::propose_cost -- --ignored --nocapture`.
    #[test]
    #[ignore = "benchmark"]
    fn propose_cost() {
        // Natural-ish text: mostly fresh tokens from a 32k vocabulary, with recurring phrases.
        let text = |len: usize, seed: u64| -> Vec<u32> {
            let mut state = seed;
            let mut next = move || {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (state >> 33) as u32
            };
            let mut tokens = Vec::with_capacity(len);
            while tokens.len() < len {
                let phrase = next() % 64;
                if phrase < 8 {
                    tokens.extend((0..12).map(|i| 40_000 + phrase * 100 + i));
                } else {
                    tokens.push(next() % 32_000);
                }
            }
            tokens.truncate(len);
            tokens
        };
        for algorithm in [SpeculativeAlgorithm::Ngram, SpeculativeAlgorithm::Suffix] {
            for context in [4096, 32_768] {
                let mut speculator = Speculator::new(algorithm, 8, 1 << 18, false);
                for seed in 0..64 {
                    speculator.finished(&text(4096, 100 + seed));
                }
                let tokens = text(context + 1024, 7);
                let (prompt, decode) = tokens.split_at(context);
                let mut drafter = speculator.drafter();
                let started = Instant::now();
                speculator.propose(&mut drafter, prompt, 8);
                let first = started.elapsed();
                let (mut drafted, mut slowest, mut total) = (0, Duration::ZERO, Duration::ZERO);
                for end in context + 1..=tokens.len() {
                    let started = Instant::now();
                    let draft = speculator.propose(&mut drafter, &tokens[..end], 8).len();
                    let took = started.elapsed();
                    (slowest, total) = (slowest.max(took), total + took);
                    // Reported as accepted, so the drafts stay at full length.
                    drafter.observe(draft, draft);
                    drafted += draft;
                }
                let per_step = total / decode.len() as u32;
                println!("{algorithm:?} context {context}: first propose (indexes the prompt) {first:?}, then {per_step:?} per step on average, {slowest:?} at most ({drafted} tokens drafted in {} steps)", decode.len());
            }
        }
    }
}
