//! A request inside the engine: its tokens and budget, and handles to where its KV lives
//! ([`SeqKv`]), how it picks tokens ([`Picker`]), its grammar, its text ([`OutputText`]) and
//! what else it reports ([`Report`]).

pub(crate) mod images;
mod kv;
mod picker;
mod report;
mod speculation;
mod text;

use crate::config::ImageEncoder;
use crate::grammar::{Constraint, GrammarSource};
use crate::kv::disk::PageHash;
use crate::model::{ImageRun, MropePositions};
use crate::pooling::{Pooler, Pooling};
use crate::request::{EmbedRequest, FinishReason, Finished, GenerateRequest, Output, OutputSink, StopMatch};
use crate::sample::{log_softmax, SamplingParams};
use crate::text::TokenTable;
pub(crate) use images::PromptImage;
pub(crate) use kv::SeqKv;
use picker::Picker;
use report::Report;
pub(crate) use speculation::Speculation;
use std::borrow::Cow;
use std::time::{Duration, Instant};
use text::OutputText;

/// A grammar a request waits for: compiled before the request runs.
#[derive(Clone)]
pub(crate) struct PendingGrammar {
    pub source: GrammarSource,
    /// The tokens ending the model's reasoning (`</think>`), after which the grammar applies.
    pub think_end_token_ids: Option<Vec<u32>>,
}

pub(crate) struct Sequence {
    pub rid: String,
    pub group: Option<String>,
    pub out: OutputSink,
    /// Prompt then generated tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// Output budget after clamping to the context.
    pub max_new_tokens: usize,
    /// Forward passes over output tokens so far.
    pub decode_steps: usize,
    pub kv: SeqKv,
    pub picker: Picker,
    /// The grammar to compile before the request can run (taken when it is queued for compiling).
    pub pending_grammar: Option<PendingGrammar>,
    /// The compiled grammar's state, once it is ready.
    pub constraint: Option<Constraint>,
    pub report: Report,
    /// An embedding request's pooled hidden states so far; it ends when its prompt is computed.
    pub pooler: Option<Pooler>,
    /// With speculative decoding on, the request's drafting and verification state.
    pub speculation: Option<Speculation>,
    /// When the engine received it, and how long it then waited for its first admission.
    pub arrived: Instant,
    pub queued: Option<Duration>,
    /// The prompt's images (a vision-language model's), placed on its image tokens.
    pub images: Vec<PromptImage>,
    /// Runs of prompt positions whose queries see the whole run (a Gemma 3 prompt's image
    /// tokens), in order: a prompt chunk never splits one ([`Self::prompt_chunk_end`]).
    pub bidirectional: Vec<std::ops::Range<usize>>,
    /// The 3D rope positions of a prompt with images, for a model that gives them (Qwen2.5-VL).
    pub mrope: Option<MropePositions>,
    /// The LoRA adapter its tokens run through (an id of the model's adapters).
    pub lora: Option<usize>,
    text: OutputText,
}

impl Sequence {
    pub fn new(req: GenerateRequest, out: OutputSink, eos: &[u32], context_length: usize, seed: u64) -> Self {
        let prompt_len = req.input_ids.len();
        let report = Report::new(&req);
        let p = req.sampling_params;
        Sequence {
            pending_grammar: p.grammar().unwrap_or_default().map(|source| PendingGrammar { source, think_end_token_ids: req.think_end_token_ids }),
            constraint: None,
            decode_steps: 0,
            rid: req.rid,
            group: req.group,
            max_new_tokens: p.max_new_tokens.min(context_length - prompt_len),
            kv: SeqKv::new(req.cache_salt.as_deref(), req.lora.map(|lora| lora.fingerprint)),
            text: OutputText::new(p.stop.clone(), p.no_stop_trim),
            picker: Picker::new(p, &req.input_ids, eos, seed),
            report,
            pooler: None,
            speculation: None,
            arrived: Instant::now(),
            queued: None,
            out,
            tokens: req.input_ids,
            prompt_len,
            images: req.images.into_iter().map(PromptImage::new).collect(),
            bidirectional: Vec::new(),
            mrope: None,
            lora: req.lora.map(|lora| lora.id),
        }
    }

