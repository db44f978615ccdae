//! The engine thread and its handle. The thread owns the model, the KV cache and every request;
//! callers talk to it through channels, so no lock is held while the model runs.

use crate::config::{Dtype, EngineOptions, ModelConfig, Quantization};
use crate::error::{invalid, EngineError, Result};
use crate::grammar::{Constraint, Grammar, GrammarBackend, GrammarService, GrammarSpec, GrammarStats, LlgBackend};
use crate::kv::{BlockPool, KvCache};
use crate::model::{Compute, LlamaModel, Precision};
use crate::request::{validate, GenerateRequest, Output, OutputSink, Sequence, Waker};
use crate::sample::Rng;
use crate::scheduler::Scheduler;
use crate::text::TokenTable;
use crate::weights::WeightStore;
use rsgl_kernels::ThreadPool;
use serde::Serialize;
use std::collections::HashSet;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What the engine knows of the tokenizer: each token's bytes (for text), and the tokenizer
/// itself as `tokenizer.json` text, which structured output uses to tokenize forced text.
pub struct Tokenizer {
    pub table: TokenTable,
    pub json: Option<String>,
}

enum Command {
    Submit(Box<GenerateRequest>, OutputSink),
    /// A grammar compiled for the requests parked waiting for it.
    GrammarReady(GrammarSpec, Result<Box<dyn Grammar>>),
    Abort(String),
    /// Empty the prefix cache; answers whether it could (only when no request is in flight).
    FlushCache(Sender<bool>),
    Shutdown,
}

/// Counters the engine publishes after every step.
#[derive(Debug, Clone, Default, Serialize)]
pub struct EngineStats {
    pub kernels: &'static str,
    /// The int8 GEMM's path (what W8A8 layers run on).
    pub int8_kernels: &'static str,
    pub threads: usize,
    /// Weight precision.
    pub dtype: Dtype,
    /// Weight quantization of the linear layers, if any.
    pub quantization: Option<Quantization>,
    /// Bits of the quantized block layers' activations (8 or 16).
    pub activation_bits: u8,
    pub running_requests: usize,
    pub waiting_requests: usize,
    pub kv_pages_total: usize,
    pub kv_pages_free: usize,
    pub page_size: usize,
    pub max_total_tokens: usize,
    pub context_length: usize,
    pub radix_cache: bool,
    pub cached_pages: usize,
    /// Prompt tokens of admitted requests, and how many of them came from the cache.
    pub prompt_tokens: u64,
    pub cache_hit_tokens: u64,
    pub cache_hit_rate: f64,
    /// Prompt tokens actually run through the model (misses, and recomputation after retraction).
    pub computed_prompt_tokens: u64,
    pub generated_tokens: u64,
    pub retracted_requests: u64,
    /// Constrained requests waiting for their grammar to compile.
    pub grammar_waiting_requests: usize,
    /// Tokens appended without sampling because the grammar forced them (jump-forward).
    pub forced_tokens: u64,
    /// Grammar compilations, when the engine has a tokenizer.
    pub grammar: Option<GrammarStats>,
    pub steps: u64,
    pub last_step_tokens: usize,
    /// Seconds spent, over all steps, choosing the batch, in the forward pass, and sampling
    /// (with detokenizing and handing outputs over).
    pub schedule_seconds: f64,
    pub forward_seconds: f64,
    pub sample_seconds: f64,
    /// Of the sampling time, the part spent filling token masks before sampling, in parallel
    /// (requests with top-k/top-p/min-p; the others fill one only when the grammar refuses the
    /// token they sampled, counted in the rest of the sampling time).
    pub grammar_seconds: f64,
    pub last_step_seconds: f64,
}

pub struct Engine {
    inbox: Sender<Command>,
    thread: Mutex<Option<JoinHandle<()>>>,
    stats: Arc<Mutex<EngineStats>>,
    vocab_size: usize,
    context_length: usize,
    has_tokenizer: bool,
    max_total_tokens: usize,
    grammars: Option<Arc<GrammarService>>,
}

/// The outputs of one request, in order; ends after the output carrying `finished`.
pub struct RequestStream {
    pub rid: String,
    rx: Receiver<Result<Output>>,
    done: bool,
}

