//! Suffix drafting (SuffixDecoding, Oliaro et al. 2024): a depth-bounded suffix trie counts how
//! often each continuation followed each recent pattern, over the request's own tokens and over a
//! bounded window of other requests' outputs; the draft follows the most frequent continuation of
//! the longest pattern matched at the end of the request, for as long as the counts stay
//! confident. This first version drafts a single chain, not a tree of candidates.
//!
//! The trie is built lazily: a suffix stops descending at the first node it creates (a leaf
//! remembers where its occurrence ended in the token buffer and reads the rest from there), and a
//! leaf grows a child only when a second occurrence reaches it. Text without repeats costs about
//! one node per token; repeated text up to `max_depth` nodes per token, where it pays off.
//!
//! Costs, with D = `max_depth`: appending a token O(a) hash operations, a ≤ D the number of
//! suffixes still matching earlier text (usually a handful); the request's own longest match is
//! the deepest of those, O(1); the global window's is a binary search over the pattern length,
//! O(D log D); a draft of k tokens O(k).

use super::Proposal;
use std::collections::HashMap;

/// Separates sequences in the global window's buffer; no vocabulary is this large.
const SEPARATOR: u32 = u32::MAX;
const NO_CHILD: u32 = u32::MAX;
const ROOT: u32 = 0;
/// A draft stops once the counts give its tokens less than this chance of all being right: past
/// a point where earlier text went several ways, guessing costs more than it saves.
const MIN_CONFIDENCE: f32 = 0.1;
/// Shortest pattern a draft continues: as for prompt lookup's n-grams, one shared token predicts
/// what follows poorly, and its failed drafts pause a request that is about to quote.
const MIN_PATTERN: usize = 2;
/// Longest pattern matched at the end of a request (and depth of the trie).
pub const MAX_PATTERN: usize = 32;

#[derive(Debug)]
struct Node {
    token: u32,
    /// Occurrences of this node's pattern (counted where the trie is materialized).
    count: u32,
    /// Buffer position of the last token of the pattern's most recent occurrence.
    last_end: u32,
    /// The child with the highest count (the most recent on ties): the likeliest continuation.
    best_child: u32,
}

/// A place in the trie: at a node, or past a leaf in the buffer tail of its one occurrence.
#[derive(Debug, Clone, Copy)]
enum Cursor {
    Node(u32),
    Tail(usize),
}

/// A drafted chain, its expected number of accepted tokens under the trie's counts, and the
/// length of the pattern it continues.
#[derive(Debug, Default)]
struct Draft {
    tokens: Vec<u32>,
    score: f32,
    pattern: usize,
}

#[derive(Debug)]
struct SuffixTrie {
    max_depth: usize,
    /// Every token inserted, sequences separated by [`SEPARATOR`].
    buffer: Vec<u32>,
    nodes: Vec<Node>,
    children: HashMap<(u32, u32), u32>,
    /// Suffixes ending at the last token that matched earlier text so far, as (node, depth),
    /// shallowest first; they descend one level per appended token.
    matching: Vec<(u32, usize)>,
}

impl SuffixTrie {
    fn new(max_depth: usize) -> Self {
        let root = Node { token: SEPARATOR, count: 0, last_end: 0, best_child: NO_CHILD };
        Self { max_depth, buffer: Vec::new(), nodes: vec![root], children: HashMap::new(), matching: Vec::new() }
    }

    /// Tokens in the buffer, separators included.
    fn len(&self) -> usize {
        self.buffer.len()
    }

    /// Appends one sequence as its own (after a separator), so no pattern spans two sequences.
    fn insert_sequence(&mut self, tokens: &[u32]) {
        if !self.buffer.is_empty() {
            self.buffer.push(SEPARATOR);
            self.matching.clear();
        }
        tokens.iter().for_each(|&token| self.push(token));
    }

    /// Appends one token: every suffix still matching, and the new one-token suffix, descend by it.
    fn push(&mut self, token: u32) {
        let end = self.buffer.len();
        self.buffer.push(token);
        self.nodes[ROOT as usize].count += 1;
        self.matching.insert(0, (ROOT, 0));
        let mut kept = 0;
        for i in 0..self.matching.len() {
            let (parent, depth) = self.matching[i];
            if let Some(child) = self.descend(parent, depth + 1, token, end) {
                if depth + 1 < self.max_depth {
                    self.matching[kept] = (child, depth + 1);
                    kept += 1;
                }
            }
        }
        self.matching.truncate(kept);
    }