    /// Places the prompt's images on its image tokens (`vision`: the model's image encoder),
    /// and gives the prompt the runs its image tokens attend both ways (Gemma 3) or its 3D rope
    /// positions (Qwen2.5-VL) where the model takes them.
    pub fn place_images(&mut self, vision: Option<&ImageEncoder>) -> crate::error::Result<()> {
        images::place(&mut self.images, &self.tokens[..self.prompt_len], vision)?;
        match vision.filter(|_| !self.images.is_empty()) {
            Some(ImageEncoder::Siglip(siglip)) if siglip.bidirectional_image_tokens => self.bidirectional = images::runs(&self.images),
            Some(ImageEncoder::Qwen2_5Vl(qwen)) => {
                let merge = qwen.spatial_merge_size;
                let runs: Vec<ImageRun> = self
                    .images
                    .iter()
                    .map(|image| {
                        let [frames, rows, columns] = image.input.grid_thw.expect("placed Qwen2.5-VL images have grids");
                        let first = image.positions[0];
                        ImageRun { tokens: first..image.positions[image.positions.len() - 1] + 1, grid: [frames, rows / merge, columns / merge] }
                    })
                    .collect();
                self.mrope = Some(MropePositions::new(self.prompt_len, &runs)?);
            }
            _ => {}
        }
        Ok(())
    }

    /// Where a prompt chunk from `start` that would end at `end` ends so that it splits no run
    /// attended both ways: before a run it would cut, or, starting in one, after it (past `end`
    /// when the run is longer: its queries see all of it).
    pub fn prompt_chunk_end(&self, start: usize, end: usize) -> usize {
        match self.bidirectional.iter().find(|run| run.start < end && end < run.end) {
            Some(run) if run.start > start => run.start,
            Some(run) => run.end,
            None => end,
        }
    }

    /// Where a prompt chunk from `start` that can go no further than `end` ends so that it splits
    /// no run attended both ways: before the run it would cut (at `start`, computing nothing, if
    /// it starts in that run).
    pub fn prompt_chunk_end_within(&self, start: usize, end: usize) -> usize {
        self.bidirectional.iter().find(|run| run.start < end && end < run.end).map_or(end, |run| run.start.max(start))
    }

    /// The runs attended both ways that meet positions `range`.
    pub fn bidirectional_in(&self, range: std::ops::Range<usize>) -> Vec<std::ops::Range<usize>> {
        self.bidirectional.iter().filter(|run| run.start < range.end && range.start < run.end).cloned().collect()
    }

    /// The images' rows (those encoded) at positions `range`, as a forward pass takes them.
    pub fn image_rows(&self, range: std::ops::Range<usize>) -> Vec<(usize, &[f32])> {
        images::rows_in(&self.images, range)
    }

    /// An embedding request: its prompt prefilled for the hidden states `pooling` asks for.
    pub fn embedding(req: EmbedRequest, out: OutputSink, pooling: Pooling, hidden_size: usize) -> Self {
        let prompt_len = req.input_ids.len();
        let sampling_params = SamplingParams { max_new_tokens: 0, ..SamplingParams::default() };
        let generate = GenerateRequest { rid: req.rid, input_ids: req.input_ids, sampling_params, ..GenerateRequest::default() };
        let mut seq = Sequence::new(generate, out, &[], prompt_len, 0);
        seq.pooler = Some(Pooler::new(pooling, hidden_size, prompt_len));
        seq
    }

    /// Whether the prefix cache takes part: not for embeddings, whose pooling may need every
    /// position's hidden state (and whose prompts are rarely shared).
    pub fn caches_prefix(&self) -> bool {
        self.pooler.is_none()
    }

