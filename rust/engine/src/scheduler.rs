//! Continuous batching over the paged KV pool and the radix prefix cache.
//!
//! Each step: grow decoding requests by a page where they need one (evicting cached prefixes,
//! then retracting the newest requests when the pool is dry), admit waiting requests in policy
//! order (sharing their cached prefix, deferring those that share an uncached prefix with one
//! admitted in this step so that prefix is computed once), then plan the step: one token per
//! decoding request, then prompt chunks within the token budget.

use crate::config::EngineOptions;
use crate::kv::{PagePool, RadixCache};
use crate::model::SeqChunk;
use crate::policy::{admission_order, SchedulePolicy};
use crate::request::Sequence;
use std::collections::VecDeque;

pub(crate) struct Scheduler {
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    pool: PagePool,
    /// `None` when the radix cache is disabled.
    cache: Option<RadixCache>,
    policy: SchedulePolicy,
    max_running: usize,
    token_budget: usize,
    retractions: u64,
    /// Prompt tokens of admitted requests, and how many of them the cache supplied.
    admitted_prompt_tokens: u64,
    cache_hit_tokens: u64,
}

/// The scheduler's counters, for the engine's statistics.
pub(crate) struct SchedulerCounts {
    pub running: usize,
    pub waiting: usize,
    pub free_pages: usize,
    pub cached_pages: usize,
    pub admitted_prompt_tokens: u64,
    pub cache_hit_tokens: u64,
    pub retractions: u64,
}

/// Which tokens of `running[index]` go into this step.
pub(crate) struct Planned {
    pub index: usize,
    pub start: usize,
    pub end: usize,
}

impl Scheduler {
    pub fn new(pool: PagePool, opts: &EngineOptions) -> Self {
        let cache = (!opts.disable_radix_cache).then(|| RadixCache::new(pool.page_size()));
        Scheduler {
            waiting: VecDeque::new(),
            running: Vec::new(),
            pool,
            cache,
            policy: opts.schedule_policy,
            max_running: opts.max_running_requests,
            token_budget: opts.chunked_prefill_size,
            retractions: 0,
            admitted_prompt_tokens: 0,
            cache_hit_tokens: 0,
        }
    }

    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// Queues a request for admission.
    pub fn enqueue(&mut self, seq: Sequence) {
        self.waiting.push_back(seq);
    }

    /// Takes request `rid` out, queued or running (its pages go back as when it finishes).
    pub fn remove(&mut self, rid: &str) -> Option<Sequence> {
        if let Some(i) = self.waiting.iter().position(|s| s.rid == rid) {
            return self.waiting.remove(i);
        }
        let i = self.running.iter().position(|s| s.rid == rid)?;
        Some(self.retire(i))
    }

    /// Every request, queued then running.
    pub fn requests(&self) -> impl Iterator<Item = &Sequence> {
        self.waiting.iter().chain(&self.running)
    }

    /// The running requests, indexed as in this step's plan.
    pub fn running_mut(&mut self) -> &mut [Sequence] {
        &mut self.running
    }

    pub fn counts(&self) -> SchedulerCounts {
        SchedulerCounts {
            running: self.running.len(),
            waiting: self.waiting.len(),
            free_pages: self.pool.free_pages(),
            cached_pages: self.cached_pages(),
            admitted_prompt_tokens: self.admitted_prompt_tokens,
            cache_hit_tokens: self.cache_hit_tokens,
            retractions: self.retractions,
        }
    }

    /// Prepares this step's work.
    pub fn plan(&mut self) -> Vec<Planned> {
        self.grow_pages();
        self.admit();
        let mut plan = Vec::new();
        let mut budget = self.token_budget;
        for (index, seq) in self.running.iter().enumerate() {
            if seq.is_decoding() {
                plan.push(Planned { index, start: seq.computed, end: seq.tokens.len() });
                budget = budget.saturating_sub(1);
            }
        }
        for (index, seq) in self.running.iter().enumerate() {
            if !seq.is_decoding() && budget > 0 {
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
                SeqChunk {
                    tokens: &seq.tokens[p.start..p.end],
                    start_pos: p.start,
                    pages: &seq.pages,
                    want_logits: p.end == seq.tokens.len(),
                    all_logits: seq.wants_chunk_logits(p.start),
                }
            })
            .collect()
    }

    /// Evicts cached prefixes until `n` pages are free (or nothing evictable is left).
    fn make_room(&mut self, n: usize) -> bool {
        let short = n.saturating_sub(self.pool.free_pages());
        if short > 0 {
            if let Some(cache) = self.cache.as_mut() {
                let mut freed = cache.evict(short);
                self.pool.release(&mut freed);
            }
        }
        self.pool.free_pages() >= n
    }

    /// Takes `n` free pages, evicting cached prefixes if the pool is short.
    fn take_pages(&mut self, n: usize) -> Option<Vec<u32>> {
        self.make_room(n);
        self.pool.alloc(n)
    }

