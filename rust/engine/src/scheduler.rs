//! Continuous batching over the paged KV pool and the radix prefix cache.
//!
//! Each step: grow decoding requests by a page where they need one (evicting cached prefixes,
//! and only when that leaves the pool dry retracting the request that loses least,
//! [`retraction_victim`]), admit waiting requests in policy order while the step's token budget
//! has room for their prompts and the pool for them beside what the running requests' output
//! may still take ([`reserve`](crate::reserve)), sharing their cached prefix and deferring those
//! that share an uncached prefix with one admitted in this step (so that prefix is computed
//! once), then plan the step: one token per decoding request, then prompt chunks within the
//! token budget in admission order (a chunk splits no run of image tokens its model attends both
//! ways: it stops before one, or holds all of it, past the budget if it must).
//!
//! With the disk tier on, a request's prompt pages past what memory holds are read back from
//! disk at admission (the kernel prefetches them while it waits), and every page a request
//! completes is written there too ([`Scheduler::persist`]).
//!
//! Where the sliding layers keep only their window ([`WindowPool`]), a request gets window pages
//! for the tokens a step writes (a decoding request's with its global pages, a prompt chunk's
//! when the step is planned, shortened to what the pool gives), and after each step releases
//! those wholly behind the window of its next token ([`Scheduler::slide_window`]).

use crate::batch::{Batch, BatchEntry};
use crate::config::EngineOptions;
use crate::kv::disk::{page_hashes, DiskTier, DiskTierCounts, PageHash, PageRecord};
use crate::kv::window::{covered_pages, first_window_page, window_pages_per_request, NO_PAGE};
use crate::kv::{Freed, KvCache, NoPrefixCache, PagePool, PrefixCache, RadixCache, StateSlots};
use crate::policy::{admission_order, SchedulePolicy};
use crate::reserve::{reserved_pages, retraction_victim, NewTokenRatio};
use crate::sequence::{SeqKv, Sequence};
use std::collections::VecDeque;

/// The sliding layers' window pages, for a model whose sliding layers keep only their window.
pub(crate) struct WindowPool {
    pool: PagePool,
    /// Positions a sliding layer's query sees, its own included.
    window: usize,
    /// Window pages one request holds at most between steps: admission keeps this many for each.
    per_request: usize,
}

impl WindowPool {
    pub fn new(pool: PagePool, window: usize, max_draft_tokens: usize) -> Self {
        let per_request = window_pages_per_request(window, pool.page_size(), max_draft_tokens);
        WindowPool { pool, window, per_request }
    }

    /// The first window page a query at `pos` reads.
    fn first_page(&self, pos: usize) -> usize {
        first_window_page(pos, self.pool.page_size(), self.window)
    }

    /// Releases the window pages of `kv` wholly before its next token's window: its own into the
    /// pool; the cache's are unpinned (the cache keeps them, evictable).
    fn release_behind(&mut self, kv: &mut SeqKv, cache: &mut dyn PrefixCache) {
        let (start, end) = (kv.window_start, self.first_page(kv.computed).min(kv.window.len()));
        if end <= start {
            return;
        }
        let shared = kv.shared_pages.clamp(start, end);
        cache.unpin_window(&kv.window[start..shared]);
        let mut own: Vec<u32> = kv.window[shared..end].iter().copied().filter(|&p| p != NO_PAGE).collect();
        self.pool.release(&mut own);
        kv.window[start..end].fill(NO_PAGE);
        kv.window_start = end;
    }

    /// Takes up to `n` window pages, evicting the cache's unpinned ones while the pool is short.
    fn take(&mut self, n: usize, cache: &mut dyn PrefixCache) -> Vec<u32> {
        let short = n.saturating_sub(self.pool.free_pages());
        if short > 0 {
            let mut freed = cache.evict_window(short);
            self.pool.release(&mut freed);
        }
        self.pool.alloc(n.min(self.pool.free_pages())).expect("no more than are free")
    }
}

/// Tokens between two places a request's recurrent state may be snapshot: whole pages that end
/// a chunk of the recurrences (64 tokens: [`rsgl_kernels::delta_rule::CHUNK`], the same as
/// [`rsgl_kernels::ssd::CHUNK`]), so taking the snapshot splits no chunk and a request resuming
/// from it computes what it would have without it.
fn snapshot_every(page_size: usize) -> usize {
    let chunk = rsgl_kernels::delta_rule::CHUNK;
    const _: () = assert!(rsgl_kernels::delta_rule::CHUNK == rsgl_kernels::ssd::CHUNK);
    let gcd = (1..=page_size.min(chunk)).rev().find(|&d| page_size.is_multiple_of(d) && chunk.is_multiple_of(d)).expect("1 divides both");
    page_size / gcd * chunk
}

