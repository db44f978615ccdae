//! A generation request, its life inside the engine, and the outputs it streams back.

use crate::error::{invalid, EngineError, Result};
use crate::grammar::{Constraint, GrammarSpec};
use crate::kv::NodeId;
use crate::sample::{log_softmax, sample, top_n, History, Rng, SamplingParams, TokenLogprob};
use crate::text::{Detokenizer, StopText, TokenTable};
use serde::{Deserialize, Deserializer, Serialize};
use std::sync::mpsc::Sender;
use std::sync::Arc;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerateRequest {
    pub rid: String,
    pub input_ids: Vec<u32>,
    #[serde(default)]
    pub sampling_params: SamplingParams,
    #[serde(default)]
    pub return_logprob: bool,
    #[serde(default)]
    pub top_logprobs_num: usize,
    /// Return the full logits after the last prompt token (for parity checks and scoring).
    #[serde(default)]
    pub return_prompt_logits: bool,
    /// Return the log-probability of every prompt token from this position on (SGLang's
    /// `logprob_start_len`; position 0 has none): those positions are computed, not cached.
    #[serde(default)]
    pub logprob_start_len: Option<usize>,
    /// Requests with different salts never share cached KV (per-tenant isolation).
    #[serde(default)]
    pub cache_salt: Option<String>,
    /// The id of the request this one is a sample of (n > 1): aborting that id aborts them all.
    #[serde(default)]
    pub group: Option<String>,
    /// With a grammar: the tokens ending the model's reasoning (`</think>`). The output is free
    /// until it contains them, and follows the grammar after.
    #[serde(default)]
    pub think_end_token_ids: Option<Vec<u32>>,
}

impl GenerateRequest {
    pub fn from_json(json: &str) -> Result<Self> {
        Self::deserialize_from(&mut serde_json::Deserializer::from_str(json))
    }

    /// From any serde source: JSON text, or the Python objects the binding passes.
    pub fn deserialize_from<'de, D: Deserializer<'de>>(de: D) -> Result<Self> {
        deserialize_with_path(de).map_err(invalid)
    }
}

/// Deserializes a `T`, an error naming the offending field's path, e.g.
/// "sampling_params.max_new_tokens: invalid value".
pub fn deserialize_with_path<'de, T: Deserialize<'de>, D: Deserializer<'de>>(de: D) -> std::result::Result<T, String> {
    serde_path_to_error::deserialize(de).map_err(|e| format!("{}: {}", e.path(), e.inner()))
}

/// One step's worth of a request's output; the last one carries `finished`.
#[derive(Debug, Clone, Serialize)]
pub struct Output {
    pub token_ids: Vec<u32>,
    pub text: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub logprobs: Vec<TokenLogprob>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logits: Option<Vec<f32>>,
    /// With `logprob_start_len`, in the first output: log P(prompt[i] | prompt[..i]) for each
    /// position `i` from `max(logprob_start_len, 1)` to the prompt's end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_token_logprobs: Option<Vec<f32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished: Option<Finished>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Finished {
    pub finish_reason: FinishReason,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
    /// Forward passes that ran this request's output tokens: one per token when decoding one
    /// at a time, fewer when jump-forward appends forced text in one pass.
    pub decode_steps: usize,
}

/// Why a request ended, in SGLang's `meta_info.finish_reason` shape.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum FinishReason {
    Stop { matched: StopMatch },
    Length { length: usize },
    Abort { message: String },
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(untagged)]
pub enum StopMatch {
    Token(u32),
    Text(String),
    /// The grammar was complete (shown as `null`, as SGLang does for a stop without a match).
    Grammar,
}

/// Called on the engine thread after each output a request gets: lets an event loop wait for
/// outputs without a thread per request. It must return at once (no locks held for long, no I/O
/// that blocks).
pub type Waker = Arc<dyn Fn() + Send + Sync>;

/// Where a request's outputs go: its stream's channel, and whom to wake when one is there.
pub(crate) struct OutputSink {
    tx: Sender<Result<Output>>,
    waker: Option<Waker>,
}

