//! What the engine publishes about itself after every step.

use crate::config::{Dtype, KvCacheDtype, Quantization};
use crate::grammar::GrammarStats;
use crate::kv::disk::DiskTierStats;
use serde::Serialize;
use std::time::Duration;

/// Counters the engine publishes after every step.
#[derive(Debug, Clone, Default, Serialize)]
pub struct EngineStats {
    pub kernels: &'static str,
    /// The int8 GEMM's path (what W8A8 layers run on).
    pub int8_kernels: &'static str,
    pub threads: usize,
    /// Tensor-parallel ranks the threads are split among.
    pub tp_size: usize,
    /// Weight precision.
    pub dtype: Dtype,
    /// Weight quantization of the linear layers, if any.
    pub quantization: Option<Quantization>,
    /// Bits of the quantized block layers' activations (8 or 16).
    pub activation_bits: u8,
    pub running_requests: usize,
    pub waiting_requests: usize,
    pub kv_cache_dtype: KvCacheDtype,
    pub kv_pages_total: usize,
    pub kv_pages_free: usize,
    pub page_size: usize,
    pub max_total_tokens: usize,
    pub context_length: usize,
    pub radix_cache: bool,
    pub cached_pages: usize,
    /// Where the sliding layers keep only their window's KV: their window pages (of
    /// `page_size` tokens, for those layers only), free ones, and ones the prefix cache keeps
    /// that no request reads (evictable); all 0 for other models. `kv_pages_*` are then the
    /// global layers' pages.
    pub kv_window_pages_total: usize,
    pub kv_window_pages_free: usize,
    pub window_cached_pages: usize,
    /// Positions a sliding layer's query sees, where they keep only those (else 0).
    pub sliding_window: usize,
    /// For a model with recurrent layers: the state slots (one per running request, the rest
    /// for the prefix cache's snapshots), those neither holds, the snapshots, and a slot's
    /// bytes; all 0 for other models.
    pub state_slots_total: usize,
    pub state_slots_free: usize,
    pub state_snapshots: usize,
    pub state_slot_bytes: usize,
    /// Prompt tokens of admitted requests, and how many of them came from the cache.
    pub prompt_tokens: u64,
    pub cache_hit_tokens: u64,
    pub cache_hit_rate: f64,
    /// The disk tier (`hicache_dir`), when on; its `hit_tokens` are the part of
    /// `cache_hit_tokens` read back from disk.
    pub hicache: Option<DiskTierStats>,
    /// Prompt tokens actually run through the model (misses, and recomputation after retraction).
    pub computed_prompt_tokens: u64,
    pub generated_tokens: u64,
    pub retracted_requests: u64,
    /// Constrained requests waiting for their grammar to compile.
    pub grammar_waiting_requests: usize,
    /// Tokens appended without sampling because the grammar forced them (jump-forward).
    pub forced_tokens: u64,
    /// Speculative decoding: decode passes that verified a draft, draft tokens, and draft tokens
    /// the model confirmed (accepted per verify = accepted / verify steps).
    pub spec_verify_steps: u64,
    pub spec_draft_tokens: u64,
    pub spec_accepted_tokens: u64,
    /// The fitted cost of a decode step that budgets draft tokens: seconds per step, per row and
    /// per key its requests attend to (0 until enough steps of different sizes ran).
    pub spec_step_fixed_seconds: f64,
    pub spec_step_row_seconds: f64,
    pub spec_step_key_seconds: f64,
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

/// What one step did, for the statistics.
#[derive(Default)]
pub(super) struct StepCounts {
    pub(super) tokens: usize,
    pub(super) prompt_tokens: usize,
    pub(super) generated: usize,
    pub(super) forced: usize,
    pub(super) verified: usize,
    pub(super) drafted: usize,
    pub(super) accepted: usize,
    /// Keys the batch's last tokens attend to, summed over its requests.
    pub(super) keys: usize,
    pub(super) schedule: Duration,
    pub(super) forward: Duration,
    pub(super) sample: Duration,
    pub(super) grammar: Duration,
}

impl EngineStats {
    /// Adds one step's counts and times.
    pub(super) fn record_step(&mut self, step: &StepCounts) {
        self.steps += 1;
        self.last_step_tokens = step.tokens;
        self.computed_prompt_tokens += step.prompt_tokens as u64;
        self.generated_tokens += step.generated as u64;
        self.schedule_seconds += step.schedule.as_secs_f64();
        self.forward_seconds += step.forward.as_secs_f64();
        self.sample_seconds += step.sample.as_secs_f64();
        self.grammar_seconds += step.grammar.as_secs_f64();
        self.forced_tokens += step.forced as u64;
        self.spec_verify_steps += step.verified as u64;
        self.spec_draft_tokens += step.drafted as u64;
        self.spec_accepted_tokens += step.accepted as u64;
        self.last_step_seconds = (step.schedule + step.forward + step.sample).as_secs_f64();
    }
}