pub(crate) struct Scheduler {
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    pool: PagePool,
    window: Option<WindowPool>,
    /// Recurrent-state slots, for a model with recurrent layers: a running request holds one.
    states: Option<StateSlots>,
    cache: Box<dyn PrefixCache>,
    disk: Option<DiskTier>,
    policy: SchedulePolicy,
    max_running: usize,
    /// The most LoRA adapters the running requests use at once.
    max_loras: usize,
    token_budget: usize,
    /// The share of the running requests' remaining output budgets admission keeps pages for.
    new_token_ratio: NewTokenRatio,
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
    pub window_free_pages: usize,
    /// Window pages the cache keeps that no request reads.
    pub window_cached_pages: usize,
    pub state_slots_free: usize,
    pub state_snapshots: usize,
    pub admitted_prompt_tokens: u64,
    pub cache_hit_tokens: u64,
    pub retractions: u64,
    pub disk: Option<DiskTierCounts>,
}

impl Scheduler {
    /// `state_slots`: how many recurrent states (requests' and snapshots) the model's recurrent
    /// layers keep (0: it has none).
    pub fn new(pool: PagePool, window: Option<WindowPool>, state_slots: usize, opts: &EngineOptions, disk: Option<DiskTier>) -> Self {
        let cache: Box<dyn PrefixCache> = match &window {
            _ if opts.disable_radix_cache => Box::new(NoPrefixCache),
            Some(window) => Box::new(RadixCache::windowed(pool.page_size(), window.window)),
            None => Box::new(RadixCache::new(pool.page_size())),
        };
        Scheduler {
            waiting: VecDeque::new(),
            running: Vec::new(),
            pool,
            window,
            states: (state_slots > 0).then(|| StateSlots::new(state_slots)),
            cache,
            disk,
            policy: opts.schedule_policy,
            max_running: opts.max_running_requests,
            max_loras: opts.max_loras_per_batch,
            token_budget: opts.chunked_prefill_size,
            new_token_ratio: NewTokenRatio::new(opts.schedule_conservativeness),
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
    pub fn enqueue(&mut self, mut seq: Sequence) {
        if let Some(disk) = &self.disk {
            let in_memory = self.cache.cached_prefix_pages(seq.kv.namespace, &seq.prefill_key());
            disk.prefetch(&seq.prefill_page_hashes(self.pool.page_size())[in_memory..]);
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
            window_free_pages: self.window.as_ref().map_or(0, |w| w.pool.free_pages()),
            window_cached_pages: self.cache.evictable_window_pages(),
            state_slots_free: self.states.as_ref().map_or(0, StateSlots::free),
            state_snapshots: self.states.as_ref().map_or(0, StateSlots::snapshots),
            admitted_prompt_tokens: self.admitted_prompt_tokens,
            cache_hit_tokens: self.cache_hit_tokens,
            retractions: self.retractions,
            disk: self.disk.as_mut().map(DiskTier::counts),
        }
    }

    /// Prepares this step's batch: one token per decoding request (with the draft it verifies),
    /// then prompt chunks within the token budget. Pages read back from the disk tier go
    /// straight into `kv`.
    pub fn plan(&mut self, kv: &mut KvCache) -> Batch {
        if !self.grow_pages() && self.running.iter().any(Sequence::is_decoding) {
            self.new_token_ratio.decay();
        }
        self.admit(kv);
        let mut batch = Batch::default();
        let mut budget = self.token_budget;
        for index in 0..self.running.len() {
            let seq = &self.running[index];
            let (start, end) = (seq.kv.computed, seq.tokens.len());
            // A request admitted in this step may be decoding already (retracted after its
            // prompt): it gets its window pages here, or waits a step.
            if seq.is_decoding() && self.grow_window(index, start, end) == end {
                let mut entry = BatchEntry::new(index, &self.running[index], start, end);
                self.plan_snapshot(&mut entry);
                batch.push(entry);
                budget = budget.saturating_sub(end - start); // the token and its draft
            }
        }
        for index in 0..self.running.len() {
            let seq = &self.running[index];
            let start = seq.kv.computed;
            if !seq.is_decoding() && budget > 0 {
                let end = seq.prompt_chunk_end(start, seq.tokens.len().min(start + budget));
                let end = self.grow_window(index, start, end);
                let end = self.running[index].prompt_chunk_end_within(start, end);
                if end > start {
                    budget = budget.saturating_sub(end - start);
                    let mut entry = BatchEntry::new(index, &self.running[index], start, end);
                    self.plan_snapshot(&mut entry);
                    batch.push(entry);
                }
            }
        }
        batch
    }

    /// Gives request `index` the window pages its tokens `start..end` are written to; returns
    /// how far it can go: `end`, or the start of the first page the window pool could not give.
    fn grow_window(&mut self, index: usize, start: usize, end: usize) -> usize {
        let Some(window) = &mut self.window else { return end };
        let ps = window.pool.page_size();
        let table = &mut self.running[index].kv.window;
        let missing: Vec<usize> = (start / ps..end.div_ceil(ps)).filter(|&p| table[p] == NO_PAGE).collect();
        let pages = window.take(missing.len(), self.cache.as_mut());
        for (&p, &page) in missing.iter().zip(&pages) {
            table[p] = page;
        }
        missing.get(pages.len()).map_or(end, |&short| end.min(short * ps))
    }

    /// Releases the window pages request `index` no longer reads, once a step advanced it.
    pub fn slide_window(&mut self, index: usize) {
        if let Some(window) = &mut self.window {
            window.release_behind(&mut self.running[index].kv, self.cache.as_mut());
        }
    }

    /// Hands pages the cache let go back to their pools.
    fn give_back(&mut self, mut freed: Freed) {
        self.pool.release(&mut freed.pages);
        match &mut self.window {
            Some(window) => window.pool.release(&mut freed.window),
            None => debug_assert!(freed.window.is_empty(), "window pages without a window pool"),
        }
    }

    /// Evicts cached prefixes until `n` pages are free (or nothing evictable is left).
    fn make_room(&mut self, n: usize) -> bool {
        let short = n.saturating_sub(self.pool.free_pages());
        if short > 0 {
            let freed = self.cache.evict(short);
            self.give_back(freed);
        }
        self.pool.free_pages() >= n
    }

    /// Takes `n` free pages, evicting cached prefixes if the pool is short.
    fn take_pages(&mut self, n: usize) -> Option<Vec<u32>> {
        self.make_room(n);
        self.pool.alloc(n)
    }

    /// Gives every running request the pages its next token needs (a decoding request its
    /// window pages too), retracting requests ([`retraction_victim`]) only while the pools and
    /// the evictable cache together cannot provide them. Returns whether it retracted any.
    fn grow_pages(&mut self) -> bool {
        let mut retracted = false;
        let mut i = 0;
        while i < self.running.len() {
            let seq = &self.running[i];
            let need = self.pool.pages_for(seq.tokens.len()).saturating_sub(seq.kv.pages.len());
            let (decoding, start, end) = (seq.is_decoding(), seq.kv.computed, seq.tokens.len());
            let grown = need == 0
                || self.take_pages(need).is_some_and(|pages| {
                    let kv = &mut self.running[i].kv;
                    kv.pages.extend(pages);
                    if self.window.is_some() {
                        kv.window.resize(kv.pages.len(), NO_PAGE);
                    }
                    true
                });
            // Submit checked that one request fits the whole pool, and admission that every
            // running request's window fits the window pool, so retracting others ends this loop.
            if grown && (!decoding || self.grow_window(i, start, end) == end) {
                i += 1;
            } else {
                let victim = retraction_victim(&self.running).expect("request i is running");
                self.retract(victim);
                retracted = true;
                // Request i is retried (or, retracted itself, replaced by the next one).
                i -= usize::from(victim < i);
            }
        }
        if retracted {
            self.new_token_ratio.after_retraction(&self.running);
        }
        retracted
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
        let ps = self.pool.page_size();
        // The step's tokens left once the running requests' own (decode tokens, drafts, the
        // rest of their prompts) are planned: admitting past that only parks prompts in pages.
        let pending: usize = self.running.iter().map(|s| s.tokens.len() - s.kv.computed).sum();
        let mut budget = self.token_budget.saturating_sub(pending);
        // Pages the running requests may still take for their output.
        let ratio = self.new_token_ratio;
        let mut reserved: usize = self.running.iter().map(|s| reserved_pages(s, ratio, ps)).sum();
        let first_admitted = self.running.len();
        for i in order {
            if self.running.len() >= self.max_running || budget == 0 {
                break;
            }
            if self.window.as_ref().is_some_and(|w| w.pool.num_pages() < w.per_request * (self.running.len() + 1)) {
                break; // every running request may hold a window's pages at once
            }
            if !self.lora_fits(slots[i].as_ref().expect("each index once").lora) {
                continue; // waits for a running adapter's requests to end; others may go first
            }
            // Taken first: taking it may evict a snapshot, which the match must then not find.
            let state_slot = match &mut self.states {
                Some(states) => match states.take() {
                    Some(slot) => Some(slot),
                    None => break,
                },
                None => None,
            };
            let seq = slots[i].as_mut().expect("each index once");
            let mut cached = self.cache.match_prefix(seq.kv.namespace, &seq.prefill_key());
            // The recurrent layers resume only where a snapshot of their state is kept.
            let snapshot = self.states.as_mut().and_then(|states| {
                let found = states.longest_snapshot(&seq.prefill_page_hashes(ps)[..cached.pages.len()]);
                cached.pages.truncate(found.map_or(0, |(pages, _)| pages));
                found.map(|(_, slot)| slot)
            });
            let chain = self.disk_chain(seq, cached.pages.len());
            let matched = cached.pages.len().max(chain.len()) * ps;
            if self.cache.keeps_prefixes() && self.shares_uncached_prefix(seq, matched, first_admitted) {
                self.give_back_state(state_slot);
                continue; // computed once by the other request, then found in the cache
            }
            self.cache.lock(cached.node); // before evicting for our own pages
                                          // The cached window pages the request reads after the cached prefix, pinned before
                                          // evicting for our own pages: after a longer prefix (read from disk) it reads no
                                          // earlier ones.
            let window_read = self.window.as_ref().map_or(0, |w| w.first_page(cached.pages.len() * ps));
            self.cache.pin_window(cached.window.get(window_read..).unwrap_or_default());
            let need = self.pool.pages_for(seq.tokens.len()) - cached.pages.len();
            // Room for its prompt and its own reserved output beside what the running requests
            // may still take, so admitting does not force a retraction a few steps later (an
            // empty batch always admits: progress).
            let output = reserved_pages(seq, ratio, ps).saturating_sub(self.pool.pages_for(seq.tokens.len()));
            let available = self.pool.free_pages() + self.cache.evictable_pages();
            let fits = self.running.is_empty() || available >= need + output + reserved;
            let own = if fits && self.make_room(need) { self.pool.alloc(need) } else { None };
            // The window pages of the pages read from disk that the request's window reads.
            let on_disk = chain.len().max(cached.pages.len());
            let disk_window = self.window.as_ref().map_or(0..0, |w| w.first_page(on_disk * ps).max(cached.pages.len())..on_disk);
            let own_window = match (&mut self.window, &own) {
                (Some(window), Some(_)) => window.take(disk_window.len(), self.cache.as_mut()),
                _ => Vec::new(),
            };
            let (own, own_window) = match own {
                Some(own) if own_window.len() == disk_window.len() => (own, own_window),
                own => {
                    self.give_back(Freed { pages: own.unwrap_or_default(), window: own_window });
                    self.cache.unpin_window(cached.window.get(window_read..).unwrap_or_default());
                    self.cache.unlock(cached.node);
                    self.give_back_state(state_slot);
                    break; // no room: later requests wait too rather than overtake
                }
            };
            let mut seq = slots[i].take().expect("present");
            let mut window_table = Vec::new();
            if self.window.is_some() {
                window_table = vec![NO_PAGE; cached.pages.len() + own.len()];
                window_table[window_read..cached.pages.len()].copy_from_slice(&cached.window[window_read..]);
                window_table[disk_window].copy_from_slice(&own_window);
            }
            let read = self.read_from_disk(&seq, &chain, cached.pages.len(), &own, &window_table, kv);
            let mut reached = cached.pages.len() + read;
            if let Some(window) = &self.window {
                // A read that failed may leave a gap a shorter prefix's window reads.
                reached = covered_pages(&window_table[..reached], ps, window.window);
            }
            let cached_pages = cached.pages.len();
            let matched = reached * ps;
            let first = seq.kv.admit(cached.pages, own, cached.node, matched);
            if let Some(window) = &mut self.window {
                (seq.kv.window, seq.kv.window_start) = (window_table, window_read);
                window.release_behind(&mut seq.kv, self.cache.as_mut());
            }
            if first {
                seq.queued = Some(seq.arrived.elapsed());
                self.admitted_prompt_tokens += seq.prompt_len as u64;
                self.cache_hit_tokens += matched as u64;
                if let Some(disk) = &mut self.disk {
                    disk.count_hit_tokens((reached - cached_pages) * ps);
                }
            }
            budget = budget.saturating_sub(seq.tokens.len() - matched);
            if let (Some(snapshot), Some(slot)) = (snapshot.filter(|_| matched > 0), state_slot) {
                kv.parts_mut().iter_mut().for_each(|part| part.states.copy_slot(snapshot, slot));
            }
            seq.kv.state_slot = state_slot;
            reserved += reserved_pages(&seq, ratio, ps);
            self.running.push(seq);
        }
        self.waiting = slots.into_iter().flatten().collect();
    }

    /// Whether a request using `lora` can run beside the running ones: they use at most
    /// `max_loras` adapters together.
    fn lora_fits(&self, lora: Option<usize>) -> bool {
        let Some(lora) = lora else { return true };
        let mut running: Vec<usize> = self.running.iter().filter_map(|s| s.lora).collect();
        running.sort_unstable();
        running.dedup();
        running.contains(&lora) || running.len() < self.max_loras
    }

    /// The names of the prompt pages of `seq` up to the last of those after its first
    /// `in_memory` that the disk tier holds (empty without the tier).
    fn disk_chain(&self, seq: &mut Sequence, in_memory: usize) -> Vec<PageHash> {
        let Some(disk) = &self.disk else { return Vec::new() };
        let hashes = seq.prefill_page_hashes(self.pool.page_size());
        hashes[..in_memory + disk.find(&hashes[in_memory..])].to_vec()
    }

    /// Reads the pages of `chain` from page `first` on from disk into the request's first
    /// `own` pages (and the window pages `window` gives them, where it gives one); returns how
    /// many were read (up to the first that failed its checks: the rest are recomputed).
    fn read_from_disk(&mut self, seq: &Sequence, chain: &[PageHash], first: usize, own: &[u32], window: &[u32], kv: &mut KvCache) -> usize {
        let Some(disk) = &mut self.disk else { return 0 };
        let ps = self.pool.page_size();
        let key = seq.cache_key(chain.len() * ps);
        (first..chain.len())
            .zip(own)
            .take_while(|&(p, &page)| {
                let record = PageRecord::in_chain(seq.kv.namespace, chain, p, &key[p * ps..(p + 1) * ps]);
                disk.read(&record, |bytes| kv.copy_page_in(page, window.get(p).copied().unwrap_or(NO_PAGE), bytes))
            })
            .count()
    }

    /// Writes the whole pages request `index` completed in a step that started at token `from`
    /// to the disk tier (pages already there only count as used).
    pub fn persist(&mut self, index: usize, from: usize, kv: &KvCache) {
        let (Some(disk), seq) = (&mut self.disk, &mut self.running[index]) else { return };
        let ps = self.pool.page_size();
        let full = seq.kv.computed / ps;
        if !seq.caches_prefix() || from / ps >= full {
            return;
        }
        let (key, seq_kv) = seq.cache_key_and_kv(full * ps);
        let hashes = seq_kv.page_hashes.of(seq_kv.namespace, &key, ps);
        for p in from / ps..full {
            let record = PageRecord::in_chain(seq_kv.namespace, hashes, p, &key[p * ps..(p + 1) * ps]);
            // Written before the step's window pages slide: every page completed has its own.
            disk.store(record, |out| kv.copy_page_out(seq_kv.pages[p], seq_kv.window.get(p).copied().unwrap_or(NO_PAGE), out));
        }
    }

    /// Whether `seq` shares at least one more page of prefix with a request admitted in this
    /// step than the cache holds.
    fn shares_uncached_prefix(&self, seq: &Sequence, matched: usize, first_admitted: usize) -> bool {
        let page = self.pool.page_size();
        self.running[first_admitted..].iter().any(|other| {
            let common = other.cache_key(other.tokens.len()).iter().zip(seq.prefill_key().iter()).take_while(|(a, b)| a == b).count();
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
        let (key, kv) = seq.cache_key_and_kv(full * page);
        let (shared, redundant) = self.cache.share(kv.namespace, &key, &kv.pages[..full], kv.window.get(..full).unwrap_or_default());
        self.cache.lock(shared.node);
        if let Some(old) = kv.cache_node.replace(shared.node) {
            self.cache.unlock(old);
        }
        let now_shared = shared.pages.len(); // `full`, or none when the cache keeps nothing
        kv.pages[..now_shared].copy_from_slice(&shared.pages);
        if now_shared > kv.shared_pages && !kv.window.is_empty() {
            // The request reads the cache's copies of its window pages from now on.
            let reads = kv.shared_pages.max(kv.window_start)..now_shared;
            kv.window[reads.clone()].copy_from_slice(&shared.window[reads.clone()]);
            self.cache.pin_window(&kv.window[reads]);
        }
        kv.shared_pages = now_shared;
        self.give_back(redundant);
    }

    /// Removes a running request for good, caching its computed pages. The others keep their
    /// order (admission order: prompts are chunked in it), their indices past `index` shifted.
    pub fn retire(&mut self, index: usize) -> Sequence {
        let mut seq = self.running.remove(index);
        self.release(&mut seq);
        seq
    }

    /// Hands a request's pages back: whole computed pages to the cache (of a request that
    /// caches its prefix), the rest to the pools.
    fn release(&mut self, seq: &mut Sequence) {
        let page = self.pool.page_size();
        let full = if seq.caches_prefix() { (seq.kv.computed / page).min(seq.kv.pages.len()) } else { 0 };
        let (key, kv) = seq.cache_key_and_kv(full * page);
        if !kv.window.is_empty() {
            self.cache.unpin_window(&kv.window[kv.window_start.min(kv.shared_pages)..kv.shared_pages]);
        }
        let tail = kv.pages.split_off(full);
        let window_tail = kv.window.split_off(full.min(kv.window.len()));
        let unkept = self.cache.adopt(kv.namespace, &key, &kv.pages, &kv.window);
        self.give_back(unkept);
        self.give_back(Freed { pages: tail, window: window_tail.into_iter().filter(|&p| p != NO_PAGE).collect() });
        if let Some(node) = kv.cache_node.take() {
            self.cache.unlock(node);
        }
        if let (Some(states), Some(slot)) = (&mut self.states, kv.state_slot.take()) {
            states.give_back(slot);
        }
        kv.reset();
    }

    fn give_back_state(&mut self, slot: Option<u32>) {
        if let (Some(states), Some(slot)) = (&mut self.states, slot) {
            states.give_back(slot);
        }
    }

    /// For a model with recurrent layers, where `entry` should leave a snapshot of its
    /// request's state for the prefix cache: after the last multiple of [`snapshot_every`]
    /// tokens it computes, unless one is kept for that prefix already or no slot can be had.
    fn plan_snapshot(&mut self, entry: &mut BatchEntry) {
        let (Some(states), seq) = (&mut self.states, &self.running[entry.index]) else { return };
        let ps = self.pool.page_size();
        let every = snapshot_every(ps);
        let at = entry.end / every * every;
        if at <= entry.start || !seq.caches_prefix() || !self.cache.keeps_prefixes() {
            return;
        }
        let hashes = page_hashes(seq.kv.namespace, &seq.cache_key(at), ps);
        if states.longest_snapshot(&hashes[hashes.len() - 1..]).is_none() {
            entry.snapshot = states.take().map(|slot| (at - entry.start, slot));
        }
    }

    /// Keeps the snapshot `entry` left (after the step ran it) for the prefix it ends.
    pub fn keep_snapshot(&mut self, entry: &BatchEntry) {
        let (Some(states), Some((n, slot))) = (&mut self.states, entry.snapshot) else { return };
        let seq = &self.running[entry.index];
        let ps = self.pool.page_size();
        let prefix = *page_hashes(seq.kv.namespace, &seq.cache_key(entry.start + n), ps).last().expect("a snapshot follows whole pages");
        states.keep_snapshot(prefix, slot);
    }

    /// Empties the prefix cache; refused (false) while requests are queued or running.
    pub fn flush_cache(&mut self) -> bool {
        if !self.is_idle() {
            return false;
        }
        let freed = self.cache.flush().expect("no request holds a lock when idle");
        self.give_back(freed);
        if let Some(states) = &mut self.states {
            states.flush();
        }
        if let Some(disk) = &mut self.disk {
            disk.clear();
        }
        true
    }
}

#[cfg(test)]
#[path = "scheduler_tests.rs"]
pub(crate) mod tests;
