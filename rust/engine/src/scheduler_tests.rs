//! The scheduler's decisions, step by step, over a tiny KV pool: what it admits and in which
//! order, how it splits prompts into chunks beside the decodes, and whom it retracts, when.

use super::*;
use crate::config::{KvCacheDtype, ModelConfig};
use crate::kv::disk::DiskTierOptions;
use crate::kv::Pools;
use crate::request::{GenerateRequest, OutputSink};

const PAGE: usize = 4;

/// A one-layer llama of hidden size 8 (the scheduler needs its KV shapes, never its weights).
pub(crate) fn tiny_config(vocab_size: usize) -> ModelConfig {
    serde_json::from_value(serde_json::json!({
        "architecture": "llama", "vocab_size": vocab_size, "hidden_size": 8, "intermediate_size": 8,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 4,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": null, "attention_bias": false,
        "qk_norm": false, "tie_word_embeddings": false, "max_position_embeddings": 1024
    }))
    .expect("a tiny config")
}

/// A scheduler over `pages` pages of 4 tokens, prefilling at most `budget` tokens a step, and
/// the KV cache it plans into.
fn scheduler(pages: usize, budget: usize) -> (Scheduler, KvCache) {
    scheduler_with(pages, EngineOptions { chunked_prefill_size: budget, ..EngineOptions::default() })
}

/// [`scheduler`] with the options `opts` (its page size set to 4).
fn scheduler_with(pages: usize, opts: EngineOptions) -> (Scheduler, KvCache) {
    scheduler_on(pages, opts, None)
}

/// [`scheduler_with`], with the disk tier in `disk_dir` if given.
fn scheduler_on(pages: usize, opts: EngineOptions, disk_dir: Option<&std::path::Path>) -> (Scheduler, KvCache) {
    let opts = EngineOptions { page_size: PAGE, ..opts };
    let pools = Pools { pages, window_pages: None, state_slots: 0 };
    let kv = KvCache::new(&tiny_config(10), pools, PAGE, KvCacheDtype::Float32, &[2]);
    let disk = disk_dir.map(|dir| {
        let options = DiskTierOptions { dir: dir.to_path_buf(), capacity_bytes: 1 << 20, fingerprint: 1 };
        DiskTier::open(&options, PAGE, kv.page_bytes()).expect("the disk tier opens")
    });
    (Scheduler::new(PagePool::new(pages, PAGE), None, 0, &opts, disk), kv)
}

/// Request `rid`: a prompt of `prompt` tokens (distinct per request: no shared prefixes) and
/// `max_new` output tokens.
fn request(rid: &str, prompt: usize, max_new: usize) -> Sequence {
    let first = 100 * (rid.bytes().next().unwrap_or(0) as u32);
    let ids: Vec<u32> = (first..first + prompt as u32).collect();
    request_of(rid, &ids, max_new)
}

/// Request `rid` with the prompt `ids` and `max_new` output tokens.
fn request_of(rid: &str, ids: &[u32], max_new: usize) -> Sequence {
    let json = format!(r#"{{"rid": "{rid}", "input_ids": {ids:?}, "sampling_params": {{"max_new_tokens": {max_new}}}}}"#);
    let req = GenerateRequest::from_json(&json).expect("a request");
    Sequence::new(req, OutputSink::new(std::sync::mpsc::channel().0, None), &[], 1024, 0)
}

/// Plans and "runs" one step as the engine loop does (every completing entry samples a token; a
/// request with its whole output retires); returns the planned `(rid, start, end)` entries.
fn step(s: &mut Scheduler, kv: &mut KvCache) -> Vec<(String, usize, usize)> {
    let batch = s.plan(kv);
    let planned = batch.entries().iter().map(|e| (s.running()[e.index].rid.clone(), e.start, e.end)).collect();
    run(s, kv, &batch);
    planned
}

/// "Runs" a planned batch as [`step`] does (its K/V, all zeros, written to the disk tier).
fn run(s: &mut Scheduler, kv: &KvCache, batch: &Batch) {
    let mut done = Vec::new();
    for e in batch.entries() {
        let seq = &mut s.running_mut()[e.index];
        let extending = !seq.is_decoding();
        seq.kv.computed = e.end;
        if e.completes {
            seq.tokens.push(1);
            if seq.output_len() >= seq.max_new_tokens {
                done.push(e.index);
            }
        }
        if extending {
            s.cache_progress(e.index);
        }
        s.persist(e.index, e.start, kv);
    }
    done.sort_unstable_by_key(|&i| std::cmp::Reverse(i));
    done.into_iter().for_each(|i| drop(s.retire(i)));
}

fn entry(rid: &str, start: usize, end: usize) -> (String, usize, usize) {
    (rid.to_string(), start, end)
}

fn rids<'a>(seqs: impl Iterator<Item = &'a Sequence>) -> Vec<&'a str> {
    seqs.map(|s| s.rid.as_str()).collect()
}