impl OutputSink {
    pub fn new(tx: Sender<Result<Output>>, waker: Option<Waker>) -> Self {
        OutputSink { tx, waker }
    }

    /// Hands an output over; `Err` when the stream was dropped (its caller went away).
    pub fn send(&self, out: Result<Output>) -> std::result::Result<(), ()> {
        self.tx.send(out).map_err(drop)?;
        if let Some(wake) = &self.waker {
            wake();
        }
        Ok(())
    }
}

/// A request the engine has accepted.
pub(crate) struct Sequence {
    pub rid: String,
    pub group: Option<String>,
    pub params: SamplingParams,
    pub return_logprob: bool,
    pub top_logprobs_num: usize,
    pub return_prompt_logits: bool,
    /// First prompt position whose log-probability is wanted, if any (at least 1).
    pub input_logprobs_from: Option<usize>,
    /// Those log-probabilities so far, in position order.
    input_logprobs: Vec<f32>,
    pub out: OutputSink,
    /// Prompt then generated tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// Tokens whose K/V are in the cache.
    pub computed: usize,
    /// Block table: token `i` lives in page `pages[i / page_size]`.
    pub pages: Vec<u32>,
    /// Leading pages owned by the radix cache (shared), not by this request.
    pub shared_pages: usize,
    /// The radix node this request holds locked (the end of its shared prefix).
    pub cache_node: Option<NodeId>,
    /// Radix namespace (from the cache salt).
    pub namespace: u64,
    /// Prompt tokens found in the cache at first admission.
    pub cached_tokens: usize,
    admitted: bool,
    /// Output budget after clamping to the context.
    pub max_new_tokens: usize,
    /// Tokens that end the request (EOS unless ignored, plus stop_token_ids).
    stop_ids: Vec<u32>,
    /// The grammar to compile before the request can run.
    pub grammar_spec: Option<GrammarSpec>,
    pub think_end_token_ids: Option<Vec<u32>>,
    /// The compiled grammar's state, once it is ready.
    pub constraint: Option<Constraint>,
    /// Forward passes over output tokens so far.
    pub decode_steps: usize,
    history: History,
    rng: Rng,
    detok: Detokenizer,
    text: StopText,
}

impl Sequence {
    pub fn new(req: GenerateRequest, out: OutputSink, eos: &[u32], context_length: usize, seed: u64) -> Self {
        let p = req.sampling_params;
        let prompt_len = req.input_ids.len();
        let mut stop_ids = p.stop_token_ids.clone();
        if !p.ignore_eos {
            stop_ids.extend_from_slice(eos);
        }
        Sequence {
            grammar_spec: p.grammar().unwrap_or_default(),
            think_end_token_ids: req.think_end_token_ids,
            constraint: None,
            decode_steps: 0,
            rid: req.rid,
            group: req.group,
            max_new_tokens: p.max_new_tokens.min(context_length - prompt_len),
            history: History::new(&req.input_ids),
            rng: Rng::new(p.seed.unwrap_or(seed)),
            text: StopText::new(p.stop.clone(), p.no_stop_trim),
            detok: Detokenizer::default(),
            stop_ids,
            params: p,
            return_logprob: req.return_logprob,
            top_logprobs_num: req.top_logprobs_num,
            return_prompt_logits: req.return_prompt_logits,
            input_logprobs_from: req.logprob_start_len.map(|s| s.clamp(1, prompt_len)),
            input_logprobs: Vec::new(),
            out,
            tokens: req.input_ids,
            prompt_len,
            computed: 0,
            pages: Vec::new(),
            shared_pages: 0,
            cache_node: None,
            namespace: req.cache_salt.as_deref().map_or(0, namespace_of),
            cached_tokens: 0,
            admitted: false,
        }
    }

    /// Tokens whose KV may come from the cache: all but the last, which must be computed for
    /// its logits, and none whose logits give a wanted prompt log-probability.
    pub fn prefill_key(&self) -> &[u32] {
        let end = self.input_logprobs_from.map_or(self.tokens.len(), |from| from.min(self.tokens.len()));
        &self.tokens[..end - 1]
    }

