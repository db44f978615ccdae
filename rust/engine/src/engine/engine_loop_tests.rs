//! The step's phases, one by one, on a model-free forward pass: a fake whose every row favours
//! the token after the one it comes after, so greedy requests count up (1, 2, 3 -> 4, 5, ...).

use super::*;
use crate::config::{EngineOptions, KvCacheDtype};
use crate::kv::{PagePool, Pools};
use crate::model::{LoraPacker, PeftAdapter, PeftConfig};
use crate::scheduler::tests::tiny_config;
use crate::speculative::SpeculativeAlgorithm;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::mpsc::{channel, Receiver};

const PAGE: usize = 4;
const VOCAB: usize = 16;
/// The tiny config's hidden size.
const HIDDEN: usize = 8;
/// The logit of the token a fake row favours (every other one is 0).
const FAVOURED: f32 = 5.0;

/// A chunk the fake ran: its tokens, first position and rows.
type Ran = (Vec<u32>, usize, Range<usize>);

/// A forward pass without a model: each row it is asked for is [`row_after`] the token it
/// comes after, `width` wide; it records the chunks it ran.
struct FakeModel {
    cfg: ModelConfig,
    pool: ThreadPool,
    width: usize,
    ran: RefCell<Vec<Ran>>,
    /// Per chunk run, the image rows it was given: (index in the chunk, the row's first value).
    image_rows: RefCell<Vec<Vec<(usize, f32)>>>,
    /// Images encoded.
    encoded: RefCell<usize>,
    /// The LoRA adapters added, by id (their names).
    adapters: BTreeMap<usize, String>,
    adapters_added: usize,
    /// Per chunk run, its LoRA adapter's id.
    adapter_ids: RefCell<Vec<Option<usize>>>,
}

/// The fake's row after `token`: [`FAVOURED`] at `token + 1` (mod `width`), 0 elsewhere.
fn row_after(token: u32, width: usize) -> Vec<f32> {
    (0..width).map(|j| if j == (token as usize + 1) % width { FAVOURED } else { 0.0 }).collect()
}

impl ForwardPass for FakeModel {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn output_width(&self) -> usize {
        self.width
    }

    fn pool(&self) -> &ThreadPool {
        &self.pool
    }

    fn forward(&self, seqs: &[SeqChunk], _kv: &mut KvCache) -> Vec<f32> {
        self.ran.borrow_mut().extend(seqs.iter().map(|c| (c.tokens.to_vec(), c.start_pos, c.rows.clone())));
        self.image_rows.borrow_mut().extend(seqs.iter().map(|c| c.image_rows.iter().map(|&(at, row)| (at, row[0])).collect()));
        self.adapter_ids.borrow_mut().extend(seqs.iter().map(|c| c.lora));
        seqs.iter().flat_map(|c| c.rows.clone().map(|r| c.tokens[r])).flat_map(|token| row_after(token, self.width)).collect()
    }

    /// Each tile's row (one token per tile in [`with_vision`]) holds its first pixel value.
    fn encode_image(&self, pixels: &[f32], _grid_thw: Option<[usize; 3]>) -> crate::error::Result<Vec<f32>> {
        *self.encoded.borrow_mut() += 1;
        Ok(pixels.chunks_exact(TILE_VALUES).flat_map(|tile| vec![tile[0]; HIDDEN]).collect())
    }

    /// Ids as the model gives them: counting up, never reused.
    fn add_adapter(&mut self, adapter: LoraAdapter) -> usize {
        let id = self.adapters_added;
        self.adapters_added += 1;
        self.adapters.insert(id, adapter.name);
        id
    }

    fn remove_adapter(&mut self, id: usize) {
        self.adapters.remove(&id).expect("a loaded adapter");
    }
}