    /// Counts the occurrence ending at `end` at `parent`'s child for `token`; `Some` when that
    /// child existed (the pattern occurred before), `None` when it is a new leaf.
    fn descend(&mut self, parent: u32, depth: usize, token: u32, end: usize) -> Option<u32> {
        let Some(&child) = self.children.get(&(parent, token)) else {
            let leaf = self.add_node(parent, token, end);
            self.children.insert((parent, token), leaf);
            return None;
        };
        let node = &self.nodes[child as usize];
        if node.best_child == NO_CHILD && depth < self.max_depth {
            // A second occurrence reached the leaf: the first one's next token becomes a child.
            let first_next = node.last_end as usize + 1;
            if let Some(next) = self.buffer_token(first_next) {
                let grandchild = self.add_node(child, next, first_next);
                self.children.insert((child, next), grandchild);
            }
        }
        let node = &mut self.nodes[child as usize];
        node.count += 1;
        node.last_end = end as u32;
        self.rank_child(parent, child);
        Some(child)
    }

    fn add_node(&mut self, parent: u32, token: u32, end: usize) -> u32 {
        let id = self.nodes.len() as u32;
        self.nodes.push(Node { token, count: 1, last_end: end as u32, best_child: NO_CHILD });
        self.rank_child(parent, id);
        id
    }

    fn rank_child(&mut self, parent: u32, child: u32) {
        let best = self.nodes[parent as usize].best_child;
        if best == NO_CHILD || self.nodes[child as usize].count >= self.nodes[best as usize].count {
            self.nodes[parent as usize].best_child = child;
        }
    }

    fn buffer_token(&self, position: usize) -> Option<u32> {
        self.buffer.get(position).copied().filter(|&token| token != SEPARATOR)
    }

    fn advance(&self, cursor: Cursor, token: u32) -> Option<Cursor> {
        let tail_from = match cursor {
            Cursor::Node(id) => {
                if let Some(&child) = self.children.get(&(id, token)) {
                    return Some(Cursor::Node(child));
                }
                let node = &self.nodes[id as usize];
                if node.best_child != NO_CHILD || id == ROOT {
                    return None;
                }
                node.last_end as usize
            }
            Cursor::Tail(position) => position,
        };
        (self.buffer_token(tail_from + 1) == Some(token)).then_some(Cursor::Tail(tail_from + 1))
    }

    fn walk(&self, pattern: &[u32]) -> Option<Cursor> {
        pattern.iter().try_fold(Cursor::Node(ROOT), |cursor, &token| self.advance(cursor, token))
    }

    /// The longest suffix of `context` (from [`MIN_PATTERN`] up to `max_depth` tokens) that
    /// occurs in the trie, and its length. A pattern's suffixes occur wherever it does, so the
    /// matched lengths are a prefix of 1..=D and a binary search finds the longest.
    fn longest_match(&self, context: &[u32]) -> Option<(usize, Cursor)> {
        let mut longest = None;
        let (mut low, mut high) = (MIN_PATTERN, context.len().min(self.max_depth));
        while low <= high {
            let length = (low + high) / 2;
            match self.walk(&context[context.len() - length..]) {
                Some(found) => (longest, low) = (Some((length, found)), length + 1),
                None => high = length - 1,
            }
        }
        longest
    }

    /// Follows the likeliest continuation from `cursor` for up to `max` tokens. `own_count` is
    /// subtracted from the first node's count when that count includes an occurrence with no
    /// continuation yet (the request's own end).
    fn continuation(&self, mut cursor: Cursor, max: usize, own_count: u32) -> Draft {
        let mut draft = Draft::default();
        let (mut confidence, mut own_count) = (1.0f32, own_count);
        while draft.tokens.len() < max {
            let (token, next, chance) = match cursor {
                Cursor::Node(id) => {
                    let node = &self.nodes[id as usize];
                    if node.best_child != NO_CHILD {
                        let best = &self.nodes[node.best_child as usize];
                        let seen = node.count.saturating_sub(own_count).max(best.count);
                        (best.token, Cursor::Node(node.best_child), best.count as f32 / seen as f32)
                    } else {
                        let Some(token) = self.buffer_token(node.last_end as usize + 1) else { break };
                        (token, Cursor::Tail(node.last_end as usize + 1), 1.0)
                    }
                }
                Cursor::Tail(position) => {
                    let Some(token) = self.buffer_token(position + 1) else { break };
                    (token, Cursor::Tail(position + 1), 1.0)
                }
            };
            confidence *= chance;
            if confidence < MIN_CONFIDENCE {
                break;
            }
            draft.tokens.push(token);
            draft.score += confidence;
            (cursor, own_count) = (next, 0);
        }
        draft
    }
}

