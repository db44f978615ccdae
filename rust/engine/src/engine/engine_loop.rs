//! The engine thread's loop: it takes commands, parks constrained requests until their
//! grammar compiles, runs scheduler steps and publishes statistics.

use super::encoder_cache::EncoderCache;
use super::stats::{EngineStats, StepCounts};
use super::{already_loaded, Adapters, Command};
use crate::batch::Batch;
use crate::config::ModelConfig;
use crate::error::{invalid, Result};
use crate::grammar::{Constraint, Grammar, GrammarService, GrammarSource};
use crate::kv::KvCache;
use crate::model::{DecoderModel, LoraAdapter, SeqChunk};
use crate::pooling::Pooling;
use crate::request::{EmbedRequest, GenerateRequest, LoraChoice, Output, OutputSink};
use crate::sample::Rng;
use crate::scheduler::Scheduler;
use crate::sequence::PromptImage;
use crate::sequence::{Sequence, Speculation};
use crate::speculative::Speculator;
use crate::text::Tokenizer;
use rsgl_kernels::profile::{self, Phase};
use rsgl_kernels::ThreadPool;
use std::collections::HashSet;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// What a step needs of the model (the model, or a fake in tests).
pub(super) trait ForwardPass {
    fn config(&self) -> &ModelConfig;
    /// The length of each row [`Self::forward`] returns.
    fn output_width(&self) -> usize;
    /// Compute threads idle between forward passes (the engine fills token masks on them).
    fn pool(&self) -> &ThreadPool;
    /// Runs the batch's chunks, writing their K/V into `kv`; returns the rows they ask for.
    fn forward(&self, seqs: &[SeqChunk], kv: &mut KvCache) -> Vec<f32>;
    /// An image's rows for its image tokens, from its preprocessed tiles (or patches, of grid
    /// `grid_thw`).
    fn encode_image(&self, pixels: &[f32], grid_thw: Option<[usize; 3]>) -> Result<Vec<f32>>;
    /// Adds a LoRA adapter; returns the id requests use it by.
    fn add_adapter(&mut self, adapter: LoraAdapter) -> usize;
    /// Drops the LoRA adapter `id`, which no request uses.
    fn remove_adapter(&mut self, id: usize);
}

impl ForwardPass for DecoderModel {
    fn config(&self) -> &ModelConfig {
        DecoderModel::config(self)
    }

    fn output_width(&self) -> usize {
        DecoderModel::output_width(self)
    }

    fn pool(&self) -> &ThreadPool {
        DecoderModel::pool(self)
    }

    fn forward(&self, seqs: &[SeqChunk], kv: &mut KvCache) -> Vec<f32> {
        DecoderModel::forward(self, seqs, kv)
    }

    fn encode_image(&self, pixels: &[f32], grid_thw: Option<[usize; 3]>) -> Result<Vec<f32>> {
        DecoderModel::encode_image(self, pixels, grid_thw)
    }

    fn add_adapter(&mut self, adapter: LoraAdapter) -> usize {
        DecoderModel::add_adapter(self, adapter)
    }

    fn remove_adapter(&mut self, id: usize) {
        DecoderModel::remove_adapter(self, id);
    }
}

pub(super) struct EngineLoop<M = DecoderModel> {
    pub(super) model: M,
    pub(super) kv: KvCache,
    pub(super) scheduler: Scheduler,
    pub(super) tokenizer: Option<Arc<Tokenizer>>,
    /// Image encoder outputs, by image hash.
    pub(super) encoded: EncoderCache,
    pub(super) grammars: Option<Arc<GrammarService>>,
    /// Constrained requests waiting for their grammar (their `pending_grammar`) to compile.
    pub(super) grammar_queue: Vec<Sequence>,
    pub(super) jump_forward: bool,
    /// For compile threads to hand grammars back.
    pub(super) inbox: Sender<Command>,
    pub(super) eos_token_ids: Vec<u32>,
    pub(super) context_length: usize,
    pub(super) stats: Arc<Mutex<EngineStats>>,
    pub(super) active: HashSet<String>,
    /// Draws each request's seed (requests that give none sample from it).
    pub(super) seeds: Rng,
    /// The loaded LoRA adapters by name (changed here only, between steps).
    pub(super) adapters: Adapters,
    /// With speculative decoding on: drafts for each decoding request, every step.
    pub(super) speculator: Option<Speculator>,
    /// How embedding requests pool the model's hidden states.
    pub(super) pooling: Pooling,
}

