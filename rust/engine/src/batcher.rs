//! First-come-first-served continuous batching: each step decodes every running request by one
//! token and spends the rest of the token budget on prompt chunks, admitting waiting requests
//! in arrival order while their whole KV need (prompt + output budget) fits in the pool.
//! Reserving the whole need up front means a running request never runs out of pages.

use crate::config::EngineOptions;
use crate::kv::BlockPool;
use crate::model::SeqChunk;
use crate::request::Sequence;
use std::collections::VecDeque;

pub(crate) struct Batcher {
    pub waiting: VecDeque<Sequence>,
    pub running: Vec<Sequence>,
    pub pool: BlockPool,
    max_running: usize,
    token_budget: usize,
}

/// Which tokens of `running[index]` go into this step.
pub(crate) struct Planned {
    pub index: usize,
    pub start: usize,
    pub end: usize,
}

impl Batcher {
    pub fn new(pool: BlockPool, opts: &EngineOptions) -> Self {
        Batcher {
            waiting: VecDeque::new(),
            running: Vec::new(),
            pool,
            max_running: opts.max_running_requests,
            token_budget: opts.chunked_prefill_size,
        }
    }

    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    fn admit(&mut self) {
        while self.running.len() < self.max_running {
            let Some(front) = self.waiting.front() else { break };
            let Some(pages) = self.pool.alloc(self.pool.pages_for(front.max_len())) else { break };
            let mut seq = self.waiting.pop_front().expect("front exists");
            seq.pages = pages;
            self.running.push(seq);
        }
    }

    /// Admits what fits and picks this step's work: decodes first, then prompt chunks.
    pub fn plan(&mut self) -> Vec<Planned> {
        self.admit();
        let mut plan = Vec::new();
        let mut budget = self.token_budget;
        let decoding = |s: &Sequence| s.computed + 1 == s.tokens.len() && s.computed >= s.prompt_len;
        for (index, seq) in self.running.iter().enumerate() {
            if decoding(seq) {
                plan.push(Planned { index, start: seq.computed, end: seq.tokens.len() });
                budget = budget.saturating_sub(1);
            }
        }
        for (index, seq) in self.running.iter().enumerate() {
            if !decoding(seq) && budget > 0 {
                let end = seq.tokens.len().min(seq.computed + budget);
                budget -= end - seq.computed;
                plan.push(Planned { index, start: seq.computed, end });
            }
        }
        plan
    }

    pub fn chunks<'a>(&'a self, plan: &[Planned]) -> Vec<SeqChunk<'a>> {
        plan.iter()
            .map(|p| {
                let seq = &self.running[p.index];
                SeqChunk { tokens: &seq.tokens[p.start..p.end], start_pos: p.start, pages: &seq.pages, want_logits: p.end == seq.tokens.len() }
            })
            .collect()
    }

    /// Removes a running request and returns its pages to the pool.
    pub fn retire(&mut self, index: usize) -> Sequence {
        let mut seq = self.running.swap_remove(index);
        self.pool.release(&mut seq.pages);
        seq
    }
}