/// The recent outputs of finished requests, about `budget` tokens: two generations of half the
/// budget each; when the newer one fills, the older one is dropped whole (the oldest half of the
/// window goes at once, which keeps eviction free of per-node bookkeeping).
#[derive(Debug)]
pub struct GlobalSuffixCache {
    budget: usize,
    newer: SuffixTrie,
    older: SuffixTrie,
}

impl GlobalSuffixCache {
    pub fn new(budget: usize) -> Self {
        Self { budget, newer: SuffixTrie::new(MAX_PATTERN), older: SuffixTrie::new(MAX_PATTERN) }
    }

    /// Tokens held, separators included; at most `budget`.
    #[cfg(test)]
    pub fn tokens_held(&self) -> usize {
        self.newer.len() + self.older.len()
    }

    /// Adds a finished request's output (at most its last half budget of tokens).
    pub fn insert(&mut self, output: &[u32]) {
        let half = self.budget / 2;
        let output = &output[output.len().saturating_sub(half)..];
        if output.is_empty() {
            return;
        }
        if self.newer.len() + 1 + output.len() > half {
            self.older = std::mem::replace(&mut self.newer, SuffixTrie::new(MAX_PATTERN));
        }
        self.newer.insert_sequence(output);
    }

    fn draft(&self, context: &[u32], max: usize) -> Draft {
        [&self.newer, &self.older]
            .into_iter()
            .filter_map(|trie| trie.longest_match(context).map(|(pattern, cursor)| Draft { pattern, ..trie.continuation(cursor, max, 0) }))
            .max_by(|a, b| a.score.total_cmp(&b.score))
            .unwrap_or_default()
    }
}

/// A request's suffix drafting state: a trie over its own prompt and output.
#[derive(Debug)]
pub struct SuffixDrafter {
    own: SuffixTrie,
}

impl Default for SuffixDrafter {
    fn default() -> Self {
        Self { own: SuffixTrie::new(MAX_PATTERN) }
    }
}

