//! Continuous batching over the paged KV pool and the radix prefix cache.
//!
//! Each step: grow decoding requests by a page where they need one (evicting cached prefixes,
//! then retracting the newest requests when the pool is dry), admit waiting requests in policy
//! order (sharing their cached prefix, deferring those that share an uncached prefix with one
//! admitted in this step so that prefix is computed once), then plan the step: one token per
//! decoding request, then prompt chunks within the token budget.
//!
//! With the disk tier on, a request's prompt pages past what memory holds are read back from
//! disk at admission (the kernel prefetches them while it waits), and every page a request
//! completes is written there too ([`Scheduler::persist`]).

use crate::batch::{Batch, BatchEntry};
use crate::config::EngineOptions;
use crate::kv::disk::{page_hashes, DiskTier, DiskTierStats, PageHash, PageRecord};
use crate::kv::{KvCache, NoPrefixCache, PagePool, PrefixCache, RadixCache};
use crate::policy::{admission_order, SchedulePolicy};
use crate::sequence::Sequence;
use std::collections::VecDeque;

pub(crate) struct Scheduler {
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    pool: PagePool,
    cache: Box<dyn PrefixCache>,
    disk: Option<DiskTier>,
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
    pub disk: Option<DiskTierStats>,
}

impl Scheduler {
    pub fn new(pool: PagePool, opts: &EngineOptions, disk: Option<DiskTier>) -> Self {
        let cache: Box<dyn PrefixCache> = if opts.disable_radix_cache { Box::new(NoPrefixCache) } else { Box::new(RadixCache::new(pool.page_size())) };
        Scheduler {
            waiting: VecDeque::new(),
            running: Vec::new(),
            pool,
            cache,
            disk,
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

    /// Queues a request for admission, prefetching its prompt's pages on disk past those in
    /// memory.
    pub fn enqueue(&mut self, seq: Sequence) {
        if let Some(disk) = &self.disk {
            let key = seq.prefill_key();
            let in_memory = self.cache.cached_prefix_pages(seq.kv.namespace, key);
            disk.prefetch(&page_hashes(seq.kv.namespace, key, self.pool.page_size())[in_memory..]);
        }
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

    /// The running requests, indexed as in this step's batch.
    pub fn running(&self) -> &[Sequence] {
        &self.running
    }

    pub fn running_mut(&mut self) -> &mut [Sequence] {
        &mut self.running
    }

    pub fn counts(&mut self) -> SchedulerCounts {
        SchedulerCounts {
            running: self.running.len(),
            waiting: self.waiting.len(),
            free_pages: self.pool.free_pages(),
            cached_pages: self.cache.cached_pages(),
            admitted_prompt_tokens: self.admitted_prompt_tokens,
            cache_hit_tokens: self.cache_hit_tokens,
            retractions: self.retractions,
            disk: self.disk.as_mut().map(DiskTier::stats),
        }
    }

    /// Prepares this step's batch: one token per decoding request (with the draft it verifies),
    /// then prompt chunks within the token budget. Pages read back from the disk tier go
    /// straight into `kv`.
    pub fn plan(&mut self, kv: &mut KvCache) -> Batch {
        self.grow_pages();
        self.admit(kv);
        let mut batch = Batch::default();
        let mut budget = self.token_budget;
        for (index, seq) in self.running.iter().enumerate() {
            if seq.is_decoding() {
                batch.push(BatchEntry::new(index, seq, seq.kv.computed, seq.tokens.len()));
                budget = budget.saturating_sub(1 + seq.draft_len());
            }
        }
        for (index, seq) in self.running.iter().enumerate() {
            let start = seq.kv.computed;
            if !seq.is_decoding() && budget > 0 {
                let end = seq.tokens.len().min(start + budget);
                budget -= end - start;
                batch.push(BatchEntry::new(index, seq, start, end));
            }
        }
        batch
    }

    /// Evicts cached prefixes until `n` pages are free (or nothing evictable is left).
    fn make_room(&mut self, n: usize) -> bool {
        let short = n.saturating_sub(self.pool.free_pages());
        if short > 0 {
            let mut freed = self.cache.evict(short);
            self.pool.release(&mut freed);
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
            let need = self.pool.pages_for(self.running[i].tokens.len()).saturating_sub(self.running[i].kv.pages.len());
            if need == 0 {
                i += 1;
                continue;
            }
            if let Some(pages) = self.take_pages(need) {
                self.running[i].kv.pages.extend(pages);
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
        seq.discard_draft();
        self.release(&mut seq);
        self.retractions += 1;
        self.waiting.push_front(seq);
    }

    fn admit(&mut self, kv: &mut KvCache) {
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
            let cached = self.cache.match_prefix(seq.kv.namespace, seq.prefill_key());
            let chain = self.disk_chain(seq, cached.pages.len());
            let matched = cached.pages.len().max(chain.len()) * self.pool.page_size();
            if self.cache.keeps_prefixes() && self.shares_uncached_prefix(seq, matched, first_admitted) {
                continue; // computed once by the other request, then found in the cache
            }
            self.cache.lock(cached.node); // before evicting for our own pages
            let need = self.pool.pages_for(seq.tokens.len()) - cached.pages.len();
            // Leave a page per running request for its next decode page, so admitting does
            // not force a retraction right away (an empty batch always admits: progress).
            let headroom = self.running.len();
            let own = if self.make_room(need + headroom) { self.pool.alloc(need) } else { None };
            let Some(own) = own else {
                self.cache.unlock(cached.node);
                break; // no room: later requests wait too rather than overtake
            };
            let mut seq = slots[i].take().expect("present");
            let read = self.read_from_disk(&seq, &chain, cached.pages.len(), &own, kv);
            let matched = (cached.pages.len() + read) * self.pool.page_size();
            if seq.kv.admit(cached.pages, own, cached.node, matched) {
                self.admitted_prompt_tokens += seq.prompt_len as u64;
                self.cache_hit_tokens += matched as u64;
                if let Some(disk) = &mut self.disk {
                    disk.count_hit_tokens(read * self.pool.page_size());
                }
            }
            budget = budget.saturating_sub(seq.tokens.len() - matched);
            self.running.push(seq);
        }
        self.waiting = slots.into_iter().flatten().collect();
    }

    /// The names of the prompt pages of `seq` up to the last of those after its first
    /// `in_memory` that the disk tier holds (empty without the tier).
    fn disk_chain(&self, seq: &Sequence, in_memory: usize) -> Vec<PageHash> {
        let Some(disk) = &self.disk else { return Vec::new() };
        let mut hashes = page_hashes(seq.kv.namespace, seq.prefill_key(), self.pool.page_size());
        let on_disk = disk.find(&hashes[in_memory..]);
        hashes.truncate(in_memory + on_disk);
        hashes
    }

    /// Reads the pages of `chain` from page `first` on from disk into the request's first
    /// `own` pages; returns how many were read (up to the first that failed its checks: the
    /// rest are recomputed).
    fn read_from_disk(&mut self, seq: &Sequence, chain: &[PageHash], first: usize, own: &[u32], kv: &mut KvCache) -> usize {
        let Some(disk) = &mut self.disk else { return 0 };
        let ps = self.pool.page_size();
        (first..chain.len())
            .zip(own)
            .take_while(|&(p, &page)| {
                let record = PageRecord::in_chain(seq.kv.namespace, chain, p, &seq.tokens[p * ps..(p + 1) * ps]);
                disk.read(&record, |bytes| kv.copy_page_in(page, bytes))
            })
            .count()
    }

    /// Writes the whole pages request `index` completed in a step that started at token `from`
    /// to the disk tier (pages already there only count as used).
    pub fn persist(&mut self, index: usize, from: usize, kv: &KvCache) {
        let (Some(disk), seq) = (&mut self.disk, &self.running[index]) else { return };
        let ps = self.pool.page_size();
        let full = seq.kv.computed / ps;
        if !seq.caches_prefix() || from / ps >= full {
            return;
        }
        let hashes = page_hashes(seq.kv.namespace, &seq.tokens[..full * ps], ps);
        for p in from / ps..full {
            let record = PageRecord::in_chain(seq.kv.namespace, &hashes, p, &seq.tokens[p * ps..(p + 1) * ps]);
            disk.store(record, |out| kv.copy_page_out(seq.kv.pages[p], out));
        }
    }

    /// Whether `seq` shares at least one more page of prefix with a request admitted in this
    /// step than the cache holds.
    fn shares_uncached_prefix(&self, seq: &Sequence, matched: usize, first_admitted: usize) -> bool {
        let page = self.pool.page_size();
        self.running[first_admitted..].iter().any(|other| {
            let common = other.tokens.iter().zip(seq.prefill_key()).take_while(|(a, b)| a == b).count();
            other.kv.namespace == seq.kv.namespace && common / page * page > matched
        })
    }

    /// Caches the whole pages a running request has computed so far (after a prefill chunk),
    /// so requests admitted later can share them.
    pub fn cache_progress(&mut self, index: usize) {
        let page = self.pool.page_size();
        let seq = &mut self.running[index];
        let full = seq.kv.computed / page;
        if full <= seq.kv.shared_pages {
            return;
        }
        let (shared, mut redundant) = self.cache.share(seq.kv.namespace, &seq.tokens[..full * page], &seq.kv.pages[..full]);
        self.cache.lock(shared.node);
        if let Some(old) = seq.kv.cache_node.replace(shared.node) {
            self.cache.unlock(old);
        }
        seq.kv.pages[..full].copy_from_slice(&shared.pages);
        seq.kv.shared_pages = full;
        self.pool.release(&mut redundant);
    }

    /// Removes a running request for good, caching its computed pages.
    pub fn retire(&mut self, index: usize) -> Sequence {
        let mut seq = self.running.swap_remove(index);
        self.release(&mut seq);
        seq
    }

    /// Hands a request's pages back: whole computed pages to the cache (of a request that
    /// caches its prefix), the rest to the pool.
    fn release(&mut self, seq: &mut Sequence) {
        let page = self.pool.page_size();
        let full = if seq.caches_prefix() { (seq.kv.computed / page).min(seq.kv.pages.len()) } else { 0 };
        let mut tail = seq.kv.pages.split_off(full);
        let mut unkept = self.cache.adopt(seq.kv.namespace, &seq.tokens[..full * page], &seq.kv.pages);
        self.pool.release(&mut unkept);
        self.pool.release(&mut tail);
        if let Some(node) = seq.kv.cache_node.take() {
            self.cache.unlock(node);
        }
        seq.kv.reset();
    }

    /// Empties the prefix cache; refused (false) while requests are queued or running.
    pub fn flush_cache(&mut self) -> bool {
        if !self.is_idle() {
            return false;
        }
        let mut pages = self.cache.flush().expect("no request holds a lock when idle");
        self.pool.release(&mut pages);
        if let Some(disk) = &mut self.disk {
            disk.clear();
        }
        true
    }
}