/// A request sampling this step: its logits rows (the sampled token's, then one after each
/// token of its draft) and its draft.
struct Sampling<'l> {
    index: usize,
    rows: Vec<&'l [f32]>,
    draft: Vec<u32>,
}

/// A running request (by index) ending this step, with its final output (none when its caller
/// went away).
type Ending = (usize, Option<Output>);

/// What the bookkeeping of a step's rows leaves to do: requests to sample, and the requests
/// (embeddings) it ended.
struct Bookkept<'l> {
    sampling: Vec<Sampling<'l>>,
    finished: Vec<Ending>,
}

impl<M: ForwardPass> EngineLoop<M> {
    pub(super) fn run(mut self, commands: Receiver<Command>) {
        loop {
            // Block while idle (no spinning); otherwise take whatever has arrived and step.
            let first = if self.scheduler.is_idle() { commands.recv().ok() } else { commands.try_recv().ok() };
            let mut shutdown = first.is_none() && self.scheduler.is_idle();
            for cmd in first.into_iter().chain(std::iter::from_fn(|| commands.try_recv().ok())) {
                match cmd {
                    Command::Submit(req, out) => self.accept(*req, out),
                    Command::Embed(req, out) => self.accept_embedding(*req, out),
                    Command::GrammarReady(source, grammar) => self.grammar_ready(&source, grammar),
                    Command::Abort(rid) => self.abort_group(&rid),
                    Command::FlushCache(reply) => {
                        let flushed = self.scheduler.flush_cache();
                        self.publish(None);
                        let _ = reply.send(flushed);
                    }
                    Command::LoadAdapter(adapter, reply) => drop(reply.send(self.load_adapter(*adapter))),
                    Command::UnloadAdapter(name, reply) => drop(reply.send(self.unload_adapter(&name))),
                    Command::Shutdown => shutdown = true,
                }
            }
            if shutdown {
                let rids: Vec<String> = self.active.iter().cloned().collect();
                rids.iter().for_each(|rid| self.abort(rid, "the engine shut down"));
                self.publish(None);
                return;
            }
            if self.scheduler.is_idle() {
                self.publish(None);
            } else {
                self.step();
            }
        }
    }

    fn accept(&mut self, req: GenerateRequest, out: OutputSink) {
        if let Some(gone) = self.unloaded_adapter(&req) {
            let _ = out.send(Err(gone));
            return;
        }
        if !self.claim_rid(&req.rid, &out) {
            return;
        }
        let mut seq = Sequence::new(req, out, &self.eos_token_ids, self.context_length, self.seeds.next_u64());
        if let Err(e) = seq.place_images(self.model.config().vision.as_ref()) {
            self.active.remove(&seq.rid);
            let _ = seq.out.send(Err(e));
            return;
        }
        seq.speculation = self.speculator.as_ref().map(|s| Speculation::new(s.drafter()));
        let Some(source) = seq.pending_grammar.as_ref().map(|g| g.source.clone()) else {
            self.scheduler.enqueue(seq);
            return;
        };
        let grammars = self.grammars.as_ref().expect("submit refuses constrained requests without a tokenizer");
        if let Some(grammar) = grammars.cached(&source) {
            return self.start_constrained(seq, grammar);
        }
        // Park the request; a compile thread sends the grammar back through the inbox. Requests
        // arriving with a grammar already being compiled (n > 1, a batch) wait for that one.
        if !self.grammar_queue.iter().any(|s| waits_for(s, &source)) {
            let (inbox, compiled) = (self.inbox.clone(), source.clone());
            grammars.compile_later(source, Box::new(move |grammar| drop(inbox.send(Command::GrammarReady(compiled, grammar)))));
        }
        self.grammar_queue.push(seq);
        self.publish(None);
    }