    /// Whether a chunk of this request from `start` needs the logits of every one of its tokens.
    pub fn wants_chunk_logits(&self, start: usize) -> bool {
        self.input_logprobs_from.is_some() && start + 1 < self.prompt_len
    }

    /// Records the prompt log-probabilities the logits rows of positions `start..` give;
    /// positions already recorded (computed again after a retraction) are skipped.
    pub fn record_input_logprobs(&mut self, start: usize, rows: &[&[f32]]) {
        let Some(from) = self.input_logprobs_from else { return };
        for (row, pos) in rows.iter().zip(start..) {
            let next = pos + 1;
            if next >= from && next < self.prompt_len && next - from == self.input_logprobs.len() {
                self.input_logprobs.push(log_softmax(row)[self.tokens[next] as usize]);
            }
        }
    }

    /// The recorded prompt log-probabilities, handed over once (in the first output).
    fn take_input_logprobs(&mut self) -> Option<Vec<f32>> {
        self.input_logprobs_from.map(|_| std::mem::take(&mut self.input_logprobs))
    }

    /// Decoding: only the last sampled token lacks KV.
    pub fn is_decoding(&self) -> bool {
        self.computed + 1 == self.tokens.len() && self.computed >= self.prompt_len
    }

    /// Takes a place in the running batch with `shared` cached pages (locked at `node`) covering
    /// `matched` tokens and `own` fresh pages for the rest. Returns whether this is the first
    /// admission (a retracted request comes back with its output so far).
    pub fn admit(&mut self, shared: Vec<u32>, own: Vec<u32>, node: Option<NodeId>, matched: usize) -> bool {
        self.shared_pages = shared.len();
        self.pages = shared;
        self.pages.extend(own);
        self.cache_node = node;
        self.computed = matched;
        let first = !self.admitted;
        if first {
            self.cached_tokens = matched;
            self.admitted = true;
        }
        first
    }

    /// Forgets where the KV lives (after its pages were handed back).
    pub fn reset_kv(&mut self) {
        self.pages.clear();
        self.shared_pages = 0;
        self.cache_node = None;
        self.computed = 0;
    }