#[test]
fn admits_in_arrival_order_only_what_the_step_can_prefill() {
    let (mut s, mut kv) = scheduler(64, 8);
    for rid in ["a", "b", "c"] {
        s.enqueue(request(rid, 6, 4));
    }
    // a's 6 tokens, then b's first 2: c would only hold pages this step.
    assert_eq!(step(&mut s, &mut kv), [entry("a", 0, 6), entry("b", 0, 2)]);
    assert_eq!(rids(s.running().iter()), ["a", "b"]);
    assert_eq!(rids(s.waiting.iter()), ["c"]);
    // a decodes, b's last 4 prompt tokens, and the 3 tokens left go to c's first chunk.
    assert_eq!(step(&mut s, &mut kv), [entry("a", 6, 7), entry("b", 2, 6), entry("c", 0, 3)]);
    assert_eq!(step(&mut s, &mut kv), [entry("a", 7, 8), entry("b", 6, 7), entry("c", 3, 6)]);
}

#[test]
fn decodes_then_chunks_in_admission_order_which_retiring_keeps() {
    let (mut s, mut kv) = scheduler(64, 12);
    s.enqueue(request("a", 4, 1)); // done after its prefill
    s.enqueue(request("b", 4, 8));
    s.enqueue(request("c", 20, 8));
    assert_eq!(step(&mut s, &mut kv), [entry("a", 0, 4), entry("b", 0, 4), entry("c", 0, 4)]);
    assert_eq!(rids(s.running().iter()), ["b", "c"]);
    s.enqueue(request("d", 20, 8));
    s.enqueue(request("e", 4, 8));
    // b's decode and c's prompt fill the step: d waits.
    assert_eq!(step(&mut s, &mut kv), [entry("b", 4, 5), entry("c", 4, 15)]);
    assert_eq!(step(&mut s, &mut kv), [entry("b", 5, 6), entry("c", 15, 20), entry("d", 0, 6)]);
    assert_eq!(step(&mut s, &mut kv), [entry("b", 6, 7), entry("c", 20, 21), entry("d", 6, 16)]);
    assert!(s.remove("b").is_some());
    assert_eq!(rids(s.running().iter()), ["c", "d"]);
    assert_eq!(step(&mut s, &mut kv), [entry("c", 21, 22), entry("d", 16, 20), entry("e", 0, 4)]);
    assert_eq!(rids(s.running().iter()), ["c", "d", "e"]);
}

#[test]
fn admission_keeps_room_for_the_running_requests_output() {
    // 10 pages; a holds 2 (its prompt, its first token) and may write 0.7 x 15 tokens more.
    let (mut s, mut kv) = scheduler(10, 64);
    s.enqueue(request("a", 4, 16));
    step(&mut s, &mut kv);
    // b needs 1 prompt page and 3 for its output, beside a's 2 more: 6 of the 8 free.
    s.enqueue(request("b", 4, 16));
    // c would need 4 more than the 2 left: it waits, however much the step could prefill.
    s.enqueue(request("c", 4, 16));
    step(&mut s, &mut kv);
    assert_eq!(rids(s.running().iter()), ["a", "b"]);
    assert_eq!(rids(s.waiting.iter()), ["c"]);
    // Everyone finishes without a retraction, c once a and b are done.
    for _ in 0..40 {
        step(&mut s, &mut kv);
    }
    assert!(s.is_idle());
    assert_eq!(s.retractions, 0);
}

