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
                    image_rows: seq.image_rows(e.start..e.end),
                    bidirectional: seq.bidirectional_in(e.start..e.end),
                    mrope: seq.mrope.as_ref(),
                    lora: seq.lora,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pooling::Pooling;
    use crate::request::{EmbedRequest, GenerateRequest, OutputSink};
    use crate::sequence::Speculation;
    use crate::speculative::{SpeculativeAlgorithm, Speculator};

    fn sink() -> OutputSink {
        OutputSink::new(std::sync::mpsc::channel().0, None)
    }

    /// A request for `prompt` (`extra`: more of its JSON fields).
    fn generating(prompt: &[u32], extra: &str) -> Sequence {
        let json = format!(r#"{{"rid": "x", "input_ids": {prompt:?}, "sampling_params": {{"max_new_tokens": 8}}{extra}}}"#);
        Sequence::new(GenerateRequest::from_json(&json).expect("a request"), sink(), &[], 64, 0)
    }

    fn embedding(prompt_len: usize, pooling: Pooling) -> Sequence {
        Sequence::embedding(EmbedRequest { rid: "e".into(), input_ids: vec![1; prompt_len] }, sink(), pooling, 4)
    }

    /// Whether an entry of `seq`'s tokens `start..end` completes it, and its rows.
    fn rows(seq: &Sequence, start: usize, end: usize) -> (bool, Range<usize>) {
        let entry = BatchEntry::new(0, seq, start, end);
        (entry.completes, entry.rows)
    }

    #[test]
    fn a_generating_entry_asks_for_the_rows_it_samples_or_scores() {
        let seq = generating(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], "");
        assert_eq!(rows(&seq, 0, 6), (false, 6..6), "a chunk midway: none");
        assert_eq!(rows(&seq, 6, 10), (true, 3..4), "the prompt's end: its last token's");
        let scored = generating(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], r#", "logprob_start_len": 3"#);
        assert_eq!(rows(&scored, 0, 6), (false, 0..6), "a prompt being scored: every token's");
        assert_eq!(rows(&scored, 6, 10), (true, 0..4));
    }

    #[test]
    fn a_drafting_entry_asks_for_a_row_after_each_draft_token() {
        let speculator = Speculator::new(SpeculativeAlgorithm::Ngram, 3, 0, false);
        let mut seq = generating(&[1, 2, 3, 1, 2, 3, 1, 2], "");
        seq.speculation = Some(Speculation::new(speculator.drafter()));
        seq.kv.computed = 8;
        seq.tokens.push(3); // sampled: decoding
        seq.draft(&speculator);
        let drafted = seq.draft_len();
        assert!(drafted > 0);
        assert_eq!(rows(&seq, 8, 9 + drafted), (true, 0..drafted + 1));
    }

    #[test]
    fn an_embedding_entry_asks_for_the_rows_its_pooling_takes() {
        let last = embedding(5, Pooling::Last);
        assert_eq!((rows(&last, 0, 3), rows(&last, 3, 5)), ((false, 3..3), (true, 1..2)));
        let mean = embedding(5, Pooling::Mean);
        assert_eq!((rows(&mean, 0, 3), rows(&mean, 3, 5)), ((false, 0..3), (true, 0..2)));
        let cls = embedding(5, Pooling::Cls);
        assert_eq!((rows(&cls, 0, 3), rows(&cls, 3, 5)), ((false, 0..1), (true, 2..2)));
    }

    #[test]
    fn the_model_runs_each_entry_and_its_rows_come_back_split_in_entry_order() {
        let running = [generating(&[1, 2, 3, 4, 5], ""), generating(&[6, 7, 8], ""), generating(&[9, 10, 11, 12], "")];
        let mut batch = Batch::default();
        assert!(batch.is_empty());
        // Request 2 whole, request 0's first chunk (no rows), request 1 whole.
        for (index, start, end) in [(2, 0, 4), (0, 0, 2), (1, 0, 3)] {
            batch.push(BatchEntry::new(index, &running[index], start, end));
        }
        let chunks = batch.chunks(&running);
        let ran: Vec<(&[u32], usize, Range<usize>)> = chunks.iter().map(|c| (c.tokens, c.start_pos, c.rows.clone())).collect();
        assert_eq!(ran, [(&[9, 10, 11, 12][..], 0, 3..4), (&[1, 2][..], 0, 2..2), (&[6, 7, 8][..], 0, 2..3)]);
        let output = [1.0, 1.5, 2.0, 2.5];
        assert_eq!(batch.split_rows(&output, 2), [vec![&[1.0, 1.5][..]], vec![], vec![&[2.0, 2.5][..]]]);
    }
}