impl RequestStream {
    /// The next output; `Ok(None)` when `timeout` passed first. After the final output (or an
    /// error) every call returns `Err(Closed)`.
    pub fn next(&mut self, timeout: Duration) -> Result<Option<Output>> {
        if self.done {
            return Err(EngineError::Closed);
        }
        let received = match self.rx.recv_timeout(timeout) {
            Ok(out) => Some(out),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => Some(Err(EngineError::Closed)),
        };
        self.take(received)
    }

    /// The next output if there is one now (for callers woken by the request's [`Waker`]).
    pub fn try_next(&mut self) -> Result<Option<Output>> {
        if self.done {
            return Err(EngineError::Closed);
        }
        let received = match self.rx.try_recv() {
            Ok(out) => Some(out),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => Some(Err(EngineError::Closed)),
        };
        self.take(received)
    }

    fn take(&mut self, received: Option<Result<Output>>) -> Result<Option<Output>> {
        match received {
            Some(Ok(out)) => {
                self.done = out.finished.is_some();
                Ok(Some(out))
            }
            Some(Err(e)) => {
                self.done = true;
                Err(e)
            }
            None => Ok(None),
        }
    }

    pub fn is_done(&self) -> bool {
        self.done
    }
}

impl Engine {
    /// Builds the model from `weights` (moved, so they live in memory once) and starts the thread.
    pub fn start(cfg: ModelConfig, weights: WeightStore, tokenizer: Option<Tokenizer>, eos_token_ids: Vec<u32>, opts: EngineOptions) -> Result<Engine> {
        let context_length = opts.context_length(&cfg);
        if context_length == 0 {
            return Err(invalid("context_length must be at least 1"));
        }
        let threads = if opts.threads == 0 { rsgl_kernels::pool::physical_cores() } else { opts.threads };
        let compute = Compute::new(ThreadPool::new(threads, opts.pin_threads), opts.activation_bits());
        let vocab_size = cfg.vocab_size;
        let precision = Precision { dtype: opts.dtype.weight_dtype(), quantization: opts.quantization, quantize_lm_head: opts.quantize_lm_head };
        let model = LlamaModel::new(cfg, weights, context_length, precision, compute)?;
        let pin_engine_thread = opts.pin_threads.then(|| rsgl_kernels::pool::allowed_cpus().first().copied()).flatten();
        let num_pages = opts.kv_pages(model.config());
        let kv = KvCache::new(model.config(), num_pages, opts.page_size, opts.kv_cache_dtype);
        let stats = Arc::new(Mutex::new(EngineStats {
            kernels: rsgl_kernels::kernels().isa,
            int8_kernels: rsgl_kernels::kernels().gemm_i8.isa,
            threads,
            dtype: opts.dtype,
            quantization: opts.quantization,
            activation_bits: opts.activation_bits,
            kv_pages_total: num_pages,
            kv_pages_free: num_pages,
            radix_cache: !opts.disable_radix_cache,
            page_size: opts.page_size,
            max_total_tokens: num_pages * opts.page_size,
            context_length,
            ..Default::default()
        }));
        let (inbox, commands) = channel();
        let has_tokenizer = tokenizer.is_some();
        let table = tokenizer.as_ref().map(|t| Arc::new(t.table.clone()));
        let grammars = tokenizer.map(|t| {
            let (table, eos) = (table.clone().expect("present with the tokenizer"), eos_token_ids.clone());
            let build = move || LlgBackend::new(&table, t.json.as_deref(), &eos).map(|b| Arc::new(b) as Arc<dyn GrammarBackend>);
            Arc::new(GrammarService::new(opts.grammar_compile_threads, build))
        });
        let worker = Worker {
            model,
            kv,
            scheduler: Scheduler::new(BlockPool::new(num_pages, opts.page_size), &opts),
            tokenizer: table,
            grammars: grammars.clone(),
            grammar_queue: Vec::new(),
            jump_forward: !opts.disable_jump_forward,
            inbox: inbox.clone(),
            eos_token_ids,
            context_length,
            stats: stats.clone(),
            active: HashSet::new(),
            seeds: Rng::new(opts.random_seed),
        };
        let thread = std::thread::Builder::new()
            .name("rsgl-engine".into())
            .spawn(move || {
                // The engine thread runs share 0 of every parallel operation.
                if let Some(cpu) = pin_engine_thread {
                    rsgl_kernels::pool::pin_current_thread(cpu);
                }
                worker.run(commands)
            })
            .map_err(|e| invalid(format!("cannot start the engine thread: {e}")))?;
        Ok(Engine {
            inbox,
            thread: Mutex::new(Some(thread)),
            stats,
            vocab_size,
            context_length,
            has_tokenizer,
            max_total_tokens: num_pages * opts.page_size,
            grammars,
        })
    }

