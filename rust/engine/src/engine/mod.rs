//! The engine thread and its handle. The thread owns the model, the KV cache and every request;
//! callers talk to it through channels, so no lock is held while the model runs.

mod encoder_cache;
mod engine_loop;
mod stats;

pub use stats::EngineStats;

use crate::config::{EngineOptions, ImageEncoder, ModelConfig};
use crate::error::{invalid, EngineError, Result};
use crate::grammar::{Grammar, GrammarBackend, GrammarService, GrammarSource, LlgBackend};
use crate::kv::disk::{DiskTier, DiskTierOptions};
use crate::kv::{KvCache, PagePool};
use crate::model::{Compute, DecoderModel, LoraAdapter, LoraPacker, ModelOutput, PeftAdapter, Precision};
use crate::request::{validate, validate_embed, EmbedRequest, GenerateRequest, LoraChoice, Output, OutputSink, Waker};
use crate::sample::Rng;
use crate::scheduler::{Scheduler, WindowPool};
use crate::sequence::images;
use crate::speculative::Speculator;
use crate::text::Tokenizer;
use crate::weights::WeightStore;
use engine_loop::EngineLoop;
use rsgl_kernels::pool::split;
use std::collections::{BTreeMap, HashSet};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Tokens of recent outputs suffix drafting keeps (SuffixDecoding's global tree), a few MB.
const SUFFIX_WINDOW_TOKENS: usize = 1 << 18;

enum Command {
    Submit(Box<GenerateRequest>, OutputSink),
    Embed(Box<EmbedRequest>, OutputSink),
    /// A grammar compiled for the requests parked waiting for it.
    GrammarReady(GrammarSource, Result<Box<dyn Grammar>>),
    Abort(String),
    /// Empty the prefix cache; answers whether it could (only when no request is in flight).
    FlushCache(Sender<bool>),
    /// A LoRA adapter (packed on the caller's thread) to add between steps; answers whether it was.
    LoadAdapter(Box<LoraAdapter>, Sender<Result<()>>),
    /// The name of a LoRA adapter to drop between steps; answers whether it was (refused while
    /// requests use it).
    UnloadAdapter(String, Sender<Result<()>>),
    Shutdown,
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
    is_embedding: bool,
    /// The model's image encoder, which the images of a request must fit.
    vision: Option<ImageEncoder>,
    /// The LoRA adapters requests may name: requests read it when submitted, the engine thread
    /// changes it between steps as adapters are loaded and unloaded.
    adapters: Adapters,
    /// Packs the adapters loaded at run time, on the caller's thread.
    lora_packer: LoraPacker,
    max_lora_rank: Option<usize>,
}

/// The loaded LoRA adapters by name, shared by the engine's handle and its thread.
pub(crate) type Adapters = Arc<Mutex<BTreeMap<String, LoraChoice>>>;

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
    pub fn start(cfg: ModelConfig, weights: WeightStore, tokenizer: Option<Arc<Tokenizer>>, eos_token_ids: Vec<u32>, opts: EngineOptions) -> Result<Engine> {
        Self::start_with_adapters(cfg, weights, tokenizer, eos_token_ids, opts, Vec::new())
    }

    /// [`Self::start`], with the LoRA adapters `opts.lora_paths` names, read from their folders.
    pub fn start_with_adapters(
        cfg: ModelConfig,
        weights: WeightStore,
        tokenizer: Option<Arc<Tokenizer>>,
        eos_token_ids: Vec<u32>,
        opts: EngineOptions,
        adapters: Vec<PeftAdapter>,
    ) -> Result<Engine> {
        let mut given: Vec<&str> = adapters.iter().map(|a| a.name.as_str()).collect();
        given.sort_unstable();
        if !given.iter().copied().eq(opts.lora_paths.keys().map(String::as_str)) {
            return Err(invalid(format!(
                "the LoRA adapters given ({given:?}) are not those lora_paths names ({:?})",
                opts.lora_paths.keys().collect::<Vec<_>>()
            )));
        }
        let context_length = opts.context_length(&cfg);
        if context_length == 0 {
            return Err(invalid("context_length must be at least 1"));
        }
        let threads = if opts.threads == 0 { rsgl_kernels::pool::physical_cores() } else { opts.threads };
        // Tensor parallelism: one rank per group of CPUs (a NUMA node each where there are
        // enough), the threads shared out evenly.
        let tp = opts.tp_size.max(1);
        let computes: Vec<Compute> = rsgl_kernels::pool::cpu_groups(tp)
            .iter()
            .enumerate()
            .map(|(rank, cpus)| Compute::on_cpus(split(threads, tp, rank).len().max(1), cpus, opts.pin_threads, opts.activation_bits()))
            .collect();
        let pin_engine_thread = computes[0].home_cpu;
        let vocab_size = cfg.vocab_size;
        let cfg_vision = cfg.vision.clone();
        if let Some(table) = tokenizer.as_deref().map(Tokenizer::table).filter(|t| t.len() != vocab_size) {
            return Err(EngineError::ModelLoad(format!(
                "the tokenizer was read for {} token ids but the model has {vocab_size}: read it with vocab_size={vocab_size}",
                table.len()
            )));
        }
        let precision = Precision { dtype: opts.dtype.weight_dtype(), quantization: opts.quantization, quantize_lm_head: opts.quantize_lm_head };
        let pooling = cfg.pooling.unwrap_or_default();
        let output = if opts.is_embedding { ModelOutput::HiddenStates } else { ModelOutput::Logits };
        if cfg.has_recurrent_layers() {
            // Their states are not in the pages the disk tier and the drafts' rollback work on.
            if opts.hicache_dir.is_some() {
                return Err(invalid(format!("{} models keep recurrent state the disk tier cannot store yet: leave hicache_dir unset", cfg.architecture)));
            }
            if opts.speculative_algorithm.is_some() {
                return Err(invalid(format!(
                    "{} models keep recurrent state that rejected draft tokens cannot be rolled back from yet: leave speculative_algorithm unset",
                    cfg.architecture
                )));
            }
        }
        let fingerprint = opts.hicache_dir.as_ref().map(|_| cache_fingerprint(&cfg, &weights, &opts));
        let mut model = DecoderModel::new(cfg, weights, context_length, precision, output, computes)?;
        for adapter in adapters {
            model.load_adapter(adapter, opts.max_lora_rank)?;
        }
        let adapters: Adapters =
            Arc::new(Mutex::new(model.adapters().iter().map(|(&id, a)| (a.name.clone(), LoraChoice { id, fingerprint: a.fingerprint })).collect()));
        let lora_packer = model.lora_packer().clone();
        let pools = opts.kv_pools(model.config());
        let num_pages = pools.pages;
        let window = opts.paged_window(model.config()).map_or(0, |window| window.size);
        let kv = KvCache::new(model.config(), pools, opts.page_size, opts.kv_cache_dtype, &model.kv_heads_per_rank());
        let mut disk = match (&opts.hicache_dir, fingerprint) {
            (Some(dir), Some(fingerprint)) => {
                let options = DiskTierOptions { dir: dir.into(), capacity_bytes: (opts.hicache_size_gb * (1u64 << 30) as f64) as u64, fingerprint };
                let open = DiskTier::open(&options, opts.page_size, kv.page_bytes());
                Some(open.map_err(|e| invalid(format!("cannot use hicache_dir {dir}: {e}")))?)
            }
            _ => None,
        };
        let stats = Arc::new(Mutex::new(EngineStats {
            kernels: rsgl_kernels::kernels().isa,
            int8_kernels: rsgl_kernels::kernels().gemm_i8.isa,
            threads,
            tp_size: tp,
            dtype: opts.dtype,
            quantization: opts.quantization,
            activation_bits: opts.activation_bits,
            kv_cache_dtype: opts.kv_cache_dtype,
            kv_pages_total: num_pages,
            kv_pages_free: num_pages,
            kv_window_pages_total: pools.window_pages.unwrap_or_default(),
            kv_window_pages_free: pools.window_pages.unwrap_or_default(),
            sliding_window: window,
            state_slots_total: pools.state_slots,
            state_slots_free: pools.state_slots,
            state_slot_bytes: model.config().state_bytes(),
            radix_cache: !opts.disable_radix_cache,
            page_size: opts.page_size,
            max_total_tokens: num_pages * opts.page_size,
            context_length,
            hicache: disk.as_mut().map(DiskTier::stats),
            ..Default::default()
        }));
        let (inbox, commands) = channel();
        let has_tokenizer = tokenizer.is_some();
        let grammars = tokenizer.clone().map(|t| {
            let eos = eos_token_ids.clone();
            let build = move || LlgBackend::new(t, &eos).map(|b| Arc::new(b) as Arc<dyn GrammarBackend>);
            Arc::new(GrammarService::new(opts.grammar_compile_threads, build))
        });
        let engine_loop = EngineLoop {
            model,
            kv,
            scheduler: Scheduler::new(
                PagePool::new(num_pages, opts.page_size),
                pools.window_pages.map(|pages| WindowPool::new(PagePool::new(pages, opts.page_size), window, opts.max_draft_tokens())),
                pools.state_slots,
                &opts,
                disk,
            ),
            tokenizer,
            encoded: Default::default(),
            grammars: grammars.clone(),
            grammar_queue: Vec::new(),
            jump_forward: !opts.disable_jump_forward,
            inbox: inbox.clone(),
            eos_token_ids,
            context_length,
            stats: stats.clone(),
            active: HashSet::new(),
            seeds: Rng::new(opts.random_seed),
            adapters: adapters.clone(),
            speculator: opts
                .speculative_algorithm
                .map(|algorithm| Speculator::new(algorithm, opts.speculative_num_draft_tokens, SUFFIX_WINDOW_TOKENS, opts.speculative_draft_budget)),
            pooling,
        };
        let thread = std::thread::Builder::new()
            .name("rsgl-engine".into())
            .spawn(move || {
                // The engine thread runs share 0 of every parallel operation.
                if let Some(cpu) = pin_engine_thread {
                    rsgl_kernels::pool::pin_current_thread(cpu);
                }
                engine_loop.run(commands)
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
            is_embedding: opts.is_embedding,
            vision: cfg_vision,
            adapters,
            lora_packer,
            max_lora_rank: opts.max_lora_rank,
        })
    }

    /// Compiles a request's grammar now, on the calling thread, so a bad one is reported before
    /// the request is submitted (the compiled grammar is cached for the request).
    pub fn check_grammar(&self, params: &crate::sample::SamplingParams) -> Result<()> {
        match (params.grammar()?, &self.grammars) {
            (None, _) => Ok(()),
            (Some(source), Some(grammars)) => grammars.compile(&source).map(drop),
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

    /// Queues a prompt to embed (on an engine started with `is_embedding`); its one output
    /// carries the embedding.
    pub fn embed(&self, req: EmbedRequest, waker: Option<Waker>) -> Result<RequestStream> {
        if !self.is_embedding {
            return Err(invalid("this engine generates; start it with is_embedding (--is-embedding) to compute embeddings"));
        }
        validate_embed(&req, self.vocab_size, self.context_length)?;
        self.check_fits(req.input_ids.len())?;
        let rid = req.rid.clone();
        self.send_request(rid, waker, |out| Command::Embed(Box::new(req), out))
    }

    fn enqueue(&self, mut req: GenerateRequest, waker: Option<Waker>) -> Result<RequestStream> {
        if self.is_embedding {
            return Err(invalid("this engine serves embeddings (started with is_embedding); it does not generate: start one without it to generate"));
        }
        req.lora = req.lora_path.as_deref().map(|name| self.adapter(name)).transpose()?;
        validate(&req, self.vocab_size, self.context_length, self.has_tokenizer)?;
        images::check(&req.images, &req.input_ids, self.vision.as_ref())?;
        self.check_fits(req.input_ids.len() + req.sampling_params.max_new_tokens.min(self.context_length - req.input_ids.len()))?;
        let rid = req.rid.clone();
        self.send_request(rid, waker, |out| Command::Submit(Box::new(req), out))
    }

    /// The LoRA adapter named `name`.
    fn adapter(&self, name: &str) -> Result<LoraChoice> {
        let adapters = self.adapters.lock().expect("adapters lock");
        adapters.get(name).copied().ok_or_else(|| match adapters.is_empty() {
            true => invalid(format!("lora_path {name:?}: this engine serves no LoRA adapters (start it with lora_paths, or load one with load_lora_adapter)")),
            false => invalid(format!("lora_path {name:?} is not one of this engine's LoRA adapters: {:?}", adapters.keys().collect::<Vec<_>>())),
        })
    }

    /// The names of the LoRA adapters requests may name now.
    pub fn adapter_names(&self) -> Vec<String> {
        self.adapters.lock().expect("adapters lock").keys().cloned().collect()
    }

    /// Loads a LoRA adapter requests may name from then on. It is packed on the calling thread
    /// (refused if it does not fit the model or max_lora_rank), then added between two steps.
    /// A name already loaded is refused: unload it first.
    pub fn load_adapter(&self, adapter: PeftAdapter) -> Result<()> {
        if self.adapters.lock().expect("adapters lock").contains_key(&adapter.name) {
            return Err(already_loaded(&adapter.name));
        }
        let packed = self.lora_packer.pack(adapter, self.max_lora_rank, &rsgl_kernels::ThreadPool::new(1, false))?;
        self.ask(|reply| Command::LoadAdapter(Box::new(packed), reply))?
    }

    /// Unloads the LoRA adapter `name` between two steps; refused while requests (running or
    /// waiting) use it. Its cached KV stays in the prefix cache until evicted, under its
    /// fingerprint, which only the same weights loaded under the same name find again.
    pub fn unload_adapter(&self, name: &str) -> Result<()> {
        self.ask(|reply| Command::UnloadAdapter(name.to_string(), reply))?
    }

    /// Sends the engine thread `command` and waits for its answer.
    fn ask<T>(&self, command: impl FnOnce(Sender<T>) -> Command) -> Result<T> {
        let (tx, rx) = channel();
        self.inbox.send(command(tx)).map_err(|_| EngineError::Closed)?;
        rx.recv().map_err(|_| EngineError::Closed)
    }

    /// Refuses a request needing more KV tokens than the whole pool holds (it could never run).
    fn check_fits(&self, need: usize) -> Result<()> {
        if need > self.max_total_tokens {
            return Err(invalid(format!(
                "the request needs {need} KV tokens (its prompt, plus max_new_tokens when generating) but the pool holds {}; shorten it or raise max_total_tokens / kv_cache_memory_gb",
                self.max_total_tokens
            )));
        }
        Ok(())
    }

    fn send_request(&self, rid: String, waker: Option<Waker>, command: impl FnOnce(OutputSink) -> Command) -> Result<RequestStream> {
        let (tx, rx) = channel();
        self.inbox.send(command(OutputSink::new(tx, waker))).map_err(|_| EngineError::Closed)?;
        Ok(RequestStream { rid, rx, done: false })
    }

    /// Empties the prefix cache. Returns false (and does nothing) while requests are in flight.
    pub fn flush_cache(&self) -> Result<bool> {
        self.ask(Command::FlushCache)
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

/// What the KV of a disk tier depends on: the weights, the model's config and every option
/// that changes the values computed or their layout. Pages of any other fingerprint are never
/// read.
fn cache_fingerprint(cfg: &ModelConfig, weights: &WeightStore, opts: &EngineOptions) -> u64 {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    hasher.update(weights.fingerprint());
    hasher.update(serde_json::to_string(cfg).expect("configs serialize"));
    // The page layout depends on the tensor-parallel split (each rank's heads are stored apart).
    let precision = (opts.dtype, opts.quantization, opts.quantize_lm_head, opts.activation_bits, opts.kv_cache_dtype, opts.page_size, opts.tp_size);
    let kernels = rsgl_kernels::kernels();
    hasher.update(format!("{precision:?} {} {}", kernels.isa, kernels.gemm_i8.isa));
    u64::from_le_bytes(hasher.finalize()[..8].try_into().expect("8 bytes"))
}

/// The error for loading a LoRA adapter under a name already loaded.
pub(crate) fn already_loaded(name: &str) -> EngineError {
    invalid(format!("LoRA adapter {name:?} is already loaded; unload it first to load other weights under its name"))
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown();
    }
}