#[test]
fn evicts_cached_prefixes_before_retracting_anyone() {
    let (mut s, mut kv) = scheduler(6, 64);
    // A finished request leaves 3 pages of prompt in the cache.
    s.enqueue(request("x", 13, 1));
    step(&mut s, &mut kv);
    assert!(s.is_idle());
    assert_eq!((s.pool.free_pages(), s.cache.evictable_pages()), (3, 3));
    // a's prompt and output take 5 pages: the cache gives its pages back, nobody is retracted.
    s.enqueue(request("a", 4, 16));
    for _ in 0..17 {
        step(&mut s, &mut kv);
    }
    assert!(s.is_idle());
    assert_eq!(s.retractions, 0);
    assert_eq!(s.cache.evictable_pages() + s.pool.free_pages(), 6);
}

#[test]
fn retracts_only_when_the_pool_is_dry_and_then_whom_it_costs_least() {
    let (mut s, mut kv) = scheduler(6, 64);
    // An estimate run down to its floor admits both; their output then outgrows the pool.
    (0..1000).for_each(|_| s.new_token_ratio.decay());
    s.enqueue(request("a", 4, 16));
    s.enqueue(request("b", 8, 16));
    step(&mut s, &mut kv);
    assert_eq!(rids(s.running().iter()), ["a", "b"]);
    let mut steps = 0;
    while s.retractions == 0 {
        // Until the retraction every page is in use or about to be: none is left idle.
        let held: usize = s.running().iter().map(|r| r.kv.pages.len()).sum();
        assert_eq!(held + s.pool.free_pages() + s.cache.evictable_pages(), 6);
        step(&mut s, &mut kv);
        steps += 1;
        assert!(steps < 20, "the pool should run dry");
    }
    // Both have written as much; b holds more pages: b goes back to the front of the queue,
    // its output kept, and the estimate rises again.
    assert_eq!(rids(s.running().iter()), ["a"]);
    assert_eq!(rids(s.waiting.iter()), ["b"]);
    assert!(s.waiting[0].output_len() > 0);
    assert!(s.new_token_ratio.value() > 0.5);
    assert_eq!(s.pool.free_pages() + s.cache.evictable_pages() + s.running()[0].kv.pages.len(), 6);
    // b resumes once a is done; both end with their whole output.
    for _ in 0..60 {
        step(&mut s, &mut kv);
    }
    assert!(s.is_idle());
    assert_eq!(s.retractions, 1);
}

#[test]
fn each_policy_admits_in_its_own_order() {
    // The cache holds p's 3 pages; c continues all of them, b the first 2, a none.
    let p: Vec<u32> = (1..=12).collect();
    let a: Vec<u32> = (50..58).collect();
    let b: Vec<u32> = p[..8].iter().copied().chain(60..64).collect();
    let c: Vec<u32> = p.iter().copied().chain([70]).collect();
    let order = |policy: SchedulePolicy| {
        let (mut s, mut kv) = scheduler_with(64, EngineOptions { schedule_policy: policy, max_running_requests: 1, ..EngineOptions::default() });
        s.enqueue(request_of("p", &p, 1));
        step(&mut s, &mut kv);
        for (rid, prompt) in [("c", &c), ("a", &a), ("b", &b)] {
            s.enqueue(request_of(rid, prompt, 1));
        }
        // One request a step, each done after its prefill.
        (0..3).map(|_| step(&mut s, &mut kv)[0].0.clone()).collect::<Vec<_>>()
    };
    assert_eq!(order(SchedulePolicy::Fcfs), ["c", "a", "b"]);
    assert_eq!(order(SchedulePolicy::Lpm), ["c", "b", "a"], "longest cached prefix first");
    // Depth first over the prefix tree: a sits at its root, b above c on p's path.
    assert_eq!(order(SchedulePolicy::DfsWeight), ["a", "b", "c"]);
}