    /// Compiles a request's grammar now, on the calling thread, so a bad one is reported before
    /// the request is submitted (the compiled grammar is cached for the request).
    pub fn check_grammar(&self, params: &crate::sample::SamplingParams) -> Result<()> {
        match (params.grammar()?, &self.grammars) {
            (None, _) => Ok(()),
            (Some(spec), Some(grammars)) => grammars.compile(&spec).map(drop),
            (Some(_), None) => Err(crate::grammar::needs_tokenizer()),
        }
    }

    /// Queues a request; errors in the request itself are returned here, at once.
    pub fn submit(&self, req: GenerateRequest) -> Result<RequestStream> {
        self.enqueue(req, None)
    }

    /// [`Self::submit`], calling `waker` after each output the request gets.
    pub fn submit_with_waker(&self, req: GenerateRequest, waker: Waker) -> Result<RequestStream> {
        self.enqueue(req, Some(waker))
    }

    fn enqueue(&self, req: GenerateRequest, waker: Option<Waker>) -> Result<RequestStream> {
        validate(&req, self.vocab_size, self.context_length, self.has_tokenizer)?;
        let need = req.input_ids.len() + req.sampling_params.max_new_tokens.min(self.context_length - req.input_ids.len());
        if need > self.max_total_tokens {
            return Err(invalid(format!(
                "the request needs {need} KV tokens (prompt + max_new_tokens) but the pool holds {}; lower max_new_tokens or raise max_total_tokens / kv_cache_memory_gb",
                self.max_total_tokens
            )));
        }
        let (tx, rx) = channel();
        let rid = req.rid.clone();
        self.inbox.send(Command::Submit(Box::new(req), OutputSink::new(tx, waker))).map_err(|_| EngineError::Closed)?;
        Ok(RequestStream { rid, rx, done: false })
    }

    /// Empties the prefix cache. Returns false (and does nothing) while requests are in flight.
    pub fn flush_cache(&self) -> Result<bool> {
        let (tx, rx) = channel();
        self.inbox.send(Command::FlushCache(tx)).map_err(|_| EngineError::Closed)?;
        rx.recv().map_err(|_| EngineError::Closed)
    }

    /// Ends a request wherever it is (and every sample of it, for n > 1); its stream gets a
    /// final output with an abort reason.
    pub fn abort(&self, rid: &str) {
        let _ = self.inbox.send(Command::Abort(rid.to_string()));
    }

    pub fn stats(&self) -> EngineStats {
        self.stats.lock().expect("stats lock").clone()
    }

