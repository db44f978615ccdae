//! The engine thread and its handle. The thread owns the model, the KV cache and every request;
//! callers talk to it through channels, so no lock is held while the model runs.

use crate::config::{Dtype, EngineOptions, ModelConfig, Quantization};
use crate::error::{invalid, EngineError, Result};
use crate::kv::{BlockPool, KvCache};
use crate::model::{Compute, LlamaModel, Precision};
use rsgl_kernels::ThreadPool;
use crate::request::{validate, GenerateRequest, Output, Sequence};
use crate::scheduler::Scheduler;
use crate::text::TokenTable;
use crate::weights::WeightStore;
use serde::Serialize;
use std::collections::HashSet;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub type Tokenizer = TokenTable;

enum Command {
    Submit(Box<GenerateRequest>, Sender<Result<Output>>),
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
    pub steps: u64,
    pub last_step_tokens: usize,
    /// Seconds spent, over all steps, choosing the batch, in the forward pass, and sampling
    /// (with detokenizing and handing outputs over).
    pub schedule_seconds: f64,
    pub forward_seconds: f64,
    pub sample_seconds: f64,
    pub last_step_seconds: f64,
}

pub struct Engine {
    inbox: Sender<Command>,
    thread: Option<JoinHandle<()>>,
    stats: Arc<Mutex<EngineStats>>,
    vocab_size: usize,
    context_length: usize,
    has_tokenizer: bool,
    max_total_tokens: usize,
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
        match self.rx.recv_timeout(timeout) {
            Ok(Ok(out)) => {
                self.done = out.finished.is_some();
                Ok(Some(out))
            }
            Ok(Err(e)) => {
                self.done = true;
                Err(e)
            }
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => {
                self.done = true;
                Err(EngineError::Closed)
            }
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
        let compute = Compute::new(ThreadPool::new(threads, opts.pin_threads));
        let vocab_size = cfg.vocab_size;
        let precision = Precision { dtype: opts.dtype.weight_dtype(), quantization: opts.quantization, quantize_lm_head: opts.quantize_lm_head };
        let model = LlamaModel::new(cfg, weights, context_length, precision, compute)?;
        let pin_engine_thread = opts.pin_threads.then(|| rsgl_kernels::pool::allowed_cpus().first().copied()).flatten();
        let num_pages = opts.kv_pages(model.config());
        let kv = KvCache::new(model.config(), num_pages, opts.page_size);
        let stats = Arc::new(Mutex::new(EngineStats {
            kernels: rsgl_kernels::kernels().isa,
            int8_kernels: rsgl_kernels::kernels().gemm_i8.isa,
            threads,
            dtype: opts.dtype,
            quantization: opts.quantization,
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
        let worker = Worker {
            model,
            kv,
            scheduler: Scheduler::new(BlockPool::new(num_pages, opts.page_size), &opts),
            tokenizer,
            eos_token_ids,
            context_length,
            stats: stats.clone(),
            active: HashSet::new(),
            next_seed: opts.random_seed,
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
        Ok(Engine { inbox, thread: Some(thread), stats, vocab_size, context_length, has_tokenizer, max_total_tokens: num_pages * opts.page_size })
    }

    /// Queues a request; errors in the request itself are returned here, at once.
    pub fn submit(&self, req: GenerateRequest) -> Result<RequestStream> {
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
        self.inbox.send(Command::Submit(Box::new(req), tx)).map_err(|_| EngineError::Closed)?;
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
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Stops the thread; requests still in flight end with an `Aborted` finish.
    pub fn shutdown(&mut self) {
        let _ = self.inbox.send(Command::Shutdown);
        if let Some(t) = self.thread.take() {
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
    tokenizer: Option<Tokenizer>,
    eos_token_ids: Vec<u32>,
    context_length: usize,
    stats: Arc<Mutex<EngineStats>>,
    active: HashSet<String>,
    next_seed: u64,
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

    fn accept(&mut self, req: GenerateRequest, out: Sender<Result<Output>>) {
        if !self.active.insert(req.rid.clone()) {
            let _ = out.send(Err(invalid(format!("request id {:?} is already running; ids must be unique", req.rid))));
            return;
        }
        self.next_seed = self.next_seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let seq = Sequence::new(req, out, &self.eos_token_ids, self.context_length, self.next_seed);
        self.scheduler.waiting.push_back(seq);
    }

    /// Aborts `rid` and the samples grouped under it.
    fn abort_group(&mut self, rid: &str) {
        let in_group = |s: &Sequence| s.rid == rid || s.group.as_deref() == Some(rid);
        let sched = &self.scheduler;
        let rids: Vec<String> = sched.waiting.iter().chain(&sched.running).filter(|s| in_group(s)).map(|s| s.rid.clone()).collect();
        for r in rids {
            self.abort(&r, "aborted by request");
        }
    }

    fn abort(&mut self, rid: &str, why: &str) {
        let mut seq = if let Some(i) = self.scheduler.waiting.iter().position(|s| s.rid == rid) {
            self.scheduler.waiting.remove(i).expect("index exists")
        } else if let Some(i) = self.scheduler.running.iter().position(|s| s.rid == rid) {
            self.scheduler.retire(i)
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
        let mut finished = Vec::new();
        let mut step = StepCounts::default();
        for p in &plan {
            let seq = &mut self.scheduler.running[p.index];
            step.tokens += p.end - p.start;
            let prefilling = !seq.is_decoding();
            seq.computed = p.end;
            if prefilling {
                step.prompt_tokens += p.end - p.start;
                // Share the prompt's pages at once (not only when the request ends): requests
                // waiting on the same prefix are admitted next step and find it here.
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
            if !completes {
                continue;
            }
            let mut row = chunk_rows.last().expect("a completed chunk has its logits row").to_vec();
            let out = if seq.max_new_tokens == 0 {
                seq.finish_without_tokens(&row)
            } else {
                seq.advance(&mut row, self.tokenizer.as_ref())
            };
            step.generated += out.token_ids.len();
            if out.finished.is_some() {
                finished.push((p.index, Some(out)));
            } else if seq.out.send(Ok(out)).is_err() {
                // The caller went away (dropped its stream): end the request.
                finished.push((p.index, None));
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
        if let Some(step) = step {
            s.steps += 1;
            s.last_step_tokens = step.tokens;
            s.computed_prompt_tokens += step.prompt_tokens as u64;
            s.generated_tokens += step.generated as u64;
            s.schedule_seconds += step.schedule.as_secs_f64();
            s.forward_seconds += step.forward.as_secs_f64();
            s.sample_seconds += step.sample.as_secs_f64();
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
    schedule: Duration,
    forward: Duration,
    sample: Duration,
}