    /// The error for a request whose adapter was unloaded after the request named it (it was
    /// submitted while the unload was on its way here); None when its adapter is still loaded.
    fn unloaded_adapter(&self, req: &GenerateRequest) -> Option<crate::error::EngineError> {
        let (name, choice) = (req.lora_path.as_deref()?, req.lora?);
        let loaded = self.adapters.lock().expect("adapters lock").get(name) == Some(&choice);
        (!loaded).then(|| invalid(format!("lora_path {name:?}: the LoRA adapter was unloaded before the request started")))
    }

    /// Adds a LoRA adapter under its name, unless that name is taken.
    fn load_adapter(&mut self, adapter: LoraAdapter) -> Result<()> {
        let mut adapters = self.adapters.lock().expect("adapters lock");
        if adapters.contains_key(&adapter.name) {
            return Err(already_loaded(&adapter.name));
        }
        let (name, fingerprint) = (adapter.name.clone(), adapter.fingerprint);
        let id = self.model.add_adapter(adapter);
        adapters.insert(name, LoraChoice { id, fingerprint });
        Ok(())
    }

    /// Drops the LoRA adapter `name`, unless requests (running, waiting, or waiting for their
    /// grammar) use it.
    fn unload_adapter(&mut self, name: &str) -> Result<()> {
        let mut adapters = self.adapters.lock().expect("adapters lock");
        let Some(choice) = adapters.get(name).copied() else {
            return Err(invalid(format!("LoRA adapter {name:?} is not loaded; the loaded ones are {:?}", adapters.keys().collect::<Vec<_>>())));
        };
        let users = self.scheduler.requests().chain(&self.grammar_queue).filter(|s| s.lora == Some(choice.id)).count();
        if users > 0 {
            return Err(invalid(format!(
                "LoRA adapter {name:?} is in use by {users} request{} (running or waiting); unload it once they finish, or abort them",
                if users == 1 { "" } else { "s" }
            )));
        }
        adapters.remove(name);
        self.model.remove_adapter(choice.id);
        Ok(())
    }

    fn accept_embedding(&mut self, req: EmbedRequest, out: OutputSink) {
        if self.claim_rid(&req.rid, &out) {
            let hidden_size = self.model.config().hidden_size;
            self.scheduler.enqueue(Sequence::embedding(req, out, self.pooling, hidden_size));
        }
    }

    /// Marks `rid` running; false (and the request refused) when it already is.
    fn claim_rid(&mut self, rid: &str, out: &OutputSink) -> bool {
        let new = self.active.insert(rid.to_string());
        if !new {
            let _ = out.send(Err(invalid(format!("request id {rid:?} is already running; ids must be unique"))));
        }
        new
    }

    /// Starts every request parked waiting for `source` (none if they were all aborted meanwhile).
    fn grammar_ready(&mut self, source: &GrammarSource, grammar: Result<Box<dyn Grammar>>) {
        let (ready, waiting) = std::mem::take(&mut self.grammar_queue).into_iter().partition(|s| waits_for(s, source));
        self.grammar_queue = waiting;
        for seq in ready {
            let own = grammar.as_ref().map(|g| g.fork()).map_err(Clone::clone);
            self.start_constrained(seq, own);
        }
    }

    /// Queues a request with its compiled grammar, or ends it with the compile error.
    fn start_constrained(&mut self, mut seq: Sequence, grammar: Result<Box<dyn Grammar>>) {
        match grammar {
            Ok(grammar) => {
                // Forced tokens have no sampled log-probabilities: requests asking for them sample every token.
                let can_jump = self.grammars.as_ref().is_some_and(|g| g.can_jump_forward());
                let jump_forward = self.jump_forward && can_jump && !seq.report.return_logprob;
                let vocab = self.model.config().vocab_size;
                let mask_on_refusal = seq.picker.params.sampling_commutes_with_masks(vocab);
                let think_end = seq.pending_grammar.take().and_then(|g| g.think_end_token_ids);
                seq.constraint = Some(Constraint::new(grammar, vocab, think_end, jump_forward, mask_on_refusal));
                self.scheduler.enqueue(seq);
            }
            Err(e) => {
                self.active.remove(&seq.rid);
                let _ = seq.out.send(Err(e));
            }
        }
        self.publish(None);
    }