    pub fn output_len(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    fn finished(&self, reason: FinishReason) -> Finished {
        Finished {
            finish_reason: reason,
            prompt_tokens: self.prompt_len,
            completion_tokens: self.output_len(),
            cached_tokens: self.cached_tokens,
            decode_steps: self.decode_steps,
        }
    }

    /// Output for a request that ends without sampling (max_new_tokens = 0).
    pub fn finish_without_tokens(&mut self, logits: &[f32]) -> Output {
        Output {
            token_ids: Vec::new(),
            text: String::new(),
            logprobs: Vec::new(),
            prompt_logits: self.return_prompt_logits.then(|| logits.to_vec()),
            input_token_logprobs: self.take_input_logprobs(),
            finished: Some(self.finished(FinishReason::Length { length: 0 })),
        }
    }

    pub fn abort_output(&mut self, message: &str) -> Output {
        Output {
            token_ids: Vec::new(),
            text: self.text.take_ready(true),
            logprobs: Vec::new(),
            prompt_logits: None,
            input_token_logprobs: None,
            finished: Some(self.finished(FinishReason::Abort { message: message.to_string() })),
        }
    }

    /// Samples the next token from `logits` (within the grammar's mask, if constrained),
    /// appends it and any tokens the grammar then forces, and says what to send back.
    pub fn advance(&mut self, logits: &mut [f32], table: Option<&TokenTable>) -> Output {
        let first = self.output_len() == 0;
        let prompt_logits = (first && self.return_prompt_logits).then(|| logits.to_vec());
        let input_token_logprobs = if first { self.take_input_logprobs() } else { None };
        let raw_logprobs = self.return_logprob.then(|| log_softmax(logits));
        let holds_back_stops = self.output_len() < self.params.min_new_tokens;
        let (params, history, rng) = (&self.params, &self.history, &mut self.rng);
        let picked = match self.constraint.as_mut() {
            // The grammar decides where the output may end: min_new_tokens holds nothing back.
            Some(c) if c.is_active() => c.pick(logits, |l| sample(l, params, history, &[], rng)),
            _ => Ok(sample(logits, params, history, if holds_back_stops { &self.stop_ids } else { &[] }, rng)),
        };
        let token = match picked {
            Ok(token) => token,
            Err(e) => return self.abort_output(&e.to_string()),
        };
        let mut token_ids = vec![token];
        let mut reason = self.append(token, table);
        if reason.is_none() {
            let room = self.max_new_tokens - self.output_len();
            let forced = self.constraint.as_mut().map(|c| c.forced_tokens(room)).unwrap_or_default();
            for t in forced {
                token_ids.push(t);
                reason = self.append(t, table);
                if reason.is_some() {
                    break;
                }
            }
        }
        if reason.is_some() && !matches!(reason, Some(FinishReason::Stop { matched: StopMatch::Text(_) })) {
            let rest = self.detok.flush();
            self.text.push(&rest);
        }
        let logprobs = raw_logprobs
            .map(|lp| vec![TokenLogprob { token_id: token, logprob: lp[token as usize], top: top_n(&lp, self.top_logprobs_num) }])
            .unwrap_or_default();
        Output {
            token_ids,
            text: self.text.take_ready(reason.is_some()),
            logprobs,
            prompt_logits,
            input_token_logprobs,
            finished: reason.map(|r| self.finished(r)),
        }
    }

    /// Appends one output token; returns why the request ends with it, if it does.
    fn append(&mut self, token: u32, table: Option<&TokenTable>) -> Option<FinishReason> {
        self.history.push_output(token);
        self.tokens.push(token);
        let mut reason = None;
        if self.stop_ids.contains(&token) {
            reason = Some(FinishReason::Stop { matched: StopMatch::Token(token) });
        }
        if let Some(table) = table {
            let piece = self.detok.push(table.bytes(token, self.params.skip_special_tokens));
            if let Some(hit) = self.text.push(&piece) {
                reason = reason.or(Some(FinishReason::Stop { matched: StopMatch::Text(hit) }));
            }
        }
        if let (None, Some(c)) = (&reason, self.constraint.as_mut()) {
            let output = &self.tokens[self.prompt_len..];
            if let Err(e) = c.follow(output) {
                reason = Some(FinishReason::Abort { message: e.to_string() });
            } else if c.is_finished() {
                reason = Some(FinishReason::Stop { matched: StopMatch::Grammar });
            }
        }
        if reason.is_none() && self.output_len() >= self.max_new_tokens {
            reason = Some(FinishReason::Length { length: self.output_len() });
        }
        reason
    }
}

/// Checks a request against the model and the engine before it is queued.
pub(crate) fn validate(req: &GenerateRequest, vocab_size: usize, context_length: usize, has_tokenizer: bool) -> Result<()> {
    let n = req.input_ids.len();
    if n == 0 {
        return Err(invalid("the prompt is empty; give at least one token"));
    }
    if let Some(bad) = req.input_ids.iter().find(|&&t| t as usize >= vocab_size) {
        return Err(invalid(format!("input_ids: token {bad} is outside the vocabulary (size {vocab_size})")));
    }
    if n >= context_length {
        return Err(invalid(format!("the prompt has {n} tokens but the context length is {context_length}; shorten the prompt or raise context_length")));
    }
    if !has_tokenizer && !req.sampling_params.stop.is_empty() {
        return Err(invalid("stop strings need a tokenizer; this engine was started without one (use stop_token_ids)"));
    }
    if !has_tokenizer && matches!(req.sampling_params.grammar(), Ok(Some(_))) {
        return Err(crate::grammar::needs_tokenizer());
    }
    if req.top_logprobs_num > vocab_size {
        return Err(invalid(format!("top_logprobs_num must be at most the vocabulary size ({vocab_size})")));
    }
    req.sampling_params.validate(vocab_size).map_err(|e| match e {
        EngineError::InvalidRequest(m) => invalid(format!("sampling_params: {m}")),
        other => other,
    })
}

/// A stable 64-bit namespace for a cache salt (FNV-1a; 0 is left to requests without a salt).
fn namespace_of(salt: &str) -> u64 {
    let hash = salt.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3));
    hash.max(1)
}
