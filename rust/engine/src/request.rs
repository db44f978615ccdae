//! A generation request as submitted, and the outputs it streams back (inside the engine it
//! lives as a `Sequence`).

use crate::error::{invalid, EngineError, Result};
use crate::sample::{SamplingParams, TokenLogprob};
use serde::{Deserialize, Deserializer, Serialize};
use std::sync::mpsc::Sender;
use std::sync::Arc;

#[derive(Debug, Clone, Default, Deserialize)]
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
    /// The prompt's images, in the order of their image tokens (a vision-language model's).
    #[serde(default)]
    pub images: Vec<ImageInput>,
    /// The name of the LoRA adapter (one of the engine's `lora_paths`, or one loaded since) to
    /// generate with; the base model without.
    #[serde(default)]
    pub lora_path: Option<String>,
    /// The adapter `lora_path` names, as the engine found it when the request was submitted.
    #[serde(skip)]
    pub(crate) lora: Option<LoraChoice>,
}

/// A request's LoRA adapter: its id among the model's adapters (never reused, so it names the
/// same weights while the request runs), and its fingerprint (which the prefix cache's namespace
/// folds in).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LoraChoice {
    pub id: usize,
    pub fingerprint: u64,
}

/// An image of a prompt, preprocessed for the model's vision tower.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageInput {
    /// Names the picture: the prefix cache and the image encoder's cache key by it (the Python
    /// side sends a SHA-256 of its pixels).
    pub hash: String,
    /// Its pixel values, float32 little-endian: SigLIP towers' tiles, `[tiles, 3, image_size,
    /// image_size]`; Qwen2.5-VL's patches, `[patches, 3 * temporal_patch_size * patch_size^2]`.
    #[serde(with = "serde_bytes")]
    pub pixel_values: Vec<u8>,
    /// Qwen2.5-VL's patch grid: (frames, rows, columns) of patches.
    #[serde(default)]
    pub grid_thw: Option<[usize; 3]>,
}

/// A prompt to embed, on an engine started with `is_embedding`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbedRequest {
    pub rid: String,
    pub input_ids: Vec<u32>,
}

impl EmbedRequest {
    /// From any serde source: JSON text, or the Python objects the binding passes.
    pub fn deserialize_from<'de, D: Deserializer<'de>>(de: D) -> Result<Self> {
        deserialize_with_path(de).map_err(invalid)
    }
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
    /// position `i` from `max(logprob_start_len, 1)` to the prompt's end, with the top
    /// alternatives at each (`top_logprobs_num` of them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_token_logprobs: Option<Vec<TokenLogprob>>,
    /// An embedding request's pooled, L2-normalized vector (in its final output).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub embedding: Option<Vec<f32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished: Option<Finished>,
}

impl Output {
    /// Adds what `next` (the output of the same step's following token) brings.
    pub fn append(&mut self, next: Output) {
        self.token_ids.extend(next.token_ids);
        self.text.push_str(&next.text);
        self.logprobs.extend(next.logprobs);
        self.finished = next.finished;
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Finished {
    pub finish_reason: FinishReason,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
    /// Forward passes that ran this request's output tokens: one per token when decoding one
    /// at a time, fewer when jump-forward appends forced text or speculation accepts drafts.
    pub decode_steps: usize,
    /// With speculation: decode passes that verified a draft, the draft tokens, and how many
    /// of them the model's own choice confirmed.
    pub spec_verify_ct: usize,
    pub spec_draft_tokens: usize,
    pub spec_accepted_tokens: usize,
    /// Seconds from the engine's receipt of the request to its first admission (SGLang's
    /// `queue_time`; until its end if it never ran).
    pub queue_time: f64,
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

/// Checks a request against the model and the engine before it is queued.
pub(crate) fn validate(req: &GenerateRequest, vocab_size: usize, context_length: usize, has_tokenizer: bool) -> Result<()> {
    let n = req.input_ids.len();
    validate_prompt(&req.input_ids, vocab_size)?;
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

/// Checks a prompt to embed: it may fill the whole context, as nothing follows it.
pub(crate) fn validate_embed(req: &EmbedRequest, vocab_size: usize, context_length: usize) -> Result<()> {
    let n = req.input_ids.len();
    validate_prompt(&req.input_ids, vocab_size)?;
    if n > context_length {
        return Err(invalid(format!("the input has {n} tokens but the context length is {context_length}; shorten the input or raise context_length")));
    }
    Ok(())
}

fn validate_prompt(input_ids: &[u32], vocab_size: usize) -> Result<()> {
    if input_ids.is_empty() {
        return Err(invalid("the prompt is empty; give at least one token"));
    }
    match input_ids.iter().find(|&&t| t as usize >= vocab_size) {
        Some(bad) => Err(invalid(format!("input_ids: token {bad} is outside the vocabulary (size {vocab_size})"))),
        None => Ok(()),
    }
}