    pub fn is_running(&self) -> bool {
        self.thread.lock().expect("thread lock").as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Stops the thread; requests still in flight end with an `Aborted` finish.
    pub fn shutdown(&self) {
        let _ = self.inbox.send(Command::Shutdown);
        let thread = self.thread.lock().expect("thread lock").take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown();
    }
}

struct Worker {
    model: LlamaModel,
    kv: KvCache,
    scheduler: Scheduler,
    tokenizer: Option<Arc<TokenTable>>,
    grammars: Option<Arc<GrammarService>>,
    /// Constrained requests waiting for their grammar to compile.
    grammar_queue: Vec<(GrammarSpec, Sequence)>,
    jump_forward: bool,
    /// For compile threads to hand grammars back.
    inbox: Sender<Command>,
    eos_token_ids: Vec<u32>,
    context_length: usize,
    stats: Arc<Mutex<EngineStats>>,
    active: HashSet<String>,
    /// Draws each request's seed (requests that give none sample from it).
    seeds: Rng,
}

impl Worker {
    fn run(mut self, commands: Receiver<Command>) {
        loop {
            // Block while idle (no spinning); otherwise take whatever has arrived and step.
            let first = if self.scheduler.is_idle() { commands.recv().ok() } else { commands.try_recv().ok() };
            let mut shutdown = first.is_none() && self.scheduler.is_idle();
            for cmd in first.into_iter().chain(std::iter::from_fn(|| commands.try_recv().ok())) {
                match cmd {
                    Command::Submit(req, out) => self.accept(*req, out),
                    Command::GrammarReady(spec, grammar) => self.grammar_ready(&spec, grammar),
                    Command::Abort(rid) => self.abort_group(&rid),
                    Command::FlushCache(reply) => {
                        let flushed = self.scheduler.flush_cache();
                        self.publish(None);
                        let _ = reply.send(flushed);
                    }
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
        if !self.active.insert(req.rid.clone()) {
            let _ = out.send(Err(invalid(format!("request id {:?} is already running; ids must be unique", req.rid))));
            return;
        }
        let mut seq = Sequence::new(req, out, &self.eos_token_ids, self.context_length, self.seeds.next_u64());
        let Some(spec) = seq.grammar_spec.take() else {
            self.scheduler.waiting.push_back(seq);
            return;
        };
        let grammars = self.grammars.as_ref().expect("submit refuses constrained requests without a tokenizer");
        if let Some(grammar) = grammars.cached(&spec) {
            return self.start_constrained(seq, grammar);
        }
        // Park the request; a compile thread sends the grammar back through the inbox. Requests
        // arriving with a grammar already being compiled (n > 1, a batch) wait for that one.
        if !self.grammar_queue.iter().any(|(s, _)| *s == spec) {
            let (inbox, compiled) = (self.inbox.clone(), spec.clone());
            grammars.compile_later(spec.clone(), Box::new(move |grammar| drop(inbox.send(Command::GrammarReady(compiled, grammar)))));
        }
        self.grammar_queue.push((spec, seq));
        self.publish(None);
    }

    /// Starts every request parked waiting for `spec` (none if they were all aborted meanwhile).
    fn grammar_ready(&mut self, spec: &GrammarSpec, grammar: Result<Box<dyn Grammar>>) {
        let (ready, waiting) = std::mem::take(&mut self.grammar_queue).into_iter().partition(|(s, _)| s == spec);
        self.grammar_queue = waiting;
        for (_, seq) in ready {
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
                let jump_forward = self.jump_forward && can_jump && !seq.return_logprob;
                let vocab = self.model.config().vocab_size;
                let mask_on_refusal = seq.params.sampling_commutes_with_masks(vocab);
                seq.constraint = Some(Constraint::new(grammar, vocab, seq.think_end_token_ids.take(), jump_forward, mask_on_refusal));
                self.scheduler.waiting.push_back(seq);
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
        let sched = &self.scheduler;
        let parked = self.grammar_queue.iter().map(|(_, s)| s);
        let rids: Vec<String> = sched.waiting.iter().chain(&sched.running).chain(parked).filter(|s| in_group(s)).map(|s| s.rid.clone()).collect();
        for r in rids {
            self.abort(&r, "aborted by request");
        }
    }

    fn abort(&mut self, rid: &str, why: &str) {
        let mut seq = if let Some(i) = self.scheduler.waiting.iter().position(|s| s.rid == rid) {
            self.scheduler.waiting.remove(i).expect("index exists")
        } else if let Some(i) = self.scheduler.running.iter().position(|s| s.rid == rid) {
            self.scheduler.retire(i)
        } else if let Some(i) = self.grammar_queue.iter().position(|(_, s)| s.rid == rid) {
            self.grammar_queue.swap_remove(i).1
        } else {
            return;
        };
        self.active.remove(rid);
        self.publish(None);
        let out = seq.abort_output(why);
        let _ = seq.out.send(Ok(out));
    }

    fn step(&mut self) {
        let started = Instant::now();
        let plan = self.scheduler.plan();
        if plan.is_empty() {
            return;
        }
        let scheduled = Instant::now();
        let logits = {
            let chunks = self.scheduler.chunks(&plan);
            self.model.forward(&chunks, &mut self.kv)
        };
        let forwarded = Instant::now();
        let vocab = self.model.config().vocab_size;
        let mut rows = logits.chunks_exact(vocab);
        let mut step = StepCounts::default();
        // Requests sampling this step, with their logits row.
        let mut sampling: Vec<(usize, &[f32])> = Vec::new();
        for p in &plan {
            let seq = &mut self.scheduler.running[p.index];
            step.tokens += p.end - p.start;
            if p.start < seq.prompt_len {
                step.prompt_tokens += p.end - p.start;
            } else {
                seq.decode_steps += 1;
            }
            let extending = !seq.is_decoding();
            seq.computed = p.end;
            if extending {
                // Share the pages at once (not only when the request ends): requests waiting
                // on the same prefix are admitted next step and find it here.
                self.scheduler.cache_progress(p.index);
            }
            let seq = &mut self.scheduler.running[p.index];
            // The model returned a row per token of chunks scoring the prompt, else one row for a
            // chunk that completes its sequence.
            let completes = p.end == seq.tokens.len();
            let scores_prompt = seq.wants_chunk_logits(p.start);
            let taken = if scores_prompt { p.end - p.start } else { usize::from(completes) };
            let chunk_rows: Vec<&[f32]> = rows.by_ref().take(taken).collect();
            if scores_prompt {
                seq.record_input_logprobs(p.start, &chunk_rows);
            }
            if completes {
                sampling.push((p.index, chunk_rows.last().expect("a completed chunk has its logits row")));
            }
        }
        let masked = Instant::now();
        self.fill_masks_ahead(&sampling);
        step.grammar = masked.elapsed();
        let mut finished = Vec::new();
        for (index, row) in sampling {
            let seq = &mut self.scheduler.running[index];
            let out = if seq.max_new_tokens == 0 { seq.finish_without_tokens(row) } else { seq.advance(&mut row.to_vec(), self.tokenizer.as_deref()) };
            step.generated += out.token_ids.len();
            step.forced += out.token_ids.len().saturating_sub(1);
            if out.finished.is_some() {
                finished.push((index, Some(out)));
            } else if seq.out.send(Ok(out)).is_err() {
                // The caller went away (dropped its stream): end the request.
                finished.push((index, None));
            }
        }
        // Highest index first: retiring swaps the last request into the freed slot.
        finished.sort_unstable_by(|a, b| b.0.cmp(&a.0));
        let finals: Vec<_> = finished.into_iter().map(|(i, out)| (self.scheduler.retire(i), out)).collect();
        step.schedule = scheduled - started;
        step.forward = forwarded - scheduled;
        step.sample = forwarded.elapsed();
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

    /// Fills the token masks the requests sampling this step need before sampling, on the
    /// compute threads (idle between forward passes, pinned, and parked when done, so nothing
    /// spins into the next forward pass).
    fn fill_masks_ahead(&mut self, sampling: &[(usize, &[f32])]) {
        let mut samples = vec![false; self.scheduler.running.len()];
        sampling.iter().for_each(|&(index, _)| samples[index] = true);
        let mut pending: Vec<&mut Constraint> = (self.scheduler.running.iter_mut().zip(samples))
            .filter(|(seq, samples)| *samples && seq.max_new_tokens > 0)
            .filter_map(|(seq, _)| seq.constraint.as_mut().filter(|c| c.needs_mask_first()))
            .collect();
        self.model.pool().for_chunks_mut(&mut pending, 1, &|_, one| one[0].fill_mask_ahead());
    }

    fn publish(&self, step: Option<&StepCounts>) {
        let mut s = self.stats.lock().expect("stats lock");
        let sched = &self.scheduler;
        s.running_requests = sched.running.len();
        s.waiting_requests = sched.waiting.len();
        s.kv_pages_free = sched.pool.free_pages();
        s.cached_pages = sched.cached_pages();
        s.prompt_tokens = sched.admitted_prompt_tokens;
        s.cache_hit_tokens = sched.cache_hit_tokens;
        s.cache_hit_rate = if s.prompt_tokens > 0 { s.cache_hit_tokens as f64 / s.prompt_tokens as f64 } else { 0.0 };
        s.retracted_requests = sched.retractions;
        s.grammar_waiting_requests = self.grammar_queue.len();
        s.grammar = self.grammars.as_ref().map(|g| g.stats());
        if let Some(step) = step {
            s.steps += 1;
            s.last_step_tokens = step.tokens;
            s.computed_prompt_tokens += step.prompt_tokens as u64;
            s.generated_tokens += step.generated as u64;
            s.schedule_seconds += step.schedule.as_secs_f64();
            s.forward_seconds += step.forward.as_secs_f64();
            s.sample_seconds += step.sample.as_secs_f64();
            s.grammar_seconds += step.grammar.as_secs_f64();
            s.forced_tokens += step.forced as u64;
            s.last_step_seconds = (step.schedule + step.forward + step.sample).as_secs_f64();
        }
    }
}

/// What one step did, for the statistics.
#[derive(Default)]
struct StepCounts {
    tokens: usize,
    prompt_tokens: usize,
    generated: usize,
    forced: usize,
    schedule: Duration,
    forward: Duration,
    sample: Duration,
    grammar: Duration,
}