    /// Aborts `rid` and the samples grouped under it.
    fn abort_group(&mut self, rid: &str) {
        let in_group = |s: &Sequence| s.rid == rid || s.group.as_deref() == Some(rid);
        let parked = self.grammar_queue.iter();
        let rids: Vec<String> = self.scheduler.requests().chain(parked).filter(|s| in_group(s)).map(|s| s.rid.clone()).collect();
        for r in rids {
            self.abort(&r, "aborted by request");
        }
    }

    fn abort(&mut self, rid: &str, why: &str) {
        let mut seq = if let Some(seq) = self.scheduler.remove(rid) {
            seq
        } else if let Some(i) = self.grammar_queue.iter().position(|s| s.rid == rid) {
            self.grammar_queue.swap_remove(i)
        } else {
            return;
        };
        self.active.remove(rid);
        self.publish(None);
        let out = seq.abort_output(why);
        let _ = seq.out.send(Ok(out));
    }

    /// One step, phase by phase: draft, plan the batch, run it, book each entry's rows, sample,
    /// retire; then publish, and hand the finished requests their final outputs.
    fn step(&mut self) {
        let started = Instant::now();
        self.draft();
        let Some(batch) = self.plan() else { return };
        let _profiled = profile::step(batch.entries().iter().all(|entry| entry.end - entry.start == 1));
        let scheduled = Instant::now();
        let output = self.forward(&batch);
        let forwarded = Instant::now();
        let mut step = StepCounts::default();
        let Bookkept { sampling, mut finished } = self.bookkeeping(&batch, &output, &mut step);
        finished.extend(self.sample(sampling, &mut step));
        let finals = self.retire(&batch, finished);
        step.schedule = scheduled - started;
        step.forward = forwarded - scheduled;
        step.sample = forwarded.elapsed();
        if let (Some(cost), 0) = (self.speculator.as_mut().and_then(|s| s.step_cost.as_mut()), step.prompt_tokens) {
            cost.observe(step.tokens, step.keys, started.elapsed().as_secs_f64());
        }
        // Publish before the final outputs go out, so a caller that sees its request finish
        // also sees its pages back in the pool.
        self.publish(Some(&step));
        for (seq, out) in finals {
            self.active.remove(&seq.rid);
            if let Some(out) = out {
                let _ = seq.out.send(Ok(out));
            }
        }
    }

    /// With speculative decoding on: drafts tokens for every decoding request, cut to what the
    /// step's fitted cost says pays.
    fn draft(&mut self) {
        let Some(speculator) = &mut self.speculator else { return };
        let mut decoding: Vec<&mut Sequence> = self.scheduler.running_mut().iter_mut().filter(|s| s.is_decoding()).collect();
        decoding.iter_mut().for_each(|s| s.draft(speculator));
        // A lone request's pass is bound by reading the weights: its draft rows are cheap, and
        // the fit cannot tell the step's fixed cost from its one context's growth anyway.
        if let (Some(cost), true) = (&mut speculator.step_cost, decoding.len() > 1) {
            let odds: Vec<(usize, f32)> = decoding.iter().map(|s| s.draft_odds()).collect();
            let keys = decoding.iter().map(|s| s.kv.computed + 1).sum();
            for (seq, keep) in decoding.into_iter().zip(cost.budget(&odds, keys)) {
                seq.shorten_draft(keep);
            }
        }
    }

    /// This step's batch; none when no request can run now.
    fn plan(&mut self) -> Option<Batch> {
        Some(self.scheduler.plan(&mut self.kv)).filter(|batch| !batch.is_empty())
    }

    /// The model's output rows for `batch`, its new K/V written into the cache: first the images
    /// whose tokens the batch computes are encoded (or found encoded).
    fn forward(&mut self, batch: &Batch) -> Vec<f32> {
        self.encode_images(batch);
        self.model.forward(&batch.chunks(self.scheduler.running()), &mut self.kv)
    }

