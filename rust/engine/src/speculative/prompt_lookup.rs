//! Prompt lookup: the longest n-gram ending at the request's last token that also occurs earlier
//! in its prompt or output, continued with the tokens that followed its most recent earlier
//! occurrence.
//!
//! An index from each n-gram (n in [`MIN_NGRAM`, `MAX_NGRAM`]) to the end of its most recent
//! occurrence grows as tokens are appended, so a step costs O(`MAX_NGRAM`) per new token plus
//! O(`MAX_NGRAM`) lookups, whatever the context length.

use super::Proposal;
use std::collections::HashMap;

/// A single shared token (a space, a comma, "the") predicts what follows poorly, and every wrong
/// draft token is compute spent for nothing once the batch is compute-bound; two tokens are the
/// shortest context that usually pins a copy down.
pub const MIN_NGRAM: usize = 2;
/// Past four tokens a match rarely changes which earlier occurrence is chosen.
pub const MAX_NGRAM: usize = 4;

#[derive(Debug, Default)]
pub struct PromptLookup {
    /// Hash of an n-gram (n implied by the hash chain) → end position of its most recent occurrence
    /// that has a token after it. Collisions are harmless: a hit is compared with the tokens.
    last_end: HashMap<u64, u32>,
    /// n-grams ending before this position are in `last_end`.
    indexed: usize,
}

impl PromptLookup {
    /// Up to `max` tokens to draft after `tokens`, which must extend the tokens of the previous
    /// call (a shorter sequence starts the index over). Empty when no n-gram matches.
    pub fn propose(&mut self, tokens: &[u32], max: usize) -> Proposal {
        let Some(last) = tokens.len().checked_sub(1) else { return Proposal::default() };
        if last < self.indexed {
            *self = Self::default();
        }
        // The n-grams ending at the last token are left out: they have no continuation yet, and
        // the lookup below would find the suffix itself.
        for end in self.indexed..last {
            for (_, hash) in ngram_hashes(tokens, end) {
                self.last_end.insert(hash, end as u32);
            }
        }
        self.indexed = last;

        let longest_first = ngram_hashes(tokens, last).collect::<Vec<_>>();
        for &(n, hash) in longest_first.iter().rev() {
            let Some(&end) = self.last_end.get(&hash) else { continue };
            let end = end as usize;
            if end + 1 >= n && tokens[end + 1 - n..=end] == tokens[last + 1 - n..] {
                return Proposal { pattern: n, tokens: continuation(tokens, end, max) };
            }
        }
        Proposal::default()
    }
}

/// (n, hash) of the n-grams ending at `end`, shortest first, for n in [`MIN_NGRAM`, `MAX_NGRAM`].
fn ngram_hashes(tokens: &[u32], end: usize) -> impl Iterator<Item = (usize, u64)> + '_ {
    tokens[..=end]
        .iter()
        .rev()
        .take(MAX_NGRAM)
        .scan(0u64, |hash, &token| {
            // Multiply-rotate mixing (FxHash's step): the key only has to spread over the map's buckets.
            *hash = (hash.rotate_left(5) ^ u64::from(token)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
            Some(*hash)
        })
        .enumerate()
        .map(|(i, hash)| (i + 1, hash))
        .skip(MIN_NGRAM - 1)
}

/// The `max` tokens after position `end`. When the match is recent (the text repeats with a
/// period shorter than `max`) the draft runs past the last token by continuing the repetition:
/// each position past the end copies the draft token one period back.
fn continuation(tokens: &[u32], end: usize, max: usize) -> Vec<u32> {
    let mut draft = Vec::with_capacity(max);
    for source in end + 1..end + 1 + max {
        let token = if source < tokens.len() { tokens[source] } else { draft[source - tokens.len()] };
        draft.push(token);
    }
    draft
}

#[cfg(test)]
mod tests {
    use super::*;

    fn propose(tokens: &[u32], max: usize) -> Vec<u32> {
        PromptLookup::default().propose(tokens, max).tokens
    }

    #[test]
    fn continues_an_earlier_occurrence() {
        assert_eq!(propose(&[1, 2, 3, 4, 5, 9, 2, 3], 3), vec![4, 5, 9]);
        // Fewer tokens after the match than asked for: the repetition continues.
        assert_eq!(propose(&[7, 1, 2, 3, 1, 2], 5), vec![3, 1, 2, 3, 1]);
    }

    #[test]
    fn prefers_the_longest_then_the_most_recent_match() {
        // "2 3" occurs twice before; the 3-gram "1 2 3" only at the start.
        assert_eq!(propose(&[1, 2, 3, 10, 2, 3, 20, 5, 1, 2, 3], 1), vec![10]);
        assert_eq!(PromptLookup::default().propose(&[1, 2, 3, 10, 2, 3, 20, 5, 1, 2, 3], 1).pattern, 3);
        // Only the bigram matches: its most recent occurrence wins.
        assert_eq!(propose(&[2, 3, 10, 2, 3, 20, 5, 2, 3], 1), vec![20]);
    }

    #[test]
    fn no_match_no_draft() {
        assert!(propose(&[], 4).is_empty());
        assert!(propose(&[5], 4).is_empty());
        assert!(propose(&[1, 2, 3, 4, 5], 4).is_empty());
        // A lone repeated token is below MIN_NGRAM.
        assert!(propose(&[1, 2, 3, 1], 4).is_empty());
        assert!(propose(&[1, 2, 1, 2], 0).is_empty());
    }

    #[test]
    fn a_repeated_token_run_drafts_more_of_it() {
        assert_eq!(propose(&[4, 4, 4], 5), vec![4; 5]);
    }

    #[test]
    fn incremental_matches_a_fresh_index_and_restarts_on_a_shorter_sequence() {
        let tokens: Vec<u32> = (0..3000u32).map(|i| (i * 7919 + i / 13) % 37).collect();
        let mut lookup = PromptLookup::default();
        for len in (1..tokens.len()).step_by(7) {
            assert_eq!(lookup.propose(&tokens[..len], 6).tokens, propose(&tokens[..len], 6), "at {len}");
        }
        let other = [9, 8, 9, 8];
        assert_eq!(lookup.propose(&other, 2).tokens, vec![9, 8]);
    }
}