/// An engine loop over the fake (rows `width` wide: `VOCAB` to generate, `HIDDEN` to embed) and
/// `pages` pages of 4 tokens, prefilling at most `budget` tokens a step.
fn engine_loop(pages: usize, budget: usize, width: usize, speculative: Option<SpeculativeAlgorithm>) -> EngineLoop<FakeModel> {
    let cfg = tiny_config(VOCAB);
    let opts = EngineOptions { page_size: PAGE, chunked_prefill_size: budget, ..EngineOptions::default() };
    let kv = KvCache::new(&cfg, Pools { pages, window_pages: None, state_slots: 0 }, PAGE, KvCacheDtype::Float32, &[2]);
    EngineLoop {
        model: FakeModel {
            cfg,
            pool: ThreadPool::new(1, false),
            width,
            ran: RefCell::new(Vec::new()),
            image_rows: RefCell::default(),
            encoded: RefCell::default(),
            adapters: BTreeMap::new(),
            adapters_added: 0,
            adapter_ids: RefCell::default(),
        },
        kv,
        scheduler: Scheduler::new(PagePool::new(pages, PAGE), None, 0, &opts, None),
        tokenizer: None,
        encoded: Default::default(),
        grammars: None,
        grammar_queue: Vec::new(),
        jump_forward: false,
        inbox: channel().0,
        eos_token_ids: Vec::new(),
        context_length: 256,
        stats: Arc::new(Mutex::new(EngineStats::default())),
        active: HashSet::new(),
        seeds: Rng::new(0),
        adapters: Adapters::default(),
        speculator: speculative.map(|algorithm| Speculator::new(algorithm, 4, 1024, false)),
        pooling: Pooling::Last,
    }
}