    fn encode_images(&mut self, batch: &Batch) {
        let (model, encoded) = (&self.model, &mut self.encoded);
        for entry in batch.entries() {
            let seq = &mut self.scheduler.running_mut()[entry.index];
            let computing = |image: &PromptImage| image.rows.is_none() && image.positions.iter().any(|p| (entry.start..entry.end).contains(p));
            for image in seq.images.iter_mut().filter(|image| computing(image)) {
                let rows = encoded.get(&image.input.hash).unwrap_or_else(|| {
                    let rows: Arc<[f32]> = model.encode_image(&image.pixels(), image.input.grid_thw).expect("images are checked when submitted").into();
                    encoded.insert(image.input.hash.clone(), rows.clone());
                    rows
                });
                image.rows = Some(rows);
                // The rows stay with the request (a retracted one computes its prompt again).
                image.input.pixel_values = Vec::new();
            }
        }
    }

    /// Books each entry's rows of `output`: the step's counts, the request's computed tokens
    /// (its draft taken back off), prompt log-probabilities, pooling, the prefix cache, the disk
    /// tier and state snapshots. Says which requests sample and which embeddings are done.
    fn bookkeeping<'l>(&mut self, batch: &Batch, output: &'l [f32], step: &mut StepCounts) -> Bookkept<'l> {
        let mut bookkept = Bookkept { sampling: Vec::new(), finished: Vec::new() };
        for (entry, rows) in batch.entries().iter().zip(batch.split_rows(output, self.model.output_width())) {
            let seq = &mut self.scheduler.running_mut()[entry.index];
            step.tokens += entry.end - entry.start;
            step.keys += entry.end;
            if entry.start < seq.prompt_len {
                step.prompt_tokens += entry.end - entry.start;
            } else {
                seq.decode_steps += 1;
            }
            let extending = !seq.is_decoding();
            let draft = seq.take_draft();
            seq.kv.computed = entry.end - draft.len();
            if seq.wants_chunk_logits(entry.start) {
                seq.record_input_logprobs(entry.start, &rows);
            }
            if let Some(pooler) = &mut seq.pooler {
                pooler.take(entry.start, entry.end, &rows);
                if entry.completes {
                    bookkept.finished.push((entry.index, Some(seq.finish_embedding())));
                }
            } else if entry.completes {
                let sampled_row = rows.len().checked_sub(draft.len() + 1).expect("a completing entry has its logits rows");
                bookkept.sampling.push(Sampling { index: entry.index, rows: rows[sampled_row..].to_vec(), draft });
            }
            if extending && seq.caches_prefix() {
                // Share the pages at once (not only when the request ends): requests waiting
                // on the same prefix are admitted next step and find it here.
                self.scheduler.cache_progress(entry.index);
            }
            self.scheduler.persist(entry.index, entry.start, &self.kv);
            self.scheduler.keep_snapshot(entry);
        }
        bookkept
    }

    /// Samples each request of `sampling` from its rows (checking its draft), and sends the
    /// outputs of those that go on; returns those ending (none as output when their caller
    /// went away).
    fn sample(&mut self, sampling: Vec<Sampling>, step: &mut StepCounts) -> Vec<Ending> {
        let _phase = profile::phase(Phase::Sampling);
        let masked = Instant::now();
        self.fill_masks_ahead(sampling.iter().map(|s| s.index));
        step.grammar = masked.elapsed();
        let mut finished = Vec::new();
        for Sampling { index, rows, draft } in sampling {
            let seq = &mut self.scheduler.running_mut()[index];
            let out = if seq.max_new_tokens == 0 {
                seq.finish_without_tokens(rows[0])
            } else {
                let advanced = seq.advance_through_draft(&rows, &draft, self.tokenizer.as_deref().map(Tokenizer::table));
                step.forced += advanced.forced;
                step.drafted += advanced.drafted;
                step.accepted += advanced.accepted;
                step.verified += usize::from(advanced.drafted > 0);
                advanced.output
            };
            step.generated += out.token_ids.len();
            if out.finished.is_some() {
                finished.push((index, Some(out)));
            } else if seq.out.send(Ok(out)).is_err() {
                // The caller went away (dropped its stream): end the request.
                finished.push((index, None));
            }
        }
        finished
    }

    /// Releases the window pages the step's requests fell behind, and takes the `finished`
    /// requests out of the scheduler (their pages back to the pool and the cache); returns
    /// them with their final outputs.
    fn retire(&mut self, batch: &Batch, mut finished: Vec<Ending>) -> Vec<(Sequence, Option<Output>)> {
        // Every request the step advanced (its draft checked) no longer reads what fell behind
        // its window.
        for entry in batch.entries() {
            self.scheduler.slide_window(entry.index);
        }
        // Highest index first: retiring shifts the requests after the one retired.
        finished.sort_unstable_by_key(|f| std::cmp::Reverse(f.0));
        let finals: Vec<_> = finished.into_iter().map(|(i, out)| (self.scheduler.retire(i), out)).collect();
        if let Some(speculator) = &mut self.speculator {
            finals.iter().for_each(|(seq, _)| speculator.finished(&seq.tokens[seq.prompt_len..]));
        }
        finals
    }

    /// Fills the token masks the requests sampling this step need before sampling, on the
    /// compute threads (idle between forward passes, pinned, and parked when done, so nothing
    /// spins into the next forward pass).
    fn fill_masks_ahead(&mut self, sampling: impl Iterator<Item = usize>) {
        let mut samples = vec![false; self.scheduler.running_mut().len()];
        sampling.for_each(|index| samples[index] = true);
        let mut pending: Vec<&mut Constraint> = (self.scheduler.running_mut().iter_mut().zip(samples))
            .filter(|(seq, samples)| *samples && seq.max_new_tokens > 0)
            .filter_map(|(seq, _)| seq.constraint.as_mut().filter(|c| c.needs_mask_first()))
            .collect();
        self.model.pool().for_chunks_mut(&mut pending, 1, &|_, one| one[0].fill_mask_ahead());
    }

    fn publish(&mut self, step: Option<&StepCounts>) {
        let mut s = self.stats.lock().expect("stats lock");
        let counts = self.scheduler.counts();
        s.running_requests = counts.running;
        s.waiting_requests = counts.waiting;
        s.kv_pages_free = counts.free_pages;
        s.cached_pages = counts.cached_pages;
        s.kv_window_pages_free = counts.window_free_pages;
        s.state_slots_free = counts.state_slots_free;
        s.state_snapshots = counts.state_snapshots;
        s.window_cached_pages = counts.window_cached_pages;
        s.prompt_tokens = counts.admitted_prompt_tokens;
        s.cache_hit_tokens = counts.cache_hit_tokens;
        s.cache_hit_rate = if s.prompt_tokens > 0 { s.cache_hit_tokens as f64 / s.prompt_tokens as f64 } else { 0.0 };
        s.retracted_requests = counts.retractions;
        // The disk tier's path and start-up notes were published at start and do not change.
        if let (Some(hicache), Some(disk)) = (&mut s.hicache, counts.disk) {
            hicache.counts = disk;
        }
        s.grammar_waiting_requests = self.grammar_queue.len();
        s.grammar = self.grammars.as_ref().map(|g| g.stats());
        if let Some(model) = self.speculator.as_ref().and_then(|speculator| speculator.step_cost.as_ref()?.model()) {
            (s.spec_step_fixed_seconds, s.spec_step_row_seconds, s.spec_step_key_seconds) = (model.fixed, model.per_row, model.per_key);
        }
        if let Some(step) = step {
            s.record_step(step);
        }
    }
}

/// Whether a parked request waits for the grammar `source`.
fn waits_for(seq: &Sequence, source: &GrammarSource) -> bool {
    seq.pending_grammar.as_ref().is_some_and(|g| g.source == *source)
}

#[cfg(test)]
#[path = "engine_loop_tests.rs"]
mod tests;