#[test]
fn splits_a_long_prompt_into_budget_sized_chunks_and_samples_after_the_last() {
    let (mut s, mut kv) = scheduler(64, 8);
    s.enqueue(request("a", 20, 2));
    let mut planned = Vec::new();
    while !s.is_idle() {
        let batch = s.plan(&mut kv);
        let chunks = batch.chunks(s.running());
        planned.extend(batch.entries().iter().zip(&chunks).map(|(e, c)| (e.start, e.end, e.completes, c.rows.clone())));
        drop(chunks);
        run(&mut s, &kv, &batch);
    }
    // Only the chunk reaching the prompt's end asks for a logits row (its last token's).
    assert_eq!(planned, [(0, 8, false, 8..8), (8, 16, false, 8..8), (16, 20, true, 3..4), (20, 21, true, 0..1)]);
}

#[test]
fn retracts_the_request_with_the_least_output_even_holding_fewer_pages() {
    // 7 pages: a's prompt and output alone fill them.
    let (mut s, mut kv) = scheduler(7, 64);
    (0..1000).for_each(|_| s.new_token_ratio.decay());
    s.enqueue(request("a", 12, 16));
    for _ in 0..3 {
        step(&mut s, &mut kv);
    }
    s.enqueue(request("b", 2, 16));
    let mut steps = 0;
    while s.retractions == 0 {
        step(&mut s, &mut kv);
        steps += 1;
        assert!(steps < 20, "the pool should run dry");
    }
    let (a, b) = (&s.running()[0], &s.waiting[0]);
    assert_eq!((a.rid.as_str(), b.rid.as_str()), ("a", "b"));
    assert!(b.output_len() < a.output_len());
    assert!(b.tokens.len().div_ceil(PAGE) < a.kv.pages.len(), "b held fewer pages than a");
    for _ in 0..60 {
        step(&mut s, &mut kv);
    }
    assert!(s.is_idle());
}

/// Every page is in exactly one place: free, in the prefix cache, or a running request's own.
fn assert_pages_accounted(s: &Scheduler, pages: usize) {
    let own: usize = s.running().iter().map(|r| r.kv.pages.len() - r.kv.shared_pages).sum();
    assert_eq!(s.pool.free_pages() + s.cache.cached_pages() + own, pages);
}

#[test]
fn every_page_comes_back_after_requests_finish_retract_or_are_aborted() {
    let (mut s, mut kv) = scheduler(12, 8);
    (0..1000).for_each(|_| s.new_token_ratio.decay());
    let shared: Vec<u32> = (1..=8).collect();
    for (i, rid) in ["a", "b", "c", "d", "e"].iter().enumerate() {
        // Pairs share a two-page prefix, so the cache holds pages requests also read.
        let prompt: Vec<u32> = shared.iter().copied().chain(10 * i as u32..10 * i as u32 + 5).collect();
        s.enqueue(request_of(rid, if i % 2 == 0 { &prompt } else { &prompt[6..] }, 12));
    }
    s.enqueue(request("w", 6, 4));
    assert!(s.remove("w").is_some_and(|w| w.kv.pages.is_empty()), "aborted waiting: it held nothing");
    for n in 0..200 {
        step(&mut s, &mut kv);
        assert_pages_accounted(&s, 12);
        match n {
            // c mid-prompt, then a mid-output.
            1 => assert!(s.remove("c").is_some_and(|c| c.kv.pages.is_empty())),
            5 => assert!(s.remove("a").is_some_and(|a| a.output_len() > 0 && a.kv.pages.is_empty())),
            _ => {}
        }
        assert_pages_accounted(&s, 12);
        if s.is_idle() {
            break;
        }
    }
    assert!(s.is_idle());
    assert!(s.retractions > 0, "the pool ran dry on the way");
    // No request holds a lock or a page: the cache empties, and the pool is whole again.
    assert_eq!(s.cache.evictable_pages(), s.cache.cached_pages());
    assert!(s.flush_cache());
    assert_eq!((s.pool.free_pages(), s.cache.cached_pages()), (12, 0));
}

