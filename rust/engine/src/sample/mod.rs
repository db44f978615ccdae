//! Turning logits into the next token: penalties, temperature, top-k / top-p / min-p, seeded
//! sampling, and log-probabilities of the raw distribution.

mod logprobs;
mod params;
mod rng;
mod sampler;

pub use logprobs::{log_softmax, top_n, TokenLogprob, TopLogprob};
pub use params::SamplingParams;
pub use rng::Rng;
pub use sampler::{sample, History};

#[cfg(test)]
mod tests;