/// Submits greedy request `rid` (`extra`: more of its JSON fields); returns its outputs.
fn submit(w: &mut EngineLoop<FakeModel>, rid: &str, prompt: &[u32], max_new: usize, extra: &str) -> Receiver<Result<Output>> {
    let json = format!(r#"{{"rid": "{rid}", "input_ids": {prompt:?}, "sampling_params": {{"max_new_tokens": {max_new}, "temperature": 0.0}}{extra}}}"#);
    let (tx, rx) = channel();
    w.accept(GenerateRequest::from_json(&json).expect("a request"), OutputSink::new(tx, None));
    rx
}

/// The output tokens a request's stream has received so far, and whether it finished.
fn received(rx: &Receiver<Result<Output>>) -> (Vec<u32>, bool) {
    let outputs: Vec<Output> = rx.try_iter().map(|o| o.expect("an output")).collect();
    (outputs.iter().flat_map(|o| o.token_ids.clone()).collect(), outputs.last().is_some_and(|o| o.finished.is_some()))
}

/// Pages free or held only by the prefix cache (evictable): all of them once nothing runs.
fn idle_pages(w: &mut EngineLoop<FakeModel>) -> usize {
    let counts = w.scheduler.counts();
    counts.free_pages + counts.cached_pages
}

#[test]
fn a_step_runs_every_phase_and_requests_end_with_their_pages_back() {
    let mut w = engine_loop(16, 64, VOCAB, None);
    let a = submit(&mut w, "a", &[1, 2, 3], 4, "");
    let b = submit(&mut w, "b", &[9, 10, 11, 12, 13], 2, "");
    w.step();
    assert_eq!(received(&a), (vec![4], false));
    assert_eq!(received(&b), (vec![14], false));
    w.step();
    assert_eq!(received(&b), (vec![15], true), "b ends after its 2 tokens");
    assert_eq!(w.scheduler.running().len(), 1);
    w.step();
    w.step();
    assert_eq!(received(&a), (vec![5, 6, 7], true));
    assert!(w.scheduler.is_idle() && w.active.is_empty());
    assert_eq!(idle_pages(&mut w), 16);
    let stats = w.stats.lock().expect("stats").clone();
    assert_eq!((stats.steps, stats.generated_tokens, stats.computed_prompt_tokens), (4, 6, 8));
}

#[test]
fn drafting_drafts_for_decoding_requests_only() {
    let mut w = engine_loop(16, 10, VOCAB, Some(SpeculativeAlgorithm::Ngram));
    // a repeats itself (n-gram lookup continues it); b is still prefilling after the first step.
    let _a = submit(&mut w, "a", &[1, 2, 3, 1, 2, 3, 1, 2], 8, "");
    let _b = submit(&mut w, "b", &[5, 6, 7, 8, 9, 10], 8, "");
    w.step();
    let before: Vec<usize> = w.scheduler.running().iter().map(|s| s.tokens.len()).collect();
    w.draft();
    let [a, b] = w.scheduler.running() else { panic!("both run") };
    assert!(a.draft_len() > 0, "a decodes: it drafts");
    assert_eq!(a.tokens[..before[0]], [1, 2, 3, 1, 2, 3, 1, 2, 3], "the draft rides after its tokens");
    assert_eq!(a.tokens[before[0]], 1, "continuing the n-gram");
    assert_eq!((b.draft_len(), b.tokens.len()), (0, before[1]), "b prefills: no draft");
}

#[test]
fn planning_gives_no_batch_until_a_request_can_run() {
    let mut w = engine_loop(16, 64, VOCAB, None);
    assert!(w.plan().is_none());
    submit(&mut w, "a", &[1, 2, 3], 4, "");
    let batch = w.plan().expect("a's prompt runs");
    let planned: Vec<(usize, usize, bool)> = batch.entries().iter().map(|e| (e.start, e.end, e.completes)).collect();
    assert_eq!(planned, [(0, 3, true)]);
}

#[test]
fn the_forward_pass_runs_the_batch_chunks_and_returns_their_rows() {
    let mut w = engine_loop(16, 6, VOCAB, None);
    submit(&mut w, "a", &[1, 2, 3], 4, "");
    submit(&mut w, "b", &[7, 8, 9, 10, 11], 4, "");
    let batch = w.plan().expect("a batch");
    let output = w.forward(&batch);
    // a's prompt asks for its last row; b's first chunk (the budget's 3 tokens left) none.
    assert_eq!(*w.model.ran.borrow(), [(vec![1, 2, 3], 0, 2..3), (vec![7, 8, 9], 0, 3..3)]);
    assert_eq!(output, row_after(3, VOCAB));
}

#[test]
fn bookkeeping_advances_each_entry_and_picks_who_samples() {
    let mut w = engine_loop(16, 10, VOCAB, None);
    submit(&mut w, "a", &[1, 2, 3], 4, "");
    submit(&mut w, "b", &[4, 5, 6, 7, 8, 9, 10, 11, 12, 13], 4, "");
    let batch = w.plan().expect("a batch");
    let output = w.forward(&batch);
    let mut step = StepCounts::default();
    let Bookkept { sampling, finished } = w.bookkeeping(&batch, &output, &mut step);
    assert!(finished.is_empty());
    // a completes its prompt and samples from its last row; b's first 7 tokens ask for none.
    assert_eq!(sampling.len(), 1);
    assert_eq!((sampling[0].index, sampling[0].rows.clone(), sampling[0].draft.clone()), (0, vec![&row_after(3, VOCAB)[..]], vec![]));
    let [a, b] = w.scheduler.running() else { panic!("both run") };
    assert_eq!((a.kv.computed, b.kv.computed), (3, 7));
    assert_eq!((step.tokens, step.prompt_tokens, step.keys), (10, 10, 10));
    // b's whole computed page is shared with the prefix cache at once.
    assert_eq!(b.kv.shared_pages, 1);
    assert_eq!(w.scheduler.counts().cached_pages, 1);
}

#[test]
fn bookkeeping_records_prompt_logprobs_from_every_row() {
    let mut w = engine_loop(16, 64, VOCAB, None);
    let rx = submit(&mut w, "a", &[1, 2, 7, 8], 1, r#", "logprob_start_len": 0"#);
    let batch = w.plan().expect("a batch");
    let output = w.forward(&batch);
    w.bookkeeping(&batch, &output, &mut StepCounts::default());
    let logprobs = w.scheduler.running_mut()[0].report.take_input_logprobs().expect("asked for");
    // Each prompt token after the first, scored by the row after the token before it.
    // The log of a fake row's softmax denominator: one logit FAVOURED, the others 0.
    let denominator = ((FAVOURED as f64).exp() + (VOCAB - 1) as f64).ln();
    let expected = [(2, FAVOURED as f64 - denominator), (7, -denominator), (8, FAVOURED as f64 - denominator)];
    assert_eq!(logprobs.len(), expected.len());
    for (got, (token, logprob)) in logprobs.iter().zip(expected) {
        assert_eq!(got.token_id, token);
        assert!((got.logprob as f64 - logprob).abs() < 1e-5, "{} against {logprob}", got.logprob);
    }
    drop(rx);
}

#[test]
fn bookkeeping_ends_an_embedding_with_its_pooled_row() {
    let mut w = engine_loop(16, 64, HIDDEN, None);
    let (tx, rx) = channel();
    w.accept_embedding(EmbedRequest { rid: "e".into(), input_ids: vec![1, 2, 3, 4, 5] }, OutputSink::new(tx, None));
    let batch = w.plan().expect("a batch");
    let output = w.forward(&batch);
    let Bookkept { sampling, finished } = w.bookkeeping(&batch, &output, &mut StepCounts::default());
    assert!(sampling.is_empty(), "embeddings sample nothing");
    let [(0, Some(out))] = &finished[..] else { panic!("the embedding ends") };
    // Last-token pooling: the row after token 5, L2-normalized (one nonzero: 1 at token 6).
    assert_eq!(out.embedding.as_deref(), Some(&row_after(5, HIDDEN).iter().map(|x| x / FAVOURED).collect::<Vec<_>>()[..]));
    assert!(out.finished.is_some());
    drop(rx);
}

#[test]
fn sampling_sends_each_token_and_returns_who_ends() {
    let mut w = engine_loop(16, 64, VOCAB, None);
    let going_on = submit(&mut w, "a", &[1, 2, 3], 4, "");
    let done = submit(&mut w, "b", &[5, 6], 1, "");
    let gone = submit(&mut w, "c", &[8, 9], 4, "");
    let zero = submit(&mut w, "d", &[11, 12], 0, "");
    drop(gone);
    let batch = w.plan().expect("a batch");
    let output = w.forward(&batch);
    let mut step = StepCounts::default();
    let Bookkept { sampling, .. } = w.bookkeeping(&batch, &output, &mut step);
    let finished = w.sample(sampling, &mut step);
    assert_eq!(received(&going_on), (vec![4], false), "a goes on: its token is sent now");
    let ends: Vec<(usize, Option<Vec<u32>>)> = finished.iter().map(|(i, out)| (*i, out.as_ref().map(|o| o.token_ids.clone()))).collect();
    // b's one token ends it; c's caller went away; d ends without sampling. Their outputs wait.
    assert_eq!(ends, [(1, Some(vec![7])), (2, None), (3, Some(vec![]))]);
    assert_eq!((received(&done), received(&zero)), ((vec![], false), (vec![], false)));
    assert_eq!(step.generated, 3);
    assert_eq!(w.scheduler.running()[0].tokens, [1, 2, 3, 4]);
}

#[test]
fn retiring_takes_out_the_finished_requests_and_frees_their_pages() {
    let mut w = engine_loop(16, 64, VOCAB, None);
    for (rid, prompt) in [("a", [1, 2, 3, 4, 5]), ("b", [6, 7, 8, 9, 10]), ("c", [11, 12, 13, 14, 15])] {
        submit(&mut w, rid, &prompt, 4, "");
    }
    let batch = w.plan().expect("a batch");
    let held: Vec<usize> = w.scheduler.running().iter().map(|s| s.kv.pages.len()).collect();
    let finals = w.retire(&batch, vec![(0, None), (2, None)]);
    let retired: Vec<&str> = finals.iter().map(|(seq, _)| seq.rid.as_str()).collect();
    assert_eq!(retired, ["c", "a"], "highest index first, so the indices stay right");
    assert_eq!(w.scheduler.running().iter().map(|s| s.rid.as_str()).collect::<Vec<_>>(), ["b"]);
    assert_eq!(idle_pages(&mut w), 16 - held[1]);
}

/// Pixel values of a tile of [`with_vision`]'s tower: 3 channels of 2 x 2.
const TILE_VALUES: usize = 12;
const IMAGE_TOKEN: u32 = 15;

/// The fake with an image encoder making one token per 2 x 2 tile ([`IMAGE_TOKEN`]).
fn with_vision(mut w: EngineLoop<FakeModel>) -> EngineLoop<FakeModel> {
    w.model.cfg.vision = Some(crate::config::ImageEncoder::Siglip(crate::config::VisionConfig::one_token_per_tile(IMAGE_TOKEN)));
    w
}

/// An image's JSON: `tiles` tiles whose pixels are all `value`.
fn image_json(hash: &str, tiles: usize, value: f32) -> String {
    let bytes: Vec<u8> = (0..tiles * TILE_VALUES).flat_map(|_| value.to_le_bytes()).collect();
    format!(r#"{{"hash": "{hash}", "pixel_values": {bytes:?}}}"#)
}

#[test]
fn images_are_encoded_once_and_their_rows_follow_the_chunks_that_compute_their_tokens() {
    // Chunks of 3 tokens cut image a's two tokens (positions 1, 2) from image b's (4).
    let mut w = with_vision(engine_loop(16, 3, VOCAB, None));
    let images = format!(r#", "images": [{}, {}]"#, image_json("a", 2, 0.5), image_json("b", 1, 0.25));
    let first = submit(&mut w, "first", &[1, IMAGE_TOKEN, IMAGE_TOKEN, 2, IMAGE_TOKEN, 3], 1, &images);
    w.step();
    w.step();
    assert_eq!(received(&first), (vec![4], true));
    assert_eq!(*w.model.image_rows.borrow(), [vec![(1, 0.5), (2, 0.5)], vec![(1, 0.25)]]);
    assert_eq!(*w.model.encoded.borrow(), 2);
    // The same picture in another request: its rows come from the encoder cache.
    let again = submit(&mut w, "again", &[7, IMAGE_TOKEN, IMAGE_TOKEN, 2], 1, &format!(r#", "images": [{}]"#, image_json("a", 2, 0.5)));
    w.step();
    w.step();
    assert_eq!(received(&again), (vec![3], true));
    assert_eq!(*w.model.encoded.borrow(), 2, "encoded before");
    assert_eq!(w.model.image_rows.borrow()[2], [(1, 0.5), (2, 0.5)]);
    assert_eq!(idle_pages(&mut w), 16);
}

#[test]
fn images_that_do_not_fit_their_tokens_fail_their_request() {
    let mut w = with_vision(engine_loop(16, 8, VOCAB, None));
    let short = submit(&mut w, "short", &[1, IMAGE_TOKEN, 2], 1, &format!(r#", "images": [{}]"#, image_json("a", 2, 0.5)));
    assert!(matches!(short.try_recv(), Ok(Err(crate::error::EngineError::InvalidRequest(m))) if m.contains("image tokens")));
    assert!(w.scheduler.is_idle() && w.active.is_empty());
}

/// A LoRA adapter `name` of rank 2 updating k_proj of the tiny config's layer.
fn adapter(name: &str) -> LoraAdapter {
    let config: PeftConfig = serde_json::from_value(serde_json::json!({"r": 2, "lora_alpha": 4, "target_modules": ["k_proj"]})).expect("a config");
    let mut weights = crate::weights::WeightStore::new();
    let k = "base_model.model.model.layers.0.self_attn.k_proj";
    weights.insert_random(&format!("{k}.lora_A.weight"), vec![2, HIDDEN], 0.1, 1);
    weights.insert_random(&format!("{k}.lora_B.weight"), vec![HIDDEN, 2], 0.1, 2);
    let peft = PeftAdapter { name: name.into(), config, weights };
    LoraPacker::new(tiny_config(VOCAB)).pack(peft, None, &ThreadPool::new(1, false)).expect("it fits")
}

/// The adapter `name` as a request naming it finds it when submitted (as `Engine::submit` does).
fn choose(w: &EngineLoop<FakeModel>, name: &str) -> LoraChoice {
    w.adapters.lock().expect("adapters").get(name).copied().expect("a loaded adapter")
}

/// Submits greedy request `rid` using the adapter `name`, found as it is now (`choice`).
fn submit_for(w: &mut EngineLoop<FakeModel>, rid: &str, prompt: &[u32], max_new: usize, name: &str, choice: LoraChoice) -> Receiver<Result<Output>> {
    let json = format!(
        r#"{{"rid": "{rid}", "input_ids": {prompt:?}, "sampling_params": {{"max_new_tokens": {max_new}, "temperature": 0.0}}, "lora_path": "{name}"}}"#
    );
    let mut req = GenerateRequest::from_json(&json).expect("a request");
    req.lora = Some(choice);
    let (tx, rx) = channel();
    w.accept(req, OutputSink::new(tx, None));
    rx
}

fn refusal(result: Result<()>) -> String {
    match result {
        Err(crate::error::EngineError::InvalidRequest(message)) => message,
        other => panic!("not refused as an invalid request: {other:?}"),
    }
}

#[test]
fn adapters_come_and_go_between_steps_while_requests_keep_theirs() {
    let mut w = engine_loop(16, 64, VOCAB, None);
    w.load_adapter(adapter("a")).expect("a loads");
    w.load_adapter(adapter("b")).expect("b loads");
    let b = choose(&w, "b");
    let rx = submit_for(&mut w, "on-b", &[1, 2, 3], 3, "b", b);
    // Waiting counts as in use, as running does.
    assert!(refusal(w.unload_adapter("b")).contains(r#"LoRA adapter "b" is in use by 1 request (running"#));
    w.step();
    // Another adapter goes, a third comes: b's request keeps its id, the newcomer gets a new one.
    w.unload_adapter("a").expect("a is unused");
    w.load_adapter(adapter("c")).expect("c loads");
    assert_eq!(choose(&w, "c").id, 2);
    w.step();
    assert!(refusal(w.unload_adapter("b")).contains("in use by 1 request"));
    w.step();
    assert_eq!(received(&rx), (vec![4, 5, 6], true));
    assert_eq!(*w.model.adapter_ids.borrow(), [Some(b.id); 3]);
    w.unload_adapter("b").expect("b's request ended");
    assert_eq!(w.model.adapters, BTreeMap::from([(2, "c".to_string())]));
    assert_eq!(w.adapters.lock().expect("adapters").keys().collect::<Vec<_>>(), ["c"]);
}

#[test]
fn unknown_names_and_names_taken_are_refused() {
    let mut w = engine_loop(16, 64, VOCAB, None);
    w.load_adapter(adapter("a")).expect("a loads");
    assert_eq!(refusal(w.load_adapter(adapter("a"))), r#"LoRA adapter "a" is already loaded; unload it first to load other weights under its name"#);
    assert_eq!(refusal(w.unload_adapter("z")), r#"LoRA adapter "z" is not loaded; the loaded ones are ["a"]"#);
    assert_eq!(w.model.adapters.len(), 1);
}

#[test]
fn a_request_naming_an_adapter_unloaded_since_is_refused() {
    let mut w = engine_loop(16, 64, VOCAB, None);
    w.load_adapter(adapter("a")).expect("a loads");
    let before = choose(&w, "a");
    w.unload_adapter("a").expect("unused");
    let gone = submit_for(&mut w, "late", &[1, 2], 1, "a", before);
    // Loaded again (other weights may hide under the name): the request's choice is still stale.
    w.load_adapter(adapter("a")).expect("a loads again");
    let stale = submit_for(&mut w, "stale", &[1, 2], 1, "a", before);
    for rx in [gone, stale] {
        assert!(matches!(rx.try_recv(), Ok(Err(crate::error::EngineError::InvalidRequest(m))) if m.contains("unloaded before the request started")));
    }
    assert!(w.scheduler.is_idle() && w.active.is_empty());
    let now = choose(&w, "a");
    let fresh = submit_for(&mut w, "fresh", &[1, 2], 1, "a", now);
    w.step();
    assert_eq!(received(&fresh), (vec![3], true));
}