impl SuffixDrafter {
    /// Up to `max` tokens to draft after `tokens` (which must extend the previous call's; a
    /// shorter sequence starts over): the better scored of the request's own and the global
    /// window's continuations.
    pub fn propose(&mut self, tokens: &[u32], max: usize, global: &GlobalSuffixCache) -> Proposal {
        if tokens.len() < self.own.len() {
            *self = Self::default();
        }
        tokens[self.own.len()..].iter().for_each(|&token| self.own.push(token));
        // The deepest suffix still matching is the longest pattern seen earlier in the request;
        // its node's count includes the request's own end, which has no continuation yet.
        let own = match self.own.matching.last() {
            Some(&(node, pattern)) if pattern >= MIN_PATTERN => Draft { pattern, ..self.own.continuation(Cursor::Node(node), max, 1) },
            _ => Draft::default(),
        };
        let global = global.draft(tokens, max);
        let best = if global.score > own.score { global } else { own };
        Proposal { pattern: best.pattern, tokens: best.tokens }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own_draft(tokens: &[u32], max: usize) -> Vec<u32> {
        SuffixDrafter::default().propose(tokens, max, &GlobalSuffixCache::new(0)).tokens
    }

    #[test]
    fn continues_the_request_own_text() {
        assert_eq!(own_draft(&[1, 2, 3, 4, 5, 9, 2, 3], 3), vec![4, 5, 9]);
        // The longest pattern decides: "1 2 3" went on with 10, "2 3" most recently with 20.
        assert_eq!(own_draft(&[1, 2, 3, 10, 2, 3, 20, 5, 1, 2, 3], 1), vec![10]);
        assert!(own_draft(&[1, 2, 3, 4, 5], 3).is_empty());
        // One shared token is too short a pattern to continue.
        assert!(own_draft(&[1, 2, 3, 9, 3], 2).is_empty());
        assert!(own_draft(&[], 3).is_empty());
        assert!(own_draft(&[1, 2, 1, 2], 0).is_empty());
    }

    #[test]
    fn follows_the_most_frequent_continuation_while_confident() {
        // After "5 6": 7 three times, 8 once; "5 6 7 1" then went on with 5 twice, with 0 once
        // (the most recent).
        let tokens = [5, 6, 7, 1, 5, 6, 8, 2, 5, 6, 7, 1, 5, 6, 7, 1, 0, 5, 6];
        assert_eq!(own_draft(&tokens, 4), vec![7, 1, 5, 6]);
        // After "3": eleven different tokens; none is likely enough to draft.
        let scattered: Vec<u32> = (10..21).flat_map(|t| [3, t]).chain([3]).collect();
        assert!(own_draft(&scattered, 4).is_empty());
    }

    #[test]
    fn drafts_from_other_requests_outputs() {
        let mut global = GlobalSuffixCache::new(1000);
        global.insert(&[40, 41, 42, 43, 44, 45]);
        global.insert(&[50, 41, 42, 60]);
        let mut drafter = SuffixDrafter::default();
        assert_eq!(drafter.propose(&[1, 2, 40, 41, 42], 3, &global).tokens, vec![43, 44, 45]);
        // A pattern ending at a sequence's end has no continuation across the separator.
        assert!(drafter.propose(&[1, 2, 40, 41, 42, 9, 44, 45], 3, &global).tokens.is_empty());
    }

    #[test]
    fn a_long_match_continues_from_the_buffer() {
        let text: Vec<u32> = (0..100).collect();
        let mut global = GlobalSuffixCache::new(1000);
        global.insert(&text);
        let mut context = vec![7; 3];
        context.extend(10..60);
        assert_eq!(SuffixDrafter::default().propose(&context, 5, &global).tokens, vec![60, 61, 62, 63, 64]);
    }

    #[test]
    fn the_global_window_stays_within_its_budget_and_drops_the_oldest() {
        let budget = 64;
        let mut global = GlobalSuffixCache::new(budget);
        for request in 0..50u32 {
            global.insert(&(0..11).map(|i| 1000 * request + i).collect::<Vec<_>>());
            assert!(global.tokens_held() <= budget, "{} tokens held", global.tokens_held());
        }
        let draft = |global: &GlobalSuffixCache, context: &[u32]| SuffixDrafter::default().propose(context, 2, global).tokens;
        assert_eq!(draft(&global, &[49_003, 49_004]), vec![49_005, 49_006]);
        assert!(draft(&global, &[3, 4]).is_empty());
        // One output longer than the budget keeps only its end.
        global.insert(&(0..500).collect::<Vec<_>>());
        assert!(global.tokens_held() <= budget);
        assert_eq!(draft(&global, &[497, 498]), vec![499]);
        assert!(draft(&global, &[100, 101]).is_empty());
    }

    #[test]
    fn incremental_trie_restarts_on_a_shorter_sequence() {
        let global = GlobalSuffixCache::new(0);
        let mut drafter = SuffixDrafter::default();
        let tokens: Vec<u32> = (0..2000u32).map(|i| (i * 7919 + i / 13) % 37).collect();
        for len in (1..tokens.len()).step_by(11) {
            assert_eq!(drafter.propose(&tokens[..len], 6, &global).tokens, own_draft(&tokens[..len], 6), "at {len}");
        }
        assert_eq!(drafter.propose(&[9, 8, 9, 8], 2, &global).tokens, vec![9, 8]);
    }

    #[test]
    fn trie_counts_match_a_naive_count_of_patterns() {
        let tokens: Vec<u32> = (0..400u32).map(|i| (i * i + i / 7) % 5).collect();
        let mut trie = SuffixTrie::new(6);
        tokens.iter().for_each(|&t| trie.push(t));
        for length in 1..=6 {
            for start in 0..=tokens.len() - length {
                let pattern = &tokens[start..start + length];
                let occurrences = tokens.windows(length).filter(|w| *w == pattern).count();
                let Some(Cursor::Node(node)) = trie.walk(pattern) else {
                    assert_eq!(occurrences, 1, "{pattern:?} is only in a tail but occurs {occurrences} times");
                    continue;
                };
                assert_eq!(trie.nodes[node as usize].count as usize, occurrences, "{pattern:?}");
            }
        }
    }
}