    /// Gives every running request the pages its next token needs, retracting the most recently
    /// admitted requests while the pool (and the evictable cache) cannot provide them.
    fn grow_pages(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            let need = self.pool.pages_for(self.running[i].tokens.len()).saturating_sub(self.running[i].pages.len());
            if need == 0 {
                i += 1;
                continue;
            }
            if let Some(pages) = self.take_pages(need) {
                self.running[i].pages.extend(pages);
                i += 1;
            } else {
                // Submit checked that one request fits the whole pool, so retracting others ends this loop.
                let victim = self.running.len() - 1;
                self.retract(victim);
            }
        }
    }

    /// Moves a running request back to the front of the queue; its output so far is kept and its
    /// KV recomputed (or found in the cache) when it is admitted again.
    fn retract(&mut self, index: usize) {
        let mut seq = self.running.remove(index);
        self.release(&mut seq);
        self.retractions += 1;
        self.waiting.push_front(seq);
    }

    fn admit(&mut self) {
        let queue: Vec<Sequence> = self.waiting.drain(..).collect();
        let order = admission_order(self.policy, &queue.iter().collect::<Vec<_>>(), self.cache.as_mut());
        let mut slots: Vec<Option<Sequence>> = queue.into_iter().map(Some).collect();
        let mut budget = self.token_budget;
        let first_admitted = self.running.len();
        for i in order {
            if self.running.len() >= self.max_running || budget == 0 {
                break;
            }
            let seq = slots[i].as_mut().expect("each index once");
            let (shared, node) = match self.cache.as_mut() {
                Some(cache) => {
                    let m = cache.match_prefix(seq.namespace, seq.prefill_key());
                    (m.pages, Some(m.node))
                }
                None => (Vec::new(), None),
            };
            let matched = shared.len() * self.pool.page_size();
            if self.cache.is_some() && self.shares_uncached_prefix(seq, matched, first_admitted) {
                continue; // computed once by the other request, then found in the cache
            }
            if let (Some(cache), Some(node)) = (self.cache.as_mut(), node) {
                cache.lock(node); // before evicting for our own pages
            }
            let need = self.pool.pages_for(seq.tokens.len()) - shared.len();
            // Leave a page per running request for its next decode page, so admitting does
            // not force a retraction right away (an empty batch always admits: progress).
            let headroom = self.running.len();
            let own = if self.make_room(need + headroom) { self.pool.alloc(need) } else { None };
            let Some(own) = own else {
                if let (Some(cache), Some(node)) = (self.cache.as_mut(), node) {
                    cache.unlock(node);
                }
                break; // no room: later requests wait too rather than overtake
            };
            let mut seq = slots[i].take().expect("present");
            if seq.admit(shared, own, node, matched) {
                self.admitted_prompt_tokens += seq.prompt_len as u64;
                self.cache_hit_tokens += matched as u64;
            }
            budget = budget.saturating_sub(seq.tokens.len() - matched);
            self.running.push(seq);
        }
        self.waiting = slots.into_iter().flatten().collect();
    }

    /// Whether `seq` shares at least one more page of prefix with a request admitted in this
    /// step than the cache holds.
    fn shares_uncached_prefix(&self, seq: &Sequence, matched: usize, first_admitted: usize) -> bool {
        let page = self.pool.page_size();
        self.running[first_admitted..].iter().any(|other| {
            let common = other.tokens.iter().zip(seq.prefill_key()).take_while(|(a, b)| a == b).count();
            other.namespace == seq.namespace && common / page * page > matched
        })
    }

    /// Caches the whole pages a running request has computed so far (after a prefill chunk),
    /// so requests admitted later can share them.
    pub fn cache_progress(&mut self, index: usize) {
        let Some(cache) = self.cache.as_mut() else { return };
        let seq = &mut self.running[index];
        let full = seq.computed / self.pool.page_size();
        if full <= seq.shared_pages {
            return;
        }
        let key = &seq.tokens[..full * self.pool.page_size()];
        let (mut duplicates, _) = cache.insert(seq.namespace, key, &seq.pages[..full]);
        // Point at the tree's pages (an earlier copy of the same tokens may have won), lock them.
        let m = cache.match_prefix(seq.namespace, key);
        cache.lock(m.node);
        if let Some(old) = seq.cache_node.replace(m.node) {
            cache.unlock(old);
        }
        seq.pages[..full].copy_from_slice(&m.pages);
        seq.shared_pages = full;
        self.pool.release(&mut duplicates);
    }

    /// Removes a running request for good, caching its computed pages.
    pub fn retire(&mut self, index: usize) -> Sequence {
        let mut seq = self.running.swap_remove(index);
        self.release(&mut seq);
        seq
    }

    /// Hands a request's pages back: whole computed pages to the cache, the rest to the pool.
    fn release(&mut self, seq: &mut Sequence) {
        let page = self.pool.page_size();
        if let Some(cache) = self.cache.as_mut() {
            let full = seq.computed / page;
            if full > 0 {
                let (mut duplicates, _) = cache.insert(seq.namespace, &seq.tokens[..full * page], &seq.pages[..full]);
                self.pool.release(&mut duplicates);
            }
            let mut tail = seq.pages.split_off(full.min(seq.pages.len()));
            self.pool.release(&mut tail);
            if let Some(node) = seq.cache_node.take() {
                cache.unlock(node);
            }
        } else {
            self.pool.release(&mut seq.pages);
        }
        seq.reset_kv();
    }

    /// Empties the prefix cache; refused (false) while requests are queued or running.
    pub fn flush_cache(&mut self) -> bool {
        if !self.is_idle() {
            return false;
        }
        if let Some(cache) = self.cache.as_mut() {
            let mut pages = cache.flush().expect("no request holds a lock when idle");
            self.pool.release(&mut pages);
        }
        true
    }

    fn cached_pages(&self) -> usize {
        self.cache.as_ref().map_or(0, |c| c.cached_pages())
    }
}
