//! Embeddings: how a prompt's final-norm hidden states become one vector ([`Pooling`]), gathered
//! chunk by chunk as the prompt is prefilled ([`Pooler`]), then L2-normalized as SGLang and
//! llama.cpp's server return them.

use serde::{Deserialize, Serialize};
use std::ops::Range;

/// Which hidden states make the embedding (sentence-transformers' pooling modes, llama.cpp's
/// `pooling_type`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pooling {
    /// The last token's (Qwen3-Embedding, e5-mistral): with causal attention it has seen them all.
    #[default]
    Last,
    /// The mean over every token.
    Mean,
    /// The first token's.
    Cls,
}

impl Pooling {
    /// llama.cpp's `{arch}.pooling_type` (0 none, 1 mean, 2 cls, 3 last, 4 rank); `None` for
    /// none and for what rsgl does not pool by (rank).
    pub fn from_gguf(pooling_type: usize) -> Option<Pooling> {
        match pooling_type {
            1 => Some(Pooling::Mean),
            2 => Some(Pooling::Cls),
            3 => Some(Pooling::Last),
            _ => None,
        }
    }
}

/// One request's embedding in the making.
pub(crate) struct Pooler {
    pooling: Pooling,
    prompt_len: usize,
    /// The sum of the rows taken (mean), or the one row (last, cls).
    sum: Vec<f32>,
    /// Positions taken so far: a chunk computed again (after a retraction) is not counted twice.
    taken: usize,
}

impl Pooler {
    pub fn new(pooling: Pooling, hidden_size: usize, prompt_len: usize) -> Self {
        Pooler { pooling, prompt_len, sum: vec![0.0; hidden_size], taken: 0 }
    }

    /// The hidden-state rows a chunk of the prompt's positions `start..end` contributes,
    /// counted from `start`.
    pub fn rows(&self, start: usize, end: usize) -> Range<usize> {
        let n = end - start;
        match self.pooling {
            Pooling::Mean => 0..n,
            Pooling::Last if end == self.prompt_len => n - 1..n,
            Pooling::Cls if start == 0 => 0..1,
            Pooling::Last | Pooling::Cls => n..n,
        }
    }

    /// Takes the rows [`Self::rows`] asked for of the chunk `start..end`.
    pub fn take(&mut self, start: usize, end: usize, rows: &[&[f32]]) {
        let first = start + self.rows(start, end).start;
        for (row, pos) in rows.iter().zip(first..) {
            if pos < self.taken {
                continue;
            }
            match self.pooling {
                Pooling::Mean => self.sum.iter_mut().zip(row.iter()).for_each(|(s, x)| *s += x),
                Pooling::Last | Pooling::Cls => self.sum.copy_from_slice(row),
            }
            self.taken = pos + 1;
        }
    }

    /// The prompt's embedding, L2-normalized.
    pub fn finish(&mut self) -> Vec<f32> {
        if self.pooling == Pooling::Mean {
            let n = self.prompt_len as f32;
            self.sum.iter_mut().for_each(|s| *s /= n);
        }
        l2_normalized(std::mem::take(&mut self.sum))
    }
}

/// `v / |v|`, in f64 sums for long vectors; a zero vector stays zero.
fn l2_normalized(mut v: Vec<f32>) -> Vec<f32> {
    let norm = v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x = (*x as f64 / norm) as f32);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a prompt's rows (row `i` is its position's hidden state) through a pooler in chunks
    /// of `chunk` positions, as the engine does.
    fn pool(pooling: Pooling, states: &[Vec<f32>], chunk: usize) -> Vec<f32> {
        let mut pooler = Pooler::new(pooling, states[0].len(), states.len());
        for start in (0..states.len()).step_by(chunk) {
            let end = (start + chunk).min(states.len());
            let wanted = pooler.rows(start, end);
            let rows: Vec<&[f32]> = states[start + wanted.start..start + wanted.end].iter().map(Vec::as_slice).collect();
            pooler.take(start, end, &rows);
        }
        pooler.finish()
    }

    fn states() -> Vec<Vec<f32>> {
        vec![vec![3.0, 0.0], vec![1.0, 2.0], vec![-1.0, 4.0], vec![1.0, 2.0], vec![0.0, 6.0]]
    }

    fn close(a: &[f32], b: &[f32]) -> bool {
        a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-6)
    }

    #[test]
    fn each_pooling_picks_its_rows_whatever_the_chunks() {
        for chunk in [1, 2, 3, 5, 8] {
            // mean (0.8, 2.8) normalized; last (0, 6); cls (3, 0)
            let mean_norm = (0.8f32 * 0.8 + 2.8 * 2.8).sqrt();
            assert!(close(&pool(Pooling::Mean, &states(), chunk), &[0.8 / mean_norm, 2.8 / mean_norm]), "mean, chunks of {chunk}");
            assert!(close(&pool(Pooling::Last, &states(), chunk), &[0.0, 1.0]), "last, chunks of {chunk}");
            assert!(close(&pool(Pooling::Cls, &states(), chunk), &[1.0, 0.0]), "cls, chunks of {chunk}");
        }
    }

    #[test]
    fn a_chunk_computed_again_is_not_counted_twice() {
        let states = states();
        let rows = |range: Range<usize>| states[range].iter().map(Vec::as_slice).collect::<Vec<_>>();
        let mut pooler = Pooler::new(Pooling::Mean, 2, 5);
        pooler.take(0, 3, &rows(0..3));
        // Retracted, then admitted again: the prompt is computed from the start.
        pooler.take(0, 2, &rows(0..2));
        pooler.take(2, 5, &rows(2..5));
        assert!(close(&pooler.finish(), &pool(Pooling::Mean, &states, 5)));
    }

    #[test]
    fn rows_asked_for_by_pooling() {
        let pooler = |p| Pooler::new(p, 4, 10);
        assert_eq!(pooler(Pooling::Mean).rows(4, 8), 0..4);
        assert_eq!(pooler(Pooling::Last).rows(4, 8), 4..4);
        assert_eq!(pooler(Pooling::Last).rows(8, 10), 1..2);
        assert_eq!(pooler(Pooling::Cls).rows(0, 4), 0..1);
        assert_eq!(pooler(Pooling::Cls).rows(4, 8), 4..4);
    }

    #[test]
    fn normalizes_to_unit_length_and_reads_gguf_pooling_types() {
        let v = l2_normalized(vec![3.0, 4.0]);
        assert!(close(&v, &[0.6, 0.8]));
        assert_eq!(l2_normalized(vec![0.0, 0.0]), vec![0.0, 0.0]);
        let types: Vec<_> = (0..5).map(Pooling::from_gguf).collect();
        assert_eq!(types, [None, Some(Pooling::Mean), Some(Pooling::Cls), Some(Pooling::Last), None]);
    }
}
