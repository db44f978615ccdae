//! One step's batch: which tokens of which running requests go through the model, and which
//! output rows (logits, or an embedding model's hidden states) come back for each. The model
//! and the engine both read the rows by this plan.

use crate::model::SeqChunk;
use crate::sequence::Sequence;
use std::ops::Range;

/// Tokens `start..end` of the running request at `index`, computed in this step.
pub(crate) struct BatchEntry {
    pub index: usize,
    pub start: usize,
    pub end: usize,
    /// Whether the entry reaches the request's last known token: the next token is sampled
    /// from its last logits row (an embedding request ends).
    pub completes: bool,
    /// The entry's tokens (counted from `start`) after which a row comes back, one row each.
    rows: Range<usize>,
    /// `(n, slot)`: the recurrent state after the first `n` tokens is also copied into state
    /// slot `slot`, for the prefix cache (models with recurrent layers).
    pub snapshot: Option<(usize, u32)>,
}

impl BatchEntry {
    /// The row rule: an embedding request's the ones its pooling takes; a row after every token
    /// of a prompt being scored; else one after the last token when the entry completes its
    /// request (and after each token of a draft it verifies), else none (a prompt chunk midway).
    pub fn new(index: usize, seq: &Sequence, start: usize, end: usize) -> Self {
        let n = end - start;
        let completes = end == seq.tokens.len();
        let rows = if let Some(pooler) = &seq.pooler {
            pooler.rows(start, end)
        } else if seq.wants_chunk_logits(start) {
            0..n
        } else if completes {
            n - 1 - seq.draft_len()..n // the last token's row, and one after each draft token
        } else {
            n..n
        };
        BatchEntry { index, start, end, completes, rows, snapshot: None }
    }
}

#[derive(Default)]
pub(crate) struct Batch {
    entries: Vec<BatchEntry>,
}

impl Batch {
    pub fn push(&mut self, entry: BatchEntry) {
        self.entries.push(entry);
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn entries(&self) -> &[BatchEntry] {
        &self.entries
    }

    /// What the model runs, in entry order; `running` is the scheduler's running list the
    /// entries index.
    pub fn chunks<'a>(&self, running: &'a [Sequence]) -> Vec<SeqChunk<'a>> {
        self.entries
            .iter()
            .map(|e| {
                let seq = &running[e.index];
                SeqChunk {
                    tokens: &seq.tokens[e.start..e.end],
                    start_pos: e.start,
                    pages: &seq.kv.pages,
                    window_pages: &seq.kv.window,
                    rows: e.rows.clone(),
                    state_slot: seq.kv.state_slot.map(|slot| slot as usize),
                    snapshot: e.snapshot.map(|(n, slot)| (n, slot as usize)),
                }
            })
            .collect()
    }

    /// The model's output (`[rows, width]`, as [`Self::chunks`] asked for them) split into
    /// each entry's rows, in entry order.
    pub fn split_rows<'l>(&self, output: &'l [f32], width: usize) -> Vec<Vec<&'l [f32]>> {
        let mut rows = output.chunks_exact(width);
        let split: Vec<Vec<&[f32]>> = self.entries.iter().map(|e| rows.by_ref().take(e.rows.len()).collect()).collect();
        debug_assert!(rows.next().is_none(), "the model returned more rows than the batch asked for");
        split
    }
}