    /// The first `len` tokens as the prefix cache keys them (an image's positions by the image,
    /// see [`images::cache_key`]).
    pub fn cache_key(&self, len: usize) -> Cow<'_, [u32]> {
        images::cache_key(&self.images, &self.tokens[..len])
    }

    /// The key of the tokens whose KV may come from the cache: all but the last, which must be
    /// computed for its logits, and none whose logits give a wanted prompt log-probability.
    pub fn prefill_key(&self) -> Cow<'_, [u32]> {
        match self.caches_prefix() {
            true => self.cache_key(self.report.cacheable_len(self.tokens.len()) - 1),
            false => Cow::Borrowed(&[]),
        }
    }

    /// [`Self::cache_key`] beside the request's KV, to use both at once (a text request's key
    /// is its tokens, borrowed: nothing is copied).
    pub fn cache_key_and_kv(&mut self, len: usize) -> (Cow<'_, [u32]>, &mut SeqKv) {
        (images::cache_key(&self.images, &self.tokens[..len]), &mut self.kv)
    }

    /// The names of the whole pages of [`Self::prefill_key`], each page hashed once.
    pub fn prefill_page_hashes(&mut self, page_size: usize) -> &[PageHash] {
        let len = self.prefill_key().len();
        let (key, kv) = self.cache_key_and_kv(len);
        kv.page_hashes.of(kv.namespace, &key, page_size)
    }

    /// Whether a chunk of this request from `start` needs the logits of every one of its tokens.
    pub fn wants_chunk_logits(&self, start: usize) -> bool {
        self.report.wants_chunk_logits(start, self.prompt_len)
    }

    /// Records the prompt log-probabilities the logits rows of positions `start..` give.
    pub fn record_input_logprobs(&mut self, start: usize, rows: &[&[f32]]) {
        self.report.record_input_logprobs(&self.tokens, self.prompt_len, start, rows);
    }

    /// Decoding: only the last sampled token (and this step's draft) lacks KV.
    pub fn is_decoding(&self) -> bool {
        self.kv.computed + 1 + self.draft_len() == self.tokens.len() && self.kv.computed >= self.prompt_len
    }

    pub fn output_len(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    fn finished(&self, reason: FinishReason) -> Finished {
        Finished {
            finish_reason: reason,
            prompt_tokens: self.prompt_len,
            completion_tokens: self.output_len(),
            cached_tokens: self.kv.cached_tokens,
            decode_steps: self.decode_steps,
            spec_verify_ct: self.speculation.as_ref().map_or(0, |s| s.verify_ct),
            spec_draft_tokens: self.speculation.as_ref().map_or(0, |s| s.draft_tokens),
            spec_accepted_tokens: self.speculation.as_ref().map_or(0, |s| s.accepted_tokens),
            queue_time: self.queued.unwrap_or_else(|| self.arrived.elapsed()).as_secs_f64(),
        }
    }

    /// Output for a request that ends without sampling (max_new_tokens = 0).
    pub fn finish_without_tokens(&mut self, logits: &[f32]) -> Output {
        Output {
            token_ids: Vec::new(),
            text: String::new(),
            logprobs: Vec::new(),
            prompt_logits: self.report.prompt_logits(logits),
            input_token_logprobs: self.report.take_input_logprobs(),
            embedding: None,
            finished: Some(self.finished(FinishReason::Length { length: 0 })),
        }
    }

    /// The final output of an embedding request whose prompt is computed.
    pub fn finish_embedding(&mut self) -> Output {
        let pooler = self.pooler.as_mut().expect("an embedding request");
        Output {
            token_ids: Vec::new(),
            text: String::new(),
            logprobs: Vec::new(),
            prompt_logits: None,
            input_token_logprobs: None,
            embedding: Some(pooler.finish()),
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
            embedding: None,
            finished: Some(self.finished(FinishReason::Abort { message: message.to_string() })),
        }
    }

    /// Samples the next token from `logits` (within the grammar's mask, if constrained),
    /// appends it and any tokens the grammar then forces, and says what to send back.
    pub fn advance(&mut self, logits: &mut [f32], table: Option<&TokenTable>) -> Output {
        let first = self.output_len() == 0;
        let prompt_logits = if first { self.report.prompt_logits(logits) } else { None };
        let input_token_logprobs = if first { self.report.take_input_logprobs() } else { None };
        let raw_logprobs = self.report.return_logprob.then(|| log_softmax(logits));
        let hold_back_stops = self.output_len() < self.picker.params.min_new_tokens;
        let token = match self.picker.pick(logits, self.constraint.as_mut(), hold_back_stops) {
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
            self.text.flush();
        }
        Output {
            token_ids,
            text: self.text.take_ready(reason.is_some()),
            logprobs: self.report.token_logprobs(raw_logprobs.as_deref(), token),
            prompt_logits,
            input_token_logprobs,
            embedding: None,
            finished: reason.map(|r| self.finished(r)),
        }
    }

    /// Appends one output token; returns why the request ends with it, if it does.
    fn append(&mut self, token: u32, table: Option<&TokenTable>) -> Option<FinishReason> {
        self.tokens.push(token);
        let mut reason = self.picker.record(token).then_some(FinishReason::Stop { matched: StopMatch::Token(token) });
        if let Some(table) = table {
            if let Some(hit) = self.text.push(table, token, self.picker.params.skip_special_tokens) {
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

#[cfg(test)]
mod tests;