#[test]
fn a_new_scheduler_reads_back_the_prompt_pages_an_earlier_one_wrote_to_disk() {
    let dir = std::env::temp_dir().join(format!("rsgl-scheduler-disk-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (x, w): (Vec<u32>, Vec<u32>) = ((1..=14).collect(), (30..39).collect());
    let (mut s, mut kv) = scheduler_on(16, EngineOptions::default(), Some(&dir));
    s.enqueue(request_of("x", &x, 1));
    s.enqueue(request_of("w", &w, 1));
    step(&mut s, &mut kv);
    drop(s); // waits for the writer
             // A fresh scheduler (nothing in memory) finds x's 3 whole pages and w's 2 on disk: requests
             // continuing them compute only the rest.
    let (mut s, mut kv) = scheduler_on(16, EngineOptions { max_running_requests: 1, ..EngineOptions::default() }, Some(&dir));
    let y: Vec<u32> = x.iter().copied().chain([20, 21, 22, 23]).collect();
    s.enqueue(request_of("y", &y, 1));
    s.enqueue(request_of("z", &w, 1));
    assert_eq!(step(&mut s, &mut kv), [entry("y", 12, 18)]);
    assert_eq!(step(&mut s, &mut kv), [entry("z", 8, 9)]);
    let disk = s.counts().disk.expect("the tier is on");
    assert_eq!((disk.hit_tokens, disk.read_pages), (20, 5));
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_prompt_chunk_never_splits_a_run_attended_both_ways() {
    let (mut s, mut kv) = scheduler(64, 4);
    let mut seq = request("a", 14, 1);
    // Gemma 3's image tokens at 2..9 (longer than the budget) and 11..13.
    seq.bidirectional = vec![2..9, 11..13];
    s.enqueue(seq);
    // Up to the first run; the whole run, past the budget; up to the second run's end (a chunk
    // may end where a run does); the rest.
    assert_eq!(step(&mut s, &mut kv), [entry("a", 0, 2)]);
    assert_eq!(step(&mut s, &mut kv), [entry("a", 2, 9)]);
    assert_eq!(step(&mut s, &mut kv), [entry("a", 9, 13)]);
    assert_eq!(step(&mut s, &mut kv), [entry("a", 13, 14)]);
    // Held short (by the window pool): before the run it would cut, or nothing if it starts in it.
    let mut held = request("b", 14, 1);
    held.bidirectional = vec![2..9, 11..13];
    assert_eq!([held.prompt_chunk_end_within(0, 5), held.prompt_chunk_end_within(2, 5), held.prompt_chunk_end_within(3, 9)], [2, 2, 9]);
    // A chunk starting inside a run (after a prefix read from the cache) holds the rest of it.
    assert_eq!(held.prompt_chunk_end(4, 6), 9);
}

#[test]
fn running_requests_use_at_most_max_loras_per_batch_adapters() {
    let (mut s, mut kv) = scheduler_with(64, EngineOptions { max_loras_per_batch: 2, ..EngineOptions::default() });
    for (rid, lora) in [("a", Some(0)), ("b", Some(1)), ("c", Some(2)), ("d", None), ("e", Some(0))] {
        let mut seq = request(rid, 2, 2);
        seq.lora = lora;
        s.enqueue(seq);
    }
    // c's adapter would be a third: it waits, and requests after it (the base model, a running
    // adapter) go first.
    step(&mut s, &mut kv);
    assert_eq!(rids(s.running().iter()), ["a", "b", "d", "e"]);
    assert_eq!(rids(s.waiting.iter()), ["c"]);
    // Once b's adapter has no running request, c's takes its place.
    while s.running().iter().any(|seq| seq.rid == "b") {
        step(&mut s, &mut kv);
    }
    step(&mut s, &mut kv);
    assert!(s.running().iter().any(|seq| seq.rid == "c"));
}
