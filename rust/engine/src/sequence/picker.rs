//! How a request picks its next token: its sampling parameters, the history penalties read,
//! its own random stream, and the tokens that end it.

use crate::error::Result;
use crate::grammar::Constraint;
use crate::sample::{sample, History, Rng, SamplingParams};

pub(crate) struct Picker {
    pub params: SamplingParams,
    history: History,
    rng: Rng,
    /// Tokens that end the request (EOS unless ignored, plus stop_token_ids).
    stop_ids: Vec<u32>,
}

impl Picker {
    pub fn new(params: SamplingParams, prompt: &[u32], eos: &[u32], seed: u64) -> Self {
        let mut stop_ids = params.stop_token_ids.clone();
        if !params.ignore_eos {
            stop_ids.extend_from_slice(eos);
        }
        Picker { rng: Rng::new(params.seed.unwrap_or(seed)), history: History::new(prompt), stop_ids, params }
    }

    /// Samples from `logits`: among the tokens the grammar allows while it is active, else
    /// freely, with the stop tokens banned while `hold_back_stops` (min_new_tokens not reached;
    /// a grammar decides itself where the output may end).
    pub fn pick(&mut self, logits: &mut [f32], constraint: Option<&mut Constraint>, hold_back_stops: bool) -> Result<u32> {
        let (params, history, rng) = (&self.params, &self.history, &mut self.rng);
        match constraint {
            Some(c) if c.is_active() => c.pick(logits, |l| sample(l, params, history, &[], rng)),
            _ => Ok(sample(logits, params, history, if hold_back_stops { &self.stop_ids } else { &[] }, rng)),
        }
    }

    /// Notes an output token (for repetition penalties); returns whether it ends the request.
    pub fn record(&mut self, token: u32) -> bool {
        self.history.push_output(token);
        self.stop_ids.contains(&token)
    }
}
